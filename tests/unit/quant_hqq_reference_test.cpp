// Comparison with the real hqq library (tests/reference/hqq_reference.py, hqq 0.2.8 as
// fsdp_qlora calls it): the packed codes, the zero points and scales (hqq's meta "zero_scale")
// and the dequantised weight of each case, byte for byte.
//
// tests/data/hqq holds hqq's output on the CPU: hqq_cpu (its fp32 solver, compared with fsdpq's
// fp32 solver) and hqq_half (the solver's dtype set to float16, as hqq runs it on a GPU: fsdpq's
// solver). FSDPQ_HQQ_REFERENCE=DIR adds DIR/hqq_cuda.json, written by the script on a GPU
// (scripts/device_hqq.sh), compared with fsdpq's solver.
//
// The weights are regenerated here from the script's integer generator (SplitMix64, exact in
// both languages).
#include <gtest/gtest.h>

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
#include "quant/frozen_storage.h"
#include "quant/hqq.h"
#include "reference_checksum.h"
#include "test_support.h"
#include "util/bf16.h"

namespace fsdpq {
namespace {

namespace fs = std::filesystem;

// Mirror of hqq_reference.py's synthetic_weights().
std::vector<float> synthetic_weights(int64_t rows, int64_t cols, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(rows * cols)), centered(v.size());
  for (int64_t i = 0; i < rows * cols; ++i) {
    const uint64_t h = mix64(seed + static_cast<uint64_t>(i + 1) * kGolden64);
    const float c = static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) * 0x1.0p-23f;
    const float cubed = (c * c) * c;
    centered[static_cast<size_t>(i)] = c;
    v[static_cast<size_t>(i)] = cubed * std::ldexp(1.0f, -static_cast<int>(i / cols % 4 + 3));
  }
  std::fill(v.begin(), v.begin() + 64, 0.0f);
  std::fill(v.begin() + 64, v.begin() + 128, 0.01f);
  for (size_t i = 128; i < 192; ++i) v[i] = std::fabs(v[i]);
  for (size_t i = 192; i < 256; ++i) v[i] = 1e-3f + centered[i] * 0x1.0p-16f;
  return v;
}

struct CaseResult {
  int differing = 0;  // arrays whose bytes differ from hqq's
};

// One array of a case against fsdpq's bytes: its checksum, and its bytes where they are inline
// (reporting the first differing 16-bit word or byte).
void expect_same(const nlohmann::json& entry, const std::string& blob, const std::vector<uint8_t>& got,
                 const std::string& what, CaseResult& result) {
  const bool same_size = entry["bytes"].get<size_t>() == got.size();
  const bool same =
      same_size && entry["checksum"].get<std::string>() == test::reference_checksum(got.data(), got.size());
  if (same) return;
  ++result.differing;
  std::string detail = same_size ? "" : fmt::format(" ({} bytes, hqq {})", got.size(), entry["bytes"].get<size_t>());
  const int64_t offset = entry["offset"].get<int64_t>();
  if (same_size && offset >= 0) {
    const auto* want = reinterpret_cast<const uint8_t*>(blob.data()) + offset;
    int64_t first = -1, count = 0;
    for (size_t i = 0; i < got.size(); ++i)
      if (got[i] != want[i]) {
        if (first < 0) first = static_cast<int64_t>(i);
        ++count;
      }
    if (first >= 0)
      detail = fmt::format(": {} of {} bytes differ, the first at byte {} (fsdpq {:#04x}, hqq {:#04x})", count,
                           got.size(), first, got[static_cast<size_t>(first)], want[first]);
  }
  ADD_FAILURE() << what << " differs from hqq's" << detail;
}

std::vector<uint8_t> bytes_of(std::span<const uint8_t> s) { return {s.begin(), s.end()}; }

// Every case of one reference file, quantised by fsdpq with `float_solver` as the solver.
void compare_with_reference(const fs::path& json_path, bool float_solver) {
  const nlohmann::json index = nlohmann::json::parse(test::read_file(json_path));
  const std::string blob = test::read_file(fs::path(json_path).replace_extension(".bin"));
  int cases = 0, failed = 0;
  for (const nlohmann::json& c : index["cases"]) {
    const std::string name = c["name"].get<std::string>();
    SCOPED_TRACE(fmt::format("{} case {}", json_path.filename().string(), name));
    const int64_t rows = c["shape"][0], cols = c["shape"][1];
    const int n_bits = c["n_bits"];
    const DType meta = c["compute_dtype"] == "bfloat16" ? DType::BF16 : DType::F16;
    const std::vector<float> w = synthetic_weights(rows, cols, c["seed"].get<uint64_t>());
    std::vector<uint16_t> bf16(w.size());
    for (size_t i = 0; i < w.size(); ++i) bf16[i] = float_to_bf16(w[i]);
    const bool from_bf16 = c["dtype"] == "bf16";
    const FrozenStorage s = FrozenStorage::encode(hqq_format(n_bits, meta, float_solver), Shape{rows, cols},
                                                  from_bf16 ? static_cast<const void*>(bf16.data()) : w.data(),
                                                  from_bf16 ? DType::BF16 : DType::F32);
    // hqq's zero_scale: the zero points, then the scales.
    std::vector<uint8_t> zero_scale = bytes_of(s.segment(1));
    const std::vector<uint8_t> scales = bytes_of(s.segment(2));
    zero_scale.insert(zero_scale.end(), scales.begin(), scales.end());
    Tensor scratch;
    const TensorView deq = s.dense(scratch, meta);
    const auto* deq_bytes = static_cast<const uint8_t*>(deq.data);

    CaseResult result;
    const nlohmann::json& arrays = c["arrays"];
    expect_same(arrays["codes"], blob, bytes_of(s.segment(0)), "codes", result);
    expect_same(arrays["zero_scale"], blob, zero_scale, "zero_scale", result);
    expect_same(arrays["deq"], blob, std::vector<uint8_t>(deq_bytes, deq_bytes + 2 * w.size()), "dequantised", result);
    ++cases;
    failed += result.differing > 0;
  }
  EXPECT_GT(cases, 0);
  std::printf("%s: %d of %d cases equal hqq's bytes (hqq %s, torch %s, %s)\n", json_path.filename().c_str(),
              cases - failed, cases, index["hqq"].get<std::string>().c_str(), index["torch"].get<std::string>().c_str(),
              index["device"].get<std::string>().c_str());
}

const fs::path kData = fs::path(FSDPQ_SOURCE_DIR) / "tests" / "data" / "hqq";

TEST(HqqReference, FloatSolverEqualsHqqOnTheCpu) { compare_with_reference(kData / "hqq_cpu.json", true); }

TEST(HqqReference, HalfSolverEqualsHqqWithItsGpuSolverDtype) { compare_with_reference(kData / "hqq_half.json", false); }

TEST(HqqReference, HalfSolverEqualsHqqOnTheGpu) {
  const char* dir = std::getenv("FSDPQ_HQQ_REFERENCE");
  if (dir == nullptr || *dir == '\0') GTEST_SKIP() << "FSDPQ_HQQ_REFERENCE is not set (scripts/device_hqq.sh sets it)";
  compare_with_reference(fs::path(dir) / "hqq_cuda.json", false);
}

}  // namespace
}  // namespace fsdpq
