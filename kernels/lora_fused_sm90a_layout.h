// Where each thread of the Hopper fused LoRA kernels (kernels/lora_fused_sm90a.cu) finds its
// elements and which dropout fields decide them: plain C++ for host and device, so a CPU test
// (tests/unit/kernels_lora_fused_sm90a_layout_test.cpp) checks the index arithmetic — the part of the
// kernel most easily wrong — against the CPU's mask, element by element, without a GPU.
//
// The down kernel: a consumer warpgroup multiplies 64 rows of x a 64-column step at a time, in
// 16-column slices.
// The step's tile lies in shared memory as the copy engine writes it: rows of 128 bytes whose
// 16-byte chunk c sits at chunk c ^ (row % 8). Warp w of the warpgroup holds rows 16w..16w+15 of
// wgmma's register A operand: with g = lane / 4, t = lane % 4, register r of slice kk holds row
// 16w + g + 8·(r & 1), columns 16·kk + 2t + 8·(r >> 1) and the one after.
#pragma once
#include <cstdint>

#include "kernels/host_device.h"
#include "kernels/hopper/a_operand_layout.h"
#include "kernels/splitmix64.h"

namespace fsdpq::lora_sm90a_layout {

// The row (of the consumer's 64) and first column (of the step's 64) of register r's two elements.
struct Pair {
  int row, column;
};
FSDPQ_HOST_DEVICE_INLINE Pair fragment_pair(int warp, int lane, int kk, int r) {
  return Pair{16 * warp + lane / 4 + 8 * (r & 1), 16 * kk + 2 * (lane % 4) + 8 * (r >> 1)};
}

// The input-gradient kernel masks its products' accumulators instead: an m64nN accumulator holds,
// in registers 4c + 2h and 4c + 2h + 1, row 16w + g + 8h and columns 8c + 2t and the one after.
FSDPQ_HOST_DEVICE_INLINE Pair accumulator_pair(int warp, int lane, int c, int h) {
  return Pair{16 * warp + lane / 4 + 8 * h, 8 * c + 2 * (lane % 4)};
}

// ldmatrix.x4's addresses for the consumer's swizzled 64-row tile (registers 0-3 in fragment_pair's
// order) are kernels/hopper/a_operand_layout.h's a_operand_ldmatrix_offset.

// The dropout fields (two 16-bit fields, the lower element's in the lower half) of a thread's
// pairs in rows g and g + 8 of a slice, the same columns. Lanes 2q and 2q + 1 hold the two halves
// of the same quad words (4 columns from a multiple of 4), so each hashes one word — the even lane
// row g's, the odd lane row g + 8's (hashed_quad) — keeps its own half and gives the other lane
// the half that lane needs (split), which it combines with the half it got (combine).
struct PairFields {
  uint32_t row_g, row_g8;
};
struct Halves {
  uint32_t keep, give;
};
// The quad whose word this lane hashes, from the quads of its rows g and g + 8.
FSDPQ_HOST_DEVICE_INLINE int64_t hashed_quad(int64_t quad_g, int64_t quad_g8, bool odd) { return odd ? quad_g8 : quad_g; }
FSDPQ_HOST_DEVICE_INLINE Halves split(uint64_t word, bool odd) {
  const uint32_t low = static_cast<uint32_t>(word), high = static_cast<uint32_t>(word >> 32);
  return odd ? Halves{high, low} : Halves{low, high};
}
FSDPQ_HOST_DEVICE_INLINE PairFields combine(uint32_t keep, uint32_t got, bool odd) {
  return odd ? PairFields{got, keep} : PairFields{keep, got};
}

// The weight-gradient kernel masks x in 16-byte chunks of 8 elements (from a multiple of 8: two
// quads, words w0 and w1): pair q (elements 2q, 2q + 1) takes these fields.
FSDPQ_HOST_DEVICE_INLINE uint32_t chunk_pair_fields(uint64_t w0, uint64_t w1, int q) {
  return static_cast<uint32_t>((q < 2 ? w0 : w1) >> (32 * (q & 1)));
}

// Hashing without a 64-bit product per word. keep_word(key, quad) = mix64(key + (quad + 1)·φ)
// (φ = kGolden64, arithmetic mod 2^64), and the quads a thread hashes in a step are a base quad Q
// plus offsets known at compile time: key + (Q + 1)·φ is one product per step (keyed_at), each
// offset's d·φ a constant (keep_word_at). keep_word(key, Q + d) == keep_word_at(keyed_at(key, Q), d).
FSDPQ_HOST_DEVICE_INLINE uint64_t keyed_at(uint64_t mixed_key, int64_t quad) {
  return mixed_key + static_cast<uint64_t>(quad + 1) * kGolden64;
}
FSDPQ_HOST_DEVICE_INLINE uint64_t keep_word_at(uint64_t keyed, int64_t delta) {
  return mix64(keyed + static_cast<uint64_t>(delta) * kGolden64);
}

// The base quad of a lane's hashed words in the down and input-gradient kernels: the lane hashes
// its row g's word (even lanes) or row g + 8's (odd), in columns from column0 (a multiple of 4) of
// a matrix `in` wide (a multiple of 4), the consumer's rows from row0. The down kernel's slice kk,
// registers 2h and 2h + 1 then take quad base + 4·kk + 2·h; the input gradient's 8-column chunk c
// takes base + 2·c (hashed_quad of the quads of fragment_pair and accumulator_pair).
FSDPQ_HOST_DEVICE_INLINE int64_t lane_base_quad(int warp, int lane, int64_t row0, int64_t column0, int64_t in) {
  const int64_t row = row0 + 16 * warp + lane / 4 + ((lane & 1) != 0 ? 8 : 0);
  return (row * in + column0) / 4 + (lane % 4) / 2;
}
FSDPQ_HOST_DEVICE_INLINE constexpr int down_quad_offset(int kk, int h) { return 4 * kk + 2 * h; }
FSDPQ_HOST_DEVICE_INLINE constexpr int input_grad_quad_offset(int c) { return 2 * c; }

// Whether the field of element `high` (0: the pair's lower, 1: its upper) keeps the element.
FSDPQ_HOST_DEVICE_INLINE bool field_keeps(uint32_t fields, int high, uint32_t threshold) {
  return ((fields >> (16 * high)) & 0xFFFFu) >= threshold;
}

}  // namespace fsdpq::lora_sm90a_layout
