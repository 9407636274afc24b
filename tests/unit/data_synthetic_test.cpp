// Made-up datasets: fsdp_qlora's dummy and the learnable synthetic set for the demo.
#include <gtest/gtest.h>

#include <set>

#include "data/prompts.h"
#include "data/records.h"
#include "data/synthetic.h"
#include "test_support.h"

namespace fsdpq::data {
namespace {

TEST(DataSynthetic, DummyMatchesFsdpQlora) {
  auto records = make_dummy_records(3, 4);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2].fields.at("instruction"), "instruction");
  EXPECT_EQ(records[2].fields.at("input"), "input");
  EXPECT_EQ(records[2].fields.at("output"), "outputoutputoutputoutputoutputoutputoutputoutput");
}

TEST(DataSynthetic, DeterministicPerSeed) {
  auto a = make_synthetic_records(300, 7);
  auto b = make_synthetic_records(300, 7);
  auto c = make_synthetic_records(300, 8);
  ASSERT_EQ(a.size(), 300u);
  size_t differ = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].fields, b[i].fields);
    differ += a[i].fields != c[i].fields;
  }
  EXPECT_GT(differ, 100u);
  // A prefix does not depend on how many records are made.
  auto shorter = make_synthetic_records(50, 7);
  for (size_t i = 0; i < shorter.size(); ++i) EXPECT_EQ(shorter[i].fields, a[i].fields);
}

TEST(DataSynthetic, RecordsAreWellFormedAndVaried) {
  auto records = make_synthetic_records(600, 1);
  std::set<std::string> instructions_kinds;
  size_t no_input = 0;
  for (const Record& r : records) {
    ASSERT_EQ(r.fields.size(), 3u);
    EXPECT_FALSE(r.fields.at("instruction").empty());
    EXPECT_FALSE(r.fields.at("output").empty());
    no_input += r.fields.at("input").empty();
    instructions_kinds.insert(r.fields.at("instruction").substr(0, 12));
  }
  EXPECT_GE(instructions_kinds.size(), 6u);  // every family shows up
  EXPECT_GT(no_input, 0u);                   // the no-input alpaca template is exercised
  EXPECT_LT(no_input, records.size());
  // The answers are right: check the adding family.
  for (const Record& r : records) {
    if (r.fields.at("instruction") != "Add the two numbers.") continue;
    int a = 0, b = 0;
    ASSERT_EQ(std::sscanf(r.fields.at("input").c_str(), "%d + %d", &a, &b), 2);
    EXPECT_EQ(r.fields.at("output"), std::to_string(a + b));
  }
}

TEST(DataSynthetic, WriteJsonlRoundTrips) {
  auto dir = test::make_temp_dir("data-synth");
  auto records = make_synthetic_records(40, 2);
  records[0].fields["output"] = "quotes \" and\nnewlines and caf\xc3\xa9";
  write_jsonl(dir / "s.jsonl", records);
  EXPECT_FALSE(std::filesystem::exists(dir / "s.jsonl.tmp"));
  auto back = read_records(dir / "s.jsonl", required_fields(PromptStyle::Alpaca), false, nullptr);
  ASSERT_EQ(back.size(), records.size());
  for (size_t i = 0; i < back.size(); ++i) {
    EXPECT_EQ(back[i].fields, records[i].fields);
    EXPECT_EQ(back[i].line, i + 1);
  }
}

}  // namespace
}  // namespace fsdpq::data
