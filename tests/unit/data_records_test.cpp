// Reading records: the bad-input catalogue (each message exact), skip_bad, JSON arrays, real data.
#include <gtest/gtest.h>

#include "data/records.h"
#include "test_support.h"
#include "util/error.h"

namespace fsdpq::data {
namespace {
namespace fs = std::filesystem;

using test::error_of;

const std::vector<std::string> kAlpacaFields = {"instruction", "output"};

class DataRecords : public testing::Test {
 protected:
  // Writes `content` to a fresh file and returns the error read_records gives for it.
  std::string error_for(const std::string& content,
                        const std::vector<std::string>& required = kAlpacaFields) {
    path_ = dir_ / ("case" + std::to_string(++count_) + ".jsonl");
    test::write_file(path_, content);
    return with_file(error_of([&] { read_records(path_, required, false, nullptr); }));
  }
  // Messages with this test's file path replaced by "FILE", so expectations read plainly.
  std::string with_file(std::string message) const {
    const std::string path = path_.string();
    for (size_t at; (at = message.find(path)) != std::string::npos;)
      message.replace(at, path.size(), "FILE");
    return message;
  }
  std::vector<Record> read(const std::string& content, bool skip_bad = false,
                           ReadStats* stats = nullptr, size_t limit = SIZE_MAX) {
    path_ = dir_ / ("case" + std::to_string(++count_) + ".jsonl");
    test::write_file(path_, content);
    return read_records(path_, kAlpacaFields, skip_bad, stats, limit);
  }

  fs::path dir_ = test::make_temp_dir("data-records");
  fs::path path_;
  int count_ = 0;
};

const std::string kGood = R"({"instruction": "Say hi", "input": "", "output": "hi"})";

TEST_F(DataRecords, ReadsJsonLinesSkippingBlankLines) {
  auto records =
      read(kGood + "\n\n   \r\n" + R"({"instruction": "b", "output": "c", "extra": "x"})" + "\r\n");
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0].line, 1u);
  EXPECT_EQ(records[0].fields.at("instruction"), "Say hi");
  EXPECT_EQ(records[0].fields.at("input"), "");
  EXPECT_EQ(records[1].line, 4u);
  EXPECT_EQ(records[1].fields.at("extra"), "x");
  EXPECT_EQ(records[1].fields.count("input"), 0u);
}

TEST_F(DataRecords, BrokenJsonLine) {
  EXPECT_EQ(error_for(kGood + "\n" + R"({"instruction": "a", "output": )" + "\n"),
            "FILE:2: broken JSON at column 32: syntax error while parsing value - unexpected end "
            "of input; expected '[', '{', or a literal");
}

TEST_F(DataRecords, RecordNotAnObject) {
  EXPECT_EQ(error_for(kGood + "\n[\"a\", \"b\"]\n"),
            "FILE:2: expected a JSON object of string fields, found an array");
  EXPECT_EQ(error_for("\"just a string\"\n"),
            "FILE:1: expected a JSON object of string fields, found a string");
}

TEST_F(DataRecords, MissingRequiredField) {
  EXPECT_EQ(error_for(kGood + "\n" + kGood + "\n" + R"({"instruction": "a", "input": "b"})"),
            "FILE:3: missing field 'output'; each record needs the fields instruction, output");
}

TEST_F(DataRecords, FieldNotAString) {
  EXPECT_EQ(
      error_for(R"({"instruction": "a", "output": 42})"),
      "FILE:1: field 'output' is a number; expected a string (every field must be a JSON string)");
  EXPECT_EQ(
      error_for(R"({"instruction": "a", "output": "b", "input": null})"),
      "FILE:1: field 'input' is a null; expected a string (every field must be a JSON string)");
  EXPECT_EQ(error_for(R"({"instruction": ["a"], "output": "b"})"),
            "FILE:1: field 'instruction' is an array; expected a string (every field must be a "
            "JSON string)");
}

TEST_F(DataRecords, InvalidUtf8) {
  EXPECT_EQ(error_for(kGood + "\n" + "{\"instruction\": \"caf\xe9\", \"output\": \"x\"}\n"),
            "FILE:2: not valid UTF-8; expected UTF-8 text (convert the file, e.g. with iconv)");
}

TEST_F(DataRecords, EmptyFileAndNoRecords) {
  EXPECT_EQ(error_for(""),
            "FILE: the file is empty; expected JSON Lines (one JSON object per line) "
            "or a JSON array of objects");
  EXPECT_EQ(error_for(" \n\n\t\n"),
            "FILE: the file is empty; expected JSON Lines (one JSON object "
            "per line) or a JSON array of objects");
  EXPECT_EQ(error_for("[ ]"),
            "FILE: the file has no records; expected JSON Lines (one JSON object "
            "per line) or a JSON array of objects");
}

TEST_F(DataRecords, MissingFileAndFolder) {
  fs::path missing = dir_ / "absent.jsonl";
  EXPECT_EQ(error_of([&] { read_records(missing, kAlpacaFields, false, nullptr); }),
            missing.string() +
                ": no such file; expected JSON Lines (one JSON object per line) or a "
                "JSON array of objects");
  EXPECT_EQ(error_of([&] { read_records(dir_, kAlpacaFields, false, nullptr); }),
            dir_.string() +
                ": is a folder, not a file; expected JSON Lines (one JSON object per "
                "line) or a JSON array of objects");
}

TEST_F(DataRecords, JsonArrayReportsTheLineOfEachElement) {
  const std::string array =
      "[\n  " + kGood +
      ",\n  {\n    \"instruction\": \"two\",\n"
      "    \"output\": \"lines, with [brackets] and \\\"quotes\\\" }\"\n  },\n"
      "  " +
      kGood + "\n]\n";
  auto records = read(array);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[0].line, 2u);
  EXPECT_EQ(records[1].line, 3u);
  EXPECT_EQ(records[1].fields.at("output"), "lines, with [brackets] and \"quotes\" }");
  EXPECT_EQ(records[2].line, 7u);

  EXPECT_EQ(error_for("[\n  " + kGood + ",\n\n  42,\n  " + kGood + "\n]"),
            "FILE:4: expected a JSON object of string fields, found a number");
  EXPECT_EQ(error_for("[\n  {\"instruction\": \"a\",\n   \"output\": tru}\n]"),
            "FILE:3: broken JSON at column 17: syntax error while parsing value - invalid literal; "
            "last read: '\"output\": tru}'");
  EXPECT_EQ(error_for("[\n  " + kGood + ",\n]"),
            "FILE:3: empty element in the JSON array (a doubled or trailing comma?)");
  EXPECT_EQ(error_for("[\n  " + kGood + ",\n  {\"instruction\": \"a\n"),
            "FILE:3: this element of the JSON array never ends (an unclosed string, object or "
            "array, or a missing ']' at the end of the file?)");
  EXPECT_EQ(error_for("[" + kGood + "]\n{}\n"),
            "FILE:2: unexpected text after the end of the JSON array; expected one array per file");
}

TEST_F(DataRecords, SkipBadRecordsCountsThem) {
  const std::string content = kGood + "\n" + "{broken\n" + kGood + "\n" +
                              R"({"instruction": "x"})" + "\n" + "[1]\n" + kGood + "\n";
  ReadStats stats;
  auto records = read(content, true, &stats);
  ASSERT_EQ(records.size(), 3u);
  EXPECT_EQ(records[2].line, 6u);
  EXPECT_EQ(stats.read, 3u);
  EXPECT_EQ(stats.skipped, 3u);
  ASSERT_EQ(stats.first_skip_reasons.size(), 3u);
  EXPECT_EQ(with_file(stats.first_skip_reasons[1]),
            "FILE:4: missing field 'output'; each record needs the fields instruction, output");
  EXPECT_EQ(with_file(stats.first_skip_reasons[2]),
            "FILE:5: expected a JSON object of string fields, found an array");

  // Only the first few reasons are kept; all are counted.
  std::string many;
  for (int i = 0; i < 9; ++i) many += "{}\n";
  ReadStats lots;
  read(many + kGood + "\n", true, &lots);
  EXPECT_EQ(lots.skipped, 9u);
  EXPECT_EQ(lots.first_skip_reasons.size(), kMaxSkipReasons);

  // A skipped array element does not stop the array.
  ReadStats in_array;
  auto from_array = read("[" + kGood + ", 7, " + kGood + "]", true, &in_array);
  EXPECT_EQ(from_array.size(), 2u);
  EXPECT_EQ(in_array.skipped, 1u);

  // Nothing usable is still an error.
  path_ = dir_ / "all_bad.jsonl";
  test::write_file(path_, "{}\n[]\n");
  EXPECT_EQ(with_file(error_of([&] { read_records(path_, kAlpacaFields, true, nullptr); })),
            "FILE: no usable records: all 2 records are bad (first: FILE:1: missing field "
            "'instruction'; each record needs the fields instruction, output)");
}

TEST_F(DataRecords, LimitStopsEarlyAndByteOrderMarkIsIgnored) {
  auto records =
      read("\xEF\xBB\xBF" + kGood + "\n" + kGood + "\n" + kGood + "\n{broken\n", false, nullptr, 2);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[1].line, 2u);
}

TEST(DataRecordsReal, AlpacaAndSqlFilesReadCleanly) {
  FSDPQ_SHARED_DATA_OR_SKIP(alpaca, "alpaca.jsonl");
  FSDPQ_SHARED_DATA_OR_SKIP(sql, "sql.jsonl");
  ReadStats stats;
  auto a = read_records(alpaca, {"instruction", "input", "output"}, false, &stats);
  EXPECT_EQ(a.size(), 5000u);
  EXPECT_EQ(a[0].fields.at("instruction"), "Give three tips for staying healthy.");
  size_t with_input = 0;
  for (const auto& r : a) with_input += !r.fields.at("input").empty();
  EXPECT_EQ(with_input, 1990u);  // as shared/data/README.md says
  auto s = read_records(sql, {"context", "question", "answer"}, false, &stats, 10);
  ASSERT_EQ(s.size(), 10u);
  EXPECT_EQ(s[0].fields.at("context"), "CREATE TABLE head (age INTEGER)");
  EXPECT_EQ(s[0].fields.at("answer"), "SELECT COUNT(*) FROM head WHERE age > 56");
  EXPECT_EQ(stats.read, 5010u);
  EXPECT_EQ(stats.skipped, 0u);
}

}  // namespace
}  // namespace fsdpq::data
