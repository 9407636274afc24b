// HQQ (Half-Quadratic Quantization), as hqq 0.2.8 quantises a linear weight for fsdp_qlora's
// hqq_* train types (docs/hqq.md): groups of 64 consecutive values of the row-major weight, an
// 8/4/3/2/1-bit code per value, and per group a scale and a zero point, the zero point refined by
// hqq's proximal solver. The same bytes and dequantised values as hqq
// (tests/reference/hqq_reference.py, tests/unit/quant_hqq_reference_test.cpp).
//
// The solver stops when the mean error over the WHOLE tensor stops falling, so a group's zero
// point depends on every other group through one number: how many updates the solver made. The
// pieces here keep that explicit: hqq_solve_group runs a group for a given number of updates
// and adds its error per iteration to a sum; hqq_zero_updates turns the tensor's summed errors
// into the number of updates. The frozen format (quant/hqq_format.cpp) places them around the
// sharded loader's statistics exchange.
#pragma once
#include <cstdint>
#include <span>

#include "util/dtype.h"

namespace fsdpq {

inline constexpr int64_t kHqqGroupSize = 64;
inline constexpr int kHqqSolverIterations = 20;  // hqq's proximal solver: at most 20 updates
// The solver's error statistics are kept per block of this many consecutive groups (a rank that
// measures a block reads all of it; the block sums are what the ranks exchange).
inline constexpr int64_t kHqqBlockGroups = 64;

// The arithmetic hqq's solver works in: float16 where hqq runs on a GPU (fsdp_qlora's path, and
// fsdpq's), float32 where it runs on the CPU (what hqq's CPU reference vectors use).
enum class HqqSolverPrecision { kHalf, kFloat };

// The widths hqq packs and fsdp_qlora's n_bits may name.
bool hqq_supported_bits(int n_bits);

// hqq's BitPack layout of the [groups, 64] code matrix (axis 1: a group is a row). The matrix is
// cut into `slices` blocks of `rows` groups; word (r, j) of the packed [rows, 64] matrix holds
// code (k * rows + r, j) of every slice k, slice 0 in the highest bits. 8, 4, 2, 1 bits: one byte
// per word, 1, 2, 4, 8 slices (the groups must divide evenly). 3 bits: an int32 per word (little
// endian), 10 slices of ceil(groups / 10) rows, codes past the last group 0, slice k at bit 27 - 3k.
struct HqqPacking {
  int n_bits = 4;
  int64_t groups = 0;
  int slices = 1;
  int64_t rows = 0;
  int word_bytes = 1;

  // The packing of a weight of `numel` values; throws std::invalid_argument, saying why, when
  // hqq cannot pack it (numel not a multiple of 64, or its groups not a multiple of the slices).
  static HqqPacking of(int n_bits, int64_t numel);
  int64_t bytes() const { return rows * kHqqGroupSize * word_bytes; }
  int shift(int slice) const { return n_bits == 3 ? 27 - 3 * slice : (slices - 1 - slice) * n_bits; }
  // The code of group g, element j, from the packed bytes.
  uint32_t code(const uint8_t* packed, int64_t g, int64_t j) const;
};

// A group's starting scale and zero point, fp32, as Quantizer.quantize computes them before the
// solver: scale = (2^n - 1) / (max - min) (1 where max - min <= 1e-4, at most 2e4), zero =
// -min * scale, rounded to an integer for 4 bits (hqq's round_zero).
struct HqqGroupStart {
  float scale = 1.0f, zero = 0.0f;
};
HqqGroupStart hqq_group_start(const float* values, int n_bits);

// The group after the solver: scale and zero point in the solver's precision (exactly
// representable there), and the codes (one per value) hqq computes from them in fp32.
struct HqqGroup {
  float scale = 1.0f, zero = 0.0f;
};

// Runs `updates` proximal updates of one group's zero point (hqq's
// optimize_weights_proximal_legacy: lp-norm 0.7, beta 10 growing by 1.01 per update) and returns
// the result. If `errors` is given, errors[i] += the group's sum of |W_f - W_r| at iteration i
// (before update i), for i < updates: the terms of the tensor-wide mean that decides when to stop.
HqqGroup hqq_solve_group(const float* values, const HqqGroupStart& start, int n_bits, int updates,
                         HqqSolverPrecision precision, double* errors);

// The number of zero-point updates hqq makes, from the tensor's summed errors per iteration
// (kHqqSolverIterations of them, each the sum over every value): it stops at the first iteration
// whose mean error is not below the best so far, keeping that iteration's update.
int hqq_zero_updates(std::span<const double> error_sums, int64_t numel, HqqSolverPrecision precision);

// |x|^(lp_norm - 1) for every non-negative float16 x (0x7c01 floats indexed by the half's bits, +inf
// last), as torch computes it on a half tensor: what the half solver on either device looks up.
std::span<const float> hqq_half_shrink_powers();

// codes[j] = clamp(round(values[j] * scale + zero), 0, 2^n - 1), in fp32 as hqq does.
void hqq_group_codes(const float* values, const HqqGroup& group, int n_bits, uint8_t* codes);

// What hqq stores: the zero point and 1 / scale (in the solver's precision) rounded to the
// compute dtype `meta` (BF16 or F16), as raw 16-bit words.
uint16_t hqq_meta_bits(float value, DType meta);
float hqq_meta_value(uint16_t bits, DType meta);
HqqGroup hqq_stored(const HqqGroup& group, HqqSolverPrecision precision, DType meta);  // zero, 1/scale as values

// Dequantises groups [first, first + count) into out (count * 64 values): (code - zero) * scale
// in the compute dtype `meta`, two roundings, as hqq's Quantizer.dequantize; out is F32, BF16 or
// F16 (the meta dtype's values, widened exactly to F32). zeros/scales: every group's 16-bit words.
void hqq_dequantize_groups(const HqqPacking& packing, const uint8_t* packed, const uint16_t* zeros,
                           const uint16_t* scales, DType meta, int64_t first, int64_t count, DType out_dtype, void* out);

}  // namespace fsdpq
