// kernels/lora_down_layout.h, the Hopper LoRA down kernel's index arithmetic, checked on the CPU
// with the hardware's rules written out: which element ldmatrix.x4 hands each lane from the copy
// engine's swizzled tile, and which dropout fields each lane ends up with after one hash and one
// exchange with its neighbour — against the mask's definition (kernels/lora_dropout_mask.h) and
// the CPU op's (ops/lora.h), element by element.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "kernels/lora_down_layout.h"
#include "kernels/lora_dropout_mask.h"
#include "kernels/splitmix64.h"
#include "ops/lora.h"

namespace fsdpq {
namespace {

using namespace lora_down_layout;

// The (row, column) of the 16-bit element at byte `offset` of a tile of 128-byte rows whose
// 16-byte chunk c sits at chunk c ^ (row % 8) (the copy engine's 128-byte swizzle).
Pair unswizzled(int offset) {
  const int row = offset / 128, chunk = (offset % 128) / 16 ^ (row % 8), element = (offset % 16) / 2;
  return Pair{row, 8 * chunk + element};
}

// ldmatrix.x4: matrix i is the 8 rows whose addresses lanes 8i .. 8i + 7 give (8 consecutive
// 16-bit elements from each address); lane L receives, in register i, the two elements 2·(L % 4)
// and + 1 of row L / 4 of matrix i.
TEST(LoraDownLayout, LdmatrixHandsEachLaneItsFragmentPair) {
  for (int warp = 0; warp < 4; ++warp)
    for (int kk = 0; kk < 4; ++kk)
      for (int lane = 0; lane < 32; ++lane)
        for (int r = 0; r < 4; ++r) {
          const int source = 8 * r + lane / 4;
          const int offset = ldmatrix_offset(warp, source, kk) + 2 * 2 * (lane % 4);
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

// Every lane of a warp hashes one word, gives its neighbour (lane ^ 1) a half and keeps a half: the
// fields it ends with decide its two pairs exactly as the mask's definition decides those elements.
TEST(LoraDownLayout, OneHashALaneGivesEveryElementItsOwnField) {
  std::mt19937_64 rng(11);
  for (const int64_t in : {int64_t{64}, int64_t{192}, int64_t{4096}})
    for (const float p : {0.1f, 0.5f}) {
      const uint32_t threshold = static_cast<uint32_t>(std::lround(p * 65536.0));
      const uint64_t key = rng(), mixed = mix64(key);
      const int64_t m0 = 128 * static_cast<int64_t>(rng() % 50), step_column = 64 * static_cast<int64_t>(rng() % (in / 64));
      for (int consumer = 0; consumer < 2; ++consumer)
        for (int warp = 0; warp < 4; ++warp)
          for (int kk = 0; kk < 4; ++kk)
            for (int h = 0; h < 2; ++h) {
              Halves halves[32];
              int64_t row_of[32], column_of[32];
              for (int lane = 0; lane < 32; ++lane) {
                const Pair at = fragment_pair(warp, lane, kk, 2 * h);
                row_of[lane] = m0 + 64 * consumer + at.row;
                column_of[lane] = step_column + at.column;
                const int64_t quad_g = (row_of[lane] * in + column_of[lane]) >> 2;
                const int64_t quad_g8 = ((row_of[lane] + 8) * in + column_of[lane]) >> 2;
                const bool odd = lane % 2 == 1;
                halves[lane] = split(keep_word(mixed, hashed_quad(quad_g, quad_g8, odd)), odd);
              }
              for (int lane = 0; lane < 32; ++lane) {
                const bool odd = lane % 2 == 1;
                const PairFields f = combine(halves[lane].keep, halves[lane ^ 1].give, odd);
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
    }
}

}  // namespace
}  // namespace fsdpq
