// kernels/lora_fused_sm90a_layout.h, the Hopper LoRA down kernel's index arithmetic, checked on the CPU
// with the hardware's rules written out: which element ldmatrix.x4 hands each lane from the copy
// engine's swizzled tile, and which dropout fields each lane ends up with after one hash and one
// exchange with its neighbour — against the mask's definition (kernels/lora_dropout_mask.h) and
// the CPU op's (ops/lora.h), element by element.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/lora_fused_sm90a_layout.h"
#include "kernels/lora_dropout_mask.h"
#include "kernels/splitmix64.h"
#include "ops/lora.h"

namespace fsdpq {
namespace {

using namespace lora_sm90a_layout;

// The (row, column) of the 16-bit element at byte `offset` of a tile of 128-byte rows whose
// 16-byte chunk c sits at chunk c ^ (row % 8) (the copy engine's 128-byte swizzle).
Pair unswizzled(int offset) {
  const int row = offset / 128, chunk = (offset % 128) / 16 ^ (row % 8), element = (offset % 16) / 2;
  return Pair{row, 8 * chunk + element};
}

// ldmatrix.x4: matrix i is the 8 rows whose addresses lanes 8i .. 8i + 7 give (8 consecutive
// 16-bit elements from each address); lane L receives, in register i, the two elements 2·(L % 4)
// and + 1 of row L / 4 of matrix i.
TEST(LoraSm90aLayout, LdmatrixHandsEachLaneItsFragmentPair) {
  for (int warp = 0; warp < 4; ++warp)
    for (int kk = 0; kk < 4; ++kk)
      for (int lane = 0; lane < 32; ++lane)
        for (int r = 0; r < 4; ++r) {
          const int source = 8 * r + lane / 4;
          const int offset = hopper_layout::a_operand_ldmatrix_offset(warp, source, kk) + 2 * 2 * (lane % 4);
          const Pair lo = unswizzled(offset), hi = unswizzled(offset + 2);
          const Pair want = fragment_pair(warp, lane, kk, r);
          ASSERT_EQ(lo.row, want.row) << "warp " << warp << " slice " << kk << " lane " << lane << " register " << r;
          ASSERT_EQ(lo.column, want.column) << "warp " << warp << " slice " << kk << " lane " << lane << " register " << r;
          ASSERT_EQ(hi.row, want.row);
          ASSERT_EQ(hi.column, want.column + 1);
          ASSERT_LT(want.row, 64);
          ASSERT_LT(want.column + 1, 64);
        }
}

// The fields each lane of a warp ends with after hashing one word, keeping a half and giving its
// neighbour (lane ^ 1) the other, for pairs whose rows g and g + 8 share columns as `pair_at`
// places them (in the tile at row0, column0 of a matrix `in` wide), against the mask's definition
// and the CPU op's, element by element.
template <class PairAt>
void expect_fields_decide_their_elements(PairAt&& pair_at, int64_t in, float p, uint64_t key, int64_t row0,
                                         int64_t column0) {
  const uint32_t threshold = static_cast<uint32_t>(std::lround(p * 65536.0));
  const uint64_t mixed = mix64(key);
  Halves halves[32];
  int64_t row_of[32], column_of[32];
  for (int lane = 0; lane < 32; ++lane) {
    const Pair at = pair_at(lane);
    row_of[lane] = row0 + at.row;
    column_of[lane] = column0 + at.column;
    const int64_t quad_g = (row_of[lane] * in + column_of[lane]) >> 2;
    const int64_t quad_g8 = ((row_of[lane] + 8) * in + column_of[lane]) >> 2;
    const bool odd = lane % 2 == 1;
    halves[lane] = split(keep_word(mixed, hashed_quad(quad_g, quad_g8, odd)), odd);
  }
  for (int lane = 0; lane < 32; ++lane) {
    const PairFields f = combine(halves[lane].keep, halves[lane ^ 1].give, lane % 2 == 1);
    for (int row_half = 0; row_half < 2; ++row_half)
      for (int high = 0; high < 2; ++high) {
        const int64_t e = (row_of[lane] + 8 * row_half) * in + column_of[lane] + high;
        const bool want = keeps_lane(keep_word(mixed, e / 4), static_cast<int>(e % 4), threshold);
        ASSERT_EQ(field_keeps(row_half == 0 ? f.row_g : f.row_g8, high, threshold), want)
            << "in " << in << " p " << p << " lane " << lane << " element " << e;
        ASSERT_EQ(want, lora_dropout_keeps(key, static_cast<uint64_t>(e), p)) << "element " << e;
      }
  }
}

// The down kernel's register pairs (rows g and g + 8: registers 2h and 2h + 1 of a slice).
TEST(LoraSm90aLayout, DownKernelsFieldsDecideTheirElements) {
  std::mt19937_64 rng(11);
  for (const int64_t in : {int64_t{64}, int64_t{192}, int64_t{4096}})
    for (const float p : {0.1f, 0.5f})
      for (int consumer = 0; consumer < 2; ++consumer)
        for (int warp = 0; warp < 4; ++warp)
          for (int kk = 0; kk < 4; ++kk)
            for (int h = 0; h < 2; ++h) {
              const int64_t row0 = 128 * static_cast<int64_t>(rng() % 50) + 64 * consumer;
              const int64_t column0 = 64 * static_cast<int64_t>(rng() % (in / 64));
              expect_fields_decide_their_elements([&](int lane) { return fragment_pair(warp, lane, kk, 2 * h); }, in, p,
                                                  rng(), row0, column0);
            }
}

// The input-gradient kernel's accumulator pairs (rows g and g + 8 of an 8-column chunk c).
TEST(LoraSm90aLayout, InputGradKernelsFieldsDecideTheirElements) {
  std::mt19937_64 rng(12);
  for (const int64_t in : {int64_t{128}, int64_t{4096}, int64_t{11008}})
    for (const float p : {0.1f, 0.3f})
      for (int consumer = 0; consumer < 2; ++consumer)
        for (int warp = 0; warp < 4; ++warp)
          for (int c = 0; c < 16; ++c) {
            const int64_t row0 = 128 * static_cast<int64_t>(rng() % 50) + 64 * consumer;
            const int64_t column0 = 128 * static_cast<int64_t>(rng() % (in / 128));
            expect_fields_decide_their_elements([&](int lane) { return accumulator_pair(warp, lane, c, 0); }, in, p,
                                                rng(), row0, column0);
          }
}

// The weight-gradient kernel's 16-byte chunks: pair q of the 8 elements from e0 (a multiple of 8)
// takes its fields from the chunk's two quad words as the mask's definition decides them.
TEST(LoraSm90aLayout, WeightGradChunksFieldsDecideTheirElements) {
  std::mt19937_64 rng(13);
  for (int trial = 0; trial < 2000; ++trial) {
    const uint64_t key = rng(), mixed = mix64(key);
    const int64_t e0 = 8 * static_cast<int64_t>(rng() % (int64_t{1} << 40));
    const uint32_t threshold = static_cast<uint32_t>(rng() % 65536);
    const uint64_t w0 = keep_word(mixed, e0 >> 2), w1 = keep_word(mixed, (e0 >> 2) + 1);
    for (int q = 0; q < 4; ++q)
      for (int high = 0; high < 2; ++high) {
        const int64_t e = e0 + 2 * q + high;
        ASSERT_EQ(field_keeps(chunk_pair_fields(w0, w1, q), high, threshold),
                  keeps_lane(keep_word(mixed, e / 4), static_cast<int>(e % 4), threshold))
            << "element " << e;
      }
  }
}

// The kernels' incremental hashing: keyed_at once per step, keep_word_at per offset, gives
// keep_word of the quad the lane hashes (hashed_quad of its pair's quads), for every slice and half
// of the down kernel and every chunk of the input gradient; and keep_word_at across any offset.
TEST(LoraSm90aLayout, IncrementalHashesAreTheLanesWords) {
  std::mt19937_64 rng(14);
  for (const int64_t in : {int64_t{64}, int64_t{4096}, int64_t{11008}})
    for (int trial = 0; trial < 20; ++trial) {
      const uint64_t mixed = mix64(rng());
      const int64_t row0 = 128 * static_cast<int64_t>(rng() % 5000) + 64 * static_cast<int64_t>(rng() % 2);
      const int64_t column0 = 64 * static_cast<int64_t>(rng() % (in / 64));
      for (int warp = 0; warp < 4; ++warp)
        for (int lane = 0; lane < 32; ++lane) {
          const bool odd = (lane & 1) != 0;
          const uint64_t keyed = keyed_at(mixed, lane_base_quad(warp, lane, row0, column0, in));
          auto word = [&](const Pair& at) {
            const int64_t row = row0 + at.row, column = column0 + at.column;
            return keep_word(mixed, hashed_quad((row * in + column) >> 2, ((row + 8) * in + column) >> 2, odd));
          };
          for (int kk = 0; kk < 4; ++kk)
            for (int h = 0; h < 2; ++h)
              ASSERT_EQ(keep_word_at(keyed, down_quad_offset(kk, h)), word(fragment_pair(warp, lane, kk, 2 * h)))
                  << "in " << in << " warp " << warp << " lane " << lane << " slice " << kk << " half " << h;
          for (int c = 0; c < 8; ++c)
            ASSERT_EQ(keep_word_at(keyed, input_grad_quad_offset(c)), word(accumulator_pair(warp, lane, c, 0)))
                << "in " << in << " warp " << warp << " lane " << lane << " chunk " << c;
        }
    }
  for (int trial = 0; trial < 1000; ++trial) {
    const uint64_t mixed = rng();
    const int64_t quad = static_cast<int64_t>(rng() % (int64_t{1} << 40)), delta = static_cast<int64_t>(rng() % 100000);
    ASSERT_EQ(keep_word_at(keyed_at(mixed, quad), delta), keep_word(mixed, quad + delta));
  }
}

}  // namespace
}  // namespace fsdpq
