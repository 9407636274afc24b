// fsdpq's examples against a transcription of fsdp_qlora's InstructionDataset + collate_fn
// (tests/reference/instruction_dataset.py) on the first 200 real records.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "data/examples.h"
#include "data/records.h"
#include "test_support.h"
#include "token_digest.h"

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

// The same with the real Llama-3 tokenizer.json, as fsdp_qlora runs it through AutoTokenizer
// (<|begin_of_text|> from the post-processor, EOS and pad <|end_of_text|>). Its reference needs
// Hugging Face's `tokenizers`, which CI lacks: the script's digests of the first 200 records of
// each file (context 256, so that some are truncated) are committed (tests/data/llama3_instruction_digests.txt; its header says how).
TEST(DataReference, Llama3SqlAndAlpacaMatchFsdpQlora) {
  FSDPQ_SHARED_DATA_OR_SKIP(tokenizer_json, "llama3/tokenizer.json");
  FSDPQ_SHARED_DATA_OR_SKIP(shared, "sql.jsonl");
  const auto tokenizer = load_tokenizer(tokenizer_json.string());
  std::istringstream lines(test::read_file(fs::path(FSDPQ_SOURCE_DIR) / "tests/data/llama3_instruction_digests.txt"));
  std::string line, file;
  PromptStyle style = PromptStyle::Qna;
  std::vector<Record> records;
  size_t index = 0, compared = 0, truncated = 0;
  int64_t context = 0;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    if (line.starts_with("# ")) {  // "# sql.jsonl qna 200 512": a file's records follow
      std::string hash, style_name;
      int count = 0;
      fields >> hash >> file >> style_name >> count >> context;
      style = style_name == "qna" ? PromptStyle::Qna : PromptStyle::Alpaca;
      records = read_records(shared.parent_path() / file, required_fields(style), false, nullptr, count);
      index = 0;
      continue;
    }
    ASSERT_LT(index, records.size()) << file;
    size_t length = 0;
    uint64_t ids_digest = 0, labels_digest = 0;
    fields >> length >> std::hex >> ids_digest >> labels_digest;
    const Example e = make_example(format_record(records[index], style), *tokenizer, context);
    truncated += e.truncated;
    EXPECT_EQ(e.input_ids.size(), length) << file << " record " << index;
    EXPECT_EQ(test::digest_of_ids({e.input_ids}).fnv, ids_digest) << file << " record " << index << ": input_ids";
    EXPECT_EQ(test::digest_of_ids({e.labels}).fnv, labels_digest) << file << " record " << index << ": labels";
    ++index;
    ++compared;
  }
  EXPECT_EQ(compared, 400u);
  EXPECT_GT(truncated, 0u) << "expected some records past the context length";
}

}  // namespace
}  // namespace fsdpq::data
