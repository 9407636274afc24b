// Datasets made in memory: fsdp_qlora's "dummy" (length control for benchmarks) and "synthetic",
// a small learnable alpaca-style dataset for the offline demo.
#pragma once
#include <cstdint>
#include <filesystem>
#include <vector>

#include "data/records.h"

namespace fsdpq::data {

// `samples` copies of {instruction: "instruction", input: "input",
// output: "output" repeated 2 * context_length times}, as fsdp_qlora's dummy dataset.
std::vector<Record> make_dummy_records(int64_t samples, int64_t context_length);

// `samples` alpaca-style records (instruction / input / output) drawn from a few deterministic
// task families a small model can learn: adding numbers, reversing a word, counting a letter,
// sorting numbers, writing a number in words (no input) and SQL for a made-up table. The same
// (samples, seed) always gives the same records, on every platform.
std::vector<Record> make_synthetic_records(int64_t samples, uint64_t seed);

// Writes one JSON object per line (UTF-8, keys sorted), atomically.
void write_jsonl(const std::filesystem::path& path, const std::vector<Record>& records);

}  // namespace fsdpq::data
