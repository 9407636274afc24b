#include "data/synthetic.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "util/error.h"
#include "util/strings.h"
#include "util/write_via_temp.h"

namespace fsdpq::data {
namespace fs = std::filesystem;

namespace {

// std::mt19937_64's output is fixed by the standard; the std distributions are not, so draws are
// made with plain modulo (the tiny bias does not matter here).
class Draw {
 public:
  explicit Draw(std::mt19937_64& engine) : engine_(engine) {}
  int64_t below(int64_t n) { return static_cast<int64_t>(engine_() % static_cast<uint64_t>(n)); }
  template <class T, size_t N>
  const T& pick(const std::array<T, N>& items) {
    return items[static_cast<size_t>(below(N))];
  }

 private:
  std::mt19937_64& engine_;
};

constexpr std::array<const char*, 24> kWords = {
    "planet", "garden", "window", "silver", "rocket", "banana", "pencil", "orange",
    "forest", "castle", "bridge", "turtle", "summer", "coffee", "marble", "violin",
    "dragon", "candle", "market", "island", "letter", "puzzle", "butter", "mirror"};

Record make_record(std::string instruction, std::string input, std::string output) {
  Record r;
  r.fields = {{"instruction", std::move(instruction)},
              {"input", std::move(input)},
              {"output", std::move(output)}};
  return r;
}

Record addition(Draw& d) {
  int64_t a = d.below(100), b = d.below(100);
  return make_record("Add the two numbers.", fmt::format("{} + {}", a, b), std::to_string(a + b));
}

Record reverse_word(Draw& d) {
  std::string word = d.pick(kWords);
  std::string reversed(word.rbegin(), word.rend());
  return make_record("Reverse the letters of the word.", word, reversed);
}

Record count_letter(Draw& d) {
  std::string word = d.pick(kWords);
  // Mostly a letter of the word, sometimes any letter, so "0" is a possible answer.
  char letter = d.below(4) != 0
                    ? word[static_cast<size_t>(d.below(static_cast<int64_t>(word.size())))]
                    : static_cast<char>('a' + d.below(26));
  auto count = std::count(word.begin(), word.end(), letter);
  return make_record(
      fmt::format("Count how many times the letter '{}' appears in the word.", letter), word,
      std::to_string(count));
}

Record sort_numbers(Draw& d) {
  std::vector<int64_t> numbers(static_cast<size_t>(3 + d.below(4)));
  for (auto& n : numbers) n = d.below(50);
  std::vector<int64_t> sorted = numbers;
  std::sort(sorted.begin(), sorted.end());
  return make_record("Sort the numbers in ascending order.",
                     fmt::format("{}", fmt::join(numbers, ", ")),
                     fmt::format("{}", fmt::join(sorted, ", ")));
}

std::string number_in_words(int64_t n) {
  static const std::array<const char*, 20> small = {
      "zero",     "one",     "two",     "three",     "four",     "five",    "six",
      "seven",    "eight",   "nine",    "ten",       "eleven",   "twelve",  "thirteen",
      "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen"};
  static const std::array<const char*, 10> tens = {"",      "",      "twenty",  "thirty", "forty",
                                                   "fifty", "sixty", "seventy", "eighty", "ninety"};
  if (n < 20) return small[static_cast<size_t>(n)];
  std::string words = tens[static_cast<size_t>(n / 10)];
  if (n % 10) words += std::string("-") + small[static_cast<size_t>(n % 10)];
  return words;
}

Record number_words(Draw& d) {
  int64_t n = d.below(100);
  return make_record(fmt::format("Write the number {} in words.", n), "", number_in_words(n));
}

struct Table {
  const char* name;
  const char* plural;
  const char* number_column;  // an INTEGER column
  const char* text_column;    // a VARCHAR column besides name
  std::array<const char*, 4> text_values;
};

constexpr std::array<Table, 3> kTables = {{
    {"employees", "employees", "age", "city", {"Paris", "Lima", "Oslo", "Tokyo"}},
    {"products", "products", "price", "category", {"toys", "books", "tools", "food"}},
    {"students", "students", "grade", "school", {"North", "South", "East", "West"}},
}};

Record sql_query(Draw& d) {
  const Table& t = d.pick(kTables);
  std::string schema = fmt::format("CREATE TABLE {} (name VARCHAR, {} INTEGER, {} VARCHAR)", t.name,
                                   t.number_column, t.text_column);
  std::string value = d.pick(t.text_values);
  int64_t threshold = 10 + d.below(50);
  std::string question, answer;
  switch (d.below(4)) {
    case 0:
      question = fmt::format("How many {} have {} {}?", t.plural, t.text_column, value);
      answer = fmt::format("SELECT COUNT(*) FROM {} WHERE {} = '{}'", t.name, t.text_column, value);
      break;
    case 1:
      question = fmt::format("List the names of {} with {} above {}.", t.plural, t.number_column,
                             threshold);
      answer = fmt::format("SELECT name FROM {} WHERE {} > {}", t.name, t.number_column, threshold);
      break;
    case 2:
      question = fmt::format("What is the average {} of {} with {} {}?", t.number_column, t.plural,
                             t.text_column, value);
      answer = fmt::format("SELECT AVG({}) FROM {} WHERE {} = '{}'", t.number_column, t.name,
                           t.text_column, value);
      break;
    default:
      question = fmt::format("What is the largest {} of all {}?", t.number_column, t.plural);
      answer = fmt::format("SELECT MAX({}) FROM {}", t.number_column, t.name);
      break;
  }
  return make_record("Write an SQL query that answers the question about the table.",
                     schema + "\nQuestion: " + question, answer);
}

}  // namespace

Record make_dummy_record(int64_t context_length, size_t index) {
  if (context_length < 1)
    fail("context_length is {}; expected a positive number of tokens", context_length);
  std::string output;
  output.reserve(static_cast<size_t>(6 * 2 * context_length));
  for (int64_t i = 0; i < 2 * context_length; ++i) output += "output";
  Record record = make_record("instruction", "input", output);
  record.line = index + 1;
  return record;
}

std::vector<Record> make_dummy_records(int64_t samples, int64_t context_length) {
  if (samples < 1) fail("dataset_samples is {}; the dummy dataset needs at least 1", samples);
  std::vector<Record> records(static_cast<size_t>(samples), make_dummy_record(context_length, 0));
  for (size_t i = 0; i < records.size(); ++i) records[i].line = i + 1;
  return records;
}

SyntheticRecords::SyntheticRecords(uint64_t seed) : engine_(seed) {}

Record SyntheticRecords::next() {
  using Family = Record (*)(Draw&);
  static constexpr std::array<Family, 6> families = {addition,     reverse_word, count_letter,
                                                     sort_numbers, number_words, sql_query};
  Draw draw(engine_);
  Record record = draw.pick(families)(draw);
  record.line = ++made_;
  return record;
}

std::vector<Record> make_synthetic_records(int64_t samples, uint64_t seed) {
  if (samples < 1) fail("dataset_samples is {}; the synthetic dataset needs at least 1", samples);
  SyntheticRecords made(seed);
  std::vector<Record> records;
  records.reserve(static_cast<size_t>(samples));
  for (int64_t i = 0; i < samples; ++i) records.push_back(made.next());
  return records;
}

void write_jsonl(const fs::path& path, const std::vector<Record>& records) {
  write_via_temp(path, [&](std::ostream& out) {
    for (const Record& record : records) {
      nlohmann::json object(record.fields);
      try {
        out << object.dump(-1, ' ', false, nlohmann::json::error_handler_t::strict) << '\n';
      } catch (const nlohmann::json::type_error&) {
        fail("cannot write '{}': record {} has a field that is not valid UTF-8", path.string(), record.line);
      }
    }
  });
}

}  // namespace fsdpq::data
