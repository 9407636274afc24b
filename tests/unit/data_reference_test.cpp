// fsdpq's examples against a transcription of fsdp_qlora's InstructionDataset + collate_fn
// (tests/reference/instruction_dataset.py) on the first 200 real records.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "data/examples.h"
#include "data/records.h"
#include "test_support.h"

namespace fsdpq::data {
namespace {
namespace fs = std::filesystem;

// Debian's python3-sentencepiece lives under /usr/bin/python3 (python3 on PATH may be another).
std::string python_with_sentencepiece() {
  for (const char* python : {"/usr/bin/python3", "python3"})
    if (test::run_command(std::string(python) + " -c 'import sentencepiece'").exit_code == 0)
      return python;
  return "";
}

void compare_with_reference(const fs::path& model, const fs::path& data, PromptStyle style,
                            const std::string& python) {
  constexpr int kRecords = 200, kContext = 512;
  const std::string script =
      std::string(FSDPQ_SOURCE_DIR) + "/tests/reference/instruction_dataset.py";
  auto result =
      test::run_command(fmt::format("{} '{}' '{}' '{}' {} {} {}", python, script, model.string(),
                                    data.string(), to_string(style), kRecords, kContext));
  ASSERT_EQ(result.exit_code, 0) << result.output;

  auto tok = load_tokenizer(model.string());
  auto records = read_records(data, required_fields(style), false, nullptr, kRecords);
  ASSERT_EQ(records.size(), static_cast<size_t>(kRecords));
  std::istringstream lines(result.output);
  std::string line;
  size_t index = 0, truncated = 0;
  while (std::getline(lines, line)) {
    ASSERT_LT(index, records.size()) << "more reference lines than records";
    auto expected = nlohmann::json::parse(line);
    Example e = make_example(format_record(records[index], style), *tok, kContext);
    truncated += e.truncated;
    ASSERT_EQ(e.input_ids, expected["input_ids"].get<std::vector<int32_t>>()) << "record " << index;
    ASSERT_EQ(e.labels, expected["labels"].get<std::vector<int32_t>>()) << "record " << index;
    ++index;
  }
  EXPECT_EQ(index, records.size());
  if (style == PromptStyle::Alpaca)
    EXPECT_GT(truncated, 0u) << "expected some alpaca records past 512 tokens";
}

TEST(DataReference, SqlMatchesFsdpQlora) {
  FSDPQ_SHARED_DATA_OR_SKIP(model, "tokenizer.model");
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  std::string python = python_with_sentencepiece();
  if (python.empty())
    GTEST_SKIP() << "the Python sentencepiece module is missing (Debian: apt-get install "
                    "python3-sentencepiece): skipping";
  compare_with_reference(model, sql, PromptStyle::Qna, python);
}

TEST(DataReference, AlpacaMatchesFsdpQlora) {
  FSDPQ_SHARED_DATA_OR_SKIP(model, "tokenizer.model");
  FSDPQ_SHARED_DATA_OR_SKIP(alpaca, "alpaca.jsonl");
  std::string python = python_with_sentencepiece();
  if (python.empty())
    GTEST_SKIP() << "the Python sentencepiece module is missing (Debian: apt-get install "
                    "python3-sentencepiece): skipping";
  compare_with_reference(model, alpaca, PromptStyle::Alpaca, python);
}

}  // namespace
}  // namespace fsdpq::data
