// Datasets made in memory: fsdp_qlora's "dummy" (length control for benchmarks) and "synthetic",
// a small learnable alpaca-style dataset for the offline demo.
#pragma once
#include <cstdint>
#include <filesystem>
#include <random>
#include <vector>

#include "data/records.h"

namespace fsdpq::data {

// `samples` copies of {instruction: "instruction", input: "input",
// output: "output" repeated 2 * context_length times}, as fsdp_qlora's dummy dataset.
std::vector<Record> make_dummy_records(int64_t samples, int64_t context_length);
// Record `index` of the dummy dataset (all are the same; `line` is index + 1).
Record make_dummy_record(int64_t context_length, size_t index);

// `samples` alpaca-style records (instruction / input / output) drawn from a few deterministic
// task families a small model can learn: adding numbers, reversing a word, counting a letter,
// sorting numbers, writing a number in words (no input) and SQL for a made-up table. The same
// (samples, seed) always gives the same records, on every platform.
std::vector<Record> make_synthetic_records(int64_t samples, uint64_t seed);
// make_synthetic_records' records one after another, for a reader that keeps only some: record i
// draws from where record i - 1 left the engine, so it can only be made after all before it.
class SyntheticRecords {
 public:
  explicit SyntheticRecords(uint64_t seed);
  Record next();  // record made() (its line: made() + 1)
  size_t made() const { return made_; }

 private:
  std::mt19937_64 engine_;
  size_t made_ = 0;
};

// Writes one JSON object per line (UTF-8, keys sorted), atomically.
void write_jsonl(const std::filesystem::path& path, const std::vector<Record>& records);

}  // namespace fsdpq::data
