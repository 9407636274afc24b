// Examples: BOS / EOS, prompt masking and truncation, on toy text and on real records.
#include <gtest/gtest.h>

#include "data/examples.h"
#include "data/records.h"
#include "test_support.h"

namespace fsdpq::data {
namespace {
using Ids = std::vector<int32_t>;
constexpr int32_t M = kIgnoreIndex;

TEST(DataExamples, MasksThePromptAndAppendsEos) {
  ByteTokenizer tok;
  Example e = make_example({"ab", "abc"}, tok, 512);
  EXPECT_EQ(e.input_ids, (Ids{1, 'a' + 3, 'b' + 3, 'c' + 3, 2}));
  EXPECT_EQ(e.labels, (Ids{M, M, M, 'c' + 3, 2}));
  EXPECT_EQ(e.full_length, 5);
  EXPECT_TRUE(e.full_length_exact);
  EXPECT_FALSE(e.truncated);
}

TEST(DataExamples, TruncatesToContextLength) {
  ByteTokenizer tok;
  Example e = make_example({"ab", "abcdef"}, tok, 4);
  EXPECT_EQ(e.input_ids, (Ids{1, 'a' + 3, 'b' + 3, 'c' + 3}));
  EXPECT_EQ(e.labels, (Ids{M, M, M, 'c' + 3}));
  // Only the 3 bytes that fit after BOS were encoded: the length is a lower bound.
  EXPECT_EQ(e.full_length, 5);
  EXPECT_FALSE(e.full_length_exact);
  EXPECT_TRUE(e.truncated);
  // A prompt longer than the context masks everything, as in fsdp_qlora.
  Example all_prompt = make_example({"abcdef", "abcdefg"}, tok, 3);
  EXPECT_EQ(all_prompt.labels, (Ids{M, M, M}));
}

TEST(DataExamples, MaskingOnRealSqlRecords) {
  FSDPQ_SHARED_DATA_OR_SKIP(model, "tokenizer.model");
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  auto tok = load_tokenizer(model.string());
  auto records = read_records(sql, required_fields(PromptStyle::Qna), false, nullptr, 200);
  for (const Record& r : records) {
    auto text = format_record(r, PromptStyle::Qna);
    Example e = make_example(text, *tok, 512);
    const size_t masked = 1 + tok->encode(text.prompt).size();
    ASSERT_EQ(e.input_ids.size(), e.labels.size());
    for (size_t i = 0; i < e.labels.size(); ++i)
      ASSERT_EQ(e.labels[i], i < masked ? M : e.input_ids[i])
          << "line " << r.line << " position " << i;
    EXPECT_EQ(e.input_ids.front(), 1);
    EXPECT_EQ(e.input_ids.back(), 2);
    // What the loss trains on is exactly the answer (plus EOS) for these records.
    Ids target(e.labels.begin() + static_cast<std::ptrdiff_t>(masked), e.labels.end() - 1);
    EXPECT_EQ(tok->decode(target), r.fields.at("answer")) << "line " << r.line;
  }
  // First record, counted with fsdp_qlora's own code (tests/reference/instruction_dataset.py).
  Example first = make_example(format_record(records[0], PromptStyle::Qna), *tok, 512);
  EXPECT_EQ(first.input_ids.size(), 52u);
  EXPECT_EQ(std::count(first.labels.begin(), first.labels.end(), M), 40);
}

TEST(DataExamples, MaskingOnRealAlpacaRecords) {
  FSDPQ_SHARED_DATA_OR_SKIP(model, "tokenizer.model");
  FSDPQ_SHARED_DATA_OR_SKIP(alpaca, "alpaca.jsonl");
  auto tok = load_tokenizer(model.string());
  auto records = read_records(alpaca, required_fields(PromptStyle::Alpaca), false, nullptr, 100);
  size_t with_input = 0;
  for (const Record& r : records) {
    auto text = format_record(r, PromptStyle::Alpaca);
    with_input += text.prompt.find("### Input:\n") != std::string::npos;
    Example e = make_example(text, *tok, 4096);
    const size_t masked = 1 + tok->encode(text.prompt).size();
    for (size_t i = 0; i < e.labels.size(); ++i)
      ASSERT_EQ(e.labels[i], i < masked ? M : e.input_ids[i]) << "line " << r.line;
    EXPECT_EQ(e.input_ids, [&] {
      Ids ids{1};
      for (int32_t id : tok->encode(text.example)) ids.push_back(id);
      ids.push_back(2);
      return ids;
    }());
  }
  EXPECT_GT(with_input, 0u);
  EXPECT_LT(with_input, records.size());
  Example first = make_example(format_record(records[0], PromptStyle::Alpaca), *tok, 512);
  EXPECT_EQ(first.input_ids.size(), 241u);
  EXPECT_EQ(std::count(first.labels.begin(), first.labels.end(), M), 45);
  Ids target(first.labels.begin() + 45, first.labels.end() - 1);
  EXPECT_EQ(tok->decode(target), records[0].fields.at("output"));
}

}  // namespace
}  // namespace fsdpq::data
