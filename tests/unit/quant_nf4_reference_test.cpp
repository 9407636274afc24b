// Byte-for-byte comparison with real bitsandbytes (tests/reference/nf4_reference.py, run on a
// GPU machine). Set FSDPQ_NF4_REFERENCE to the folder the script wrote; without it the
// comparison is skipped (CI has neither a GPU nor bitsandbytes). FSDPQ_NF4_WRITE_INPUTS=DIR
// writes the script's hand-made inputs (special_f32.bin, special_bf16.bin) into DIR.
//
// The inputs are regenerated here: the special cases from the functions below, the synthetic
// ones from the same integer generator the script uses (SplitMix64, exact in both languages).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kernels/splitmix64.h"
#include "quant/dynamic_code.h"
#include "quant/nf4.h"
#include "reference_checksum.h"
#include "test_support.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

// Mirror of nf4_reference.py's synthetic_weights(): fp32 values before the bf16 rounding.
std::vector<float> synthetic_values(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t hr = mix64((seed ^ 0xabcdefull) + static_cast<uint64_t>(r + 1) * kGolden64);
    const double row_u = static_cast<double>(hr >> 40) * 0x1.0p-24;
    const float row_scale = static_cast<float>(0.002 + 0.05 * row_u);
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = r * cols + c;
      const uint64_t h = mix64(seed + static_cast<uint64_t>(i + 1) * kGolden64);
      const float centered =
          static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) * 0x1.0p-23f;
      float value = centered * row_scale;
      if ((h & 0xff) == 0) value *= 8.0f;
      v[static_cast<size_t>(i)] = value;
    }
  }
  if (v.size() >= 6 * 64) std::fill(v.begin() + 5 * 64, v.begin() + 6 * 64, 0.0f);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}

// fp32 input: ties exactly on the decision thresholds (absmax 1 and 2), the code values, a zero
// block, a block with one value, a subnormal block, random blocks, and an odd 37-value tail.
std::vector<float> special_f32_values() {
  std::vector<float> v = synthetic_values(1, 64 * 40 + 37, 77);
  const auto& t = nf4_thresholds();
  const auto& code = nf4_code();
  float* b0 = v.data();
  b0[0] = 1.0f;
  for (int k = 0; k < 15; ++k) {
    b0[1 + k] = t[k];
    b0[16 + k] = std::nextafter(t[k], 2.0f);
  }
  for (int k = 0; k < 16; ++k) b0[31 + k] = code[k];
  std::fill(v.begin() + 64, v.begin() + 128, 0.0f);  // block 1: zeros
  float* b2 = v.data() + 128;                         // block 2: absmax 2, same ties
  b2[0] = -2.0f;
  for (int k = 0; k < 15; ++k) {
    b2[1 + k] = 2.0f * t[k];
    b2[16 + k] = 2.0f * std::nextafter(t[k], -2.0f);
  }
  std::fill(v.begin() + 192, v.begin() + 256, 0.0f);  // block 3: one value
  v[192 + 17] = 0.3f;
  for (int i = 0; i < 64; ++i) v[256 + i] = (i % 2 ? -1.0f : 1.0f) * FLT_MIN * (i + 1) / 128.0f;
  return v;
}

// bf16 input: the synthetic generator (odd shape, so a 1-value tail) with a subnormal block, a
// one-value block, a block of hand values and a constant block.
std::vector<uint16_t> special_bf16_values() {
  std::vector<uint16_t> v = to_bf16(synthetic_values(37, 173, 7));
  for (int i = 0; i < 64; ++i) v[64 + i] = static_cast<uint16_t>((i % 3 ? 0x8000 : 0) | (i + 1));
  for (int i = 0; i < 64; ++i) v[128 + i] = 0;
  v[128 + 40] = float_to_bf16(-0.0123f);
  const float hand[] = {1.0f, 0.5f, 0.25f, 0.125f, -0.5f, -0.05f, 0.0f, -0.0f, 0.75f, -1.0f};
  for (int i = 0; i < 64; ++i) v[192 + i] = float_to_bf16(hand[i % 10] * (i < 10 ? 1.0f : 0.9f));
  for (int i = 0; i < 64; ++i) v[256 + i] = float_to_bf16(0.03125f);
  return v;
}

void write_all(const std::filesystem::path& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
}

// One case the script wrote: its index and blob.
struct ReferenceCase {
  nlohmann::json meta;
  std::string blob;

  // Compares our array with bitsandbytes' (bit patterns); returns a description of the
  // difference, empty when equal.
  template <class T>
  std::string compare(const std::string& name, const std::vector<T>& ours) const {
    const nlohmann::json& entry = meta.at("arrays").at(name);
    const size_t bytes = entry.at("bytes").get<size_t>();
    if (bytes != ours.size() * sizeof(T))
      return fmt::format("{}: {} bytes, ours {}", name, bytes, ours.size() * sizeof(T));
    const int64_t offset = entry.at("offset").get<int64_t>();
    if (offset < 0) {  // recorded by checksum only
      const std::string mine = test::reference_checksum(ours.data(), bytes);
      return mine == entry.at("checksum").get<std::string>()
                 ? ""
                 : fmt::format("{}: checksum differs ({} elements)", name, ours.size());
    }
    std::vector<T> theirs(ours.size());
    std::memcpy(theirs.data(), blob.data() + offset, bytes);
    int64_t differing = 0;
    std::string first;
    for (size_t i = 0; i < ours.size(); ++i) {
      if (std::memcmp(&ours[i], &theirs[i], sizeof(T)) == 0) continue;
      if (differing++ < 5)
        first += fmt::format(" [{}] ours {} bnb {}", i, static_cast<double>(ours[i]),
                             static_cast<double>(theirs[i]));
    }
    return differing == 0
               ? ""
               : fmt::format("{}: {} of {} differ:{}", name, differing, ours.size(), first);
  }
};

template <class Source>
std::vector<std::string> compare_case(const ReferenceCase& ref, const Source* input, int64_t n,
                                      bool bf16) {
  std::vector<std::string> problems;
  const auto check = [&](const std::string& problem) {
    if (!problem.empty()) problems.push_back(problem);
  };
  std::vector<float> nf4(nf4_code().begin(), nf4_code().end());
  std::vector<float> code8(dynamic_code_signed().begin(), dynamic_code_signed().end());
  check(ref.compare("nf4_code", nf4));
  check(ref.compare("dynamic_code", code8));

  const Nf4Tensor plain = nf4_quantize(input, n, {n}, false);
  const Nf4Tensor nested = nf4_quantize(input, n, {n}, true);
  check(ref.compare("packed", plain.packed));
  check(ref.compare("absmax", plain.absmax));
  check(ref.compare("nested_packed", nested.packed));
  check(ref.compare("nested_absmax_q", nested.absmax_q));
  check(ref.compare("nested_scale", nested.absmax_scale));
  check(ref.compare("nested_offset", std::vector<float>{nested.absmax_offset}));
  check(ref.compare("nested_absmax", nf4_absmax(nested)));
  if (bf16) {
    std::vector<uint16_t> deq(static_cast<size_t>(n)), ndeq(static_cast<size_t>(n));
    nf4_dequantize(plain, deq.data());
    nf4_dequantize(nested, ndeq.data());
    check(ref.compare("deq", deq));
    check(ref.compare("nested_deq", ndeq));
  } else {
    std::vector<float> deq(static_cast<size_t>(n)), ndeq(static_cast<size_t>(n));
    nf4_dequantize(plain, deq.data());
    nf4_dequantize(nested, ndeq.data());
    check(ref.compare("deq", deq));
    check(ref.compare("nested_deq", ndeq));
  }
  return problems;
}

TEST(Nf4Reference, WritesSpecialInputs) {
  const char* dir = std::getenv("FSDPQ_NF4_WRITE_INPUTS");
  if (!dir) GTEST_SKIP() << "FSDPQ_NF4_WRITE_INPUTS not set";
  std::filesystem::create_directories(dir);
  const std::vector<float> f32 = special_f32_values();
  const std::vector<uint16_t> b16 = special_bf16_values();
  write_all(std::filesystem::path(dir) / "special_f32.bin", f32.data(), f32.size() * 4);
  write_all(std::filesystem::path(dir) / "special_bf16.bin", b16.data(), b16.size() * 2);
}

TEST(Nf4Reference, MatchesBitsandbytesByteForByte) {
  const char* dir = std::getenv("FSDPQ_NF4_REFERENCE");
  if (!dir)
    GTEST_SKIP() << "FSDPQ_NF4_REFERENCE not set: run tests/reference/nf4_reference.py on a GPU "
                    "machine and point it at the output folder";
  int cases = 0;
  for (const auto& file : std::filesystem::directory_iterator(dir)) {
    if (file.path().extension() != ".json") continue;
    ReferenceCase ref;
    ref.meta = nlohmann::json::parse(test::read_file(file.path()));
    ref.blob = test::read_file(std::filesystem::path(file.path()).replace_extension(".bin"));
    const nlohmann::json& source = ref.meta.at("source");
    std::vector<std::string> problems;
    if (source.contains("synthetic")) {
      const std::vector<float> values =
          synthetic_values(source["synthetic"][0].get<int64_t>(),
                           source["synthetic"][1].get<int64_t>(), source["seed"].get<uint64_t>());
      if (source.at("dtype") == "fp32") {
        problems = compare_case(ref, values.data(), static_cast<int64_t>(values.size()), false);
      } else {
        const std::vector<uint16_t> w = to_bf16(values);
        problems = compare_case(ref, w.data(), static_cast<int64_t>(w.size()), true);
      }
    } else if (source.at("input") == "special_f32.bin") {
      const std::vector<float> w = special_f32_values();
      problems = compare_case(ref, w.data(), static_cast<int64_t>(w.size()), false);
    } else if (source.at("input") == "special_bf16.bin") {
      const std::vector<uint16_t> w = special_bf16_values();
      problems = compare_case(ref, w.data(), static_cast<int64_t>(w.size()), true);
    } else {
      ADD_FAILURE() << "unknown reference input " << source.dump();
      continue;
    }
    ++cases;
    std::string report;
    for (const auto& p : problems) report += "\n  " + p;
    EXPECT_TRUE(problems.empty()) << ref.meta.at("case").get<std::string>() << " (bitsandbytes "
                                  << ref.meta.at("bitsandbytes").get<std::string>() << "):"
                                  << report;
  }
  EXPECT_GT(cases, 0) << "no reference case (*.json) in " << dir;
}

}  // namespace
}  // namespace fsdpq
