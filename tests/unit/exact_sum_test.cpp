#include "train/exact_sum.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <vector>

namespace fsdpq {
namespace {

double plain_sum(const std::vector<double>& terms) {
  double s = 0;
  for (double t : terms) s += t;
  return s;
}

double exact_sum(const std::vector<double>& terms) {
  ExactSum s;
  for (double t : terms) s.add(t);
  return s.value();
}

// Batch loss sums as an evaluation adds them: thousands of tokens' losses each, a few million in all.
std::vector<double> batch_loss_sums(uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> loss(1000.0, 40000.0);
  std::vector<double> terms(300);
  for (double& t : terms) t = loss(rng);
  return terms;
}

TEST(ExactSum, OrderDoesNotChangeTheBits) {
  std::vector<double> terms = batch_loss_sums(7);
  const double first = exact_sum(terms);
  std::mt19937 rng(3);
  bool plain_differed = false;
  for (int i = 0; i < 50; ++i) {
    const double plain_before = plain_sum(terms);
    std::shuffle(terms.begin(), terms.end(), rng);
    plain_differed |= plain_sum(terms) != plain_before;
    EXPECT_EQ(std::bit_cast<uint64_t>(exact_sum(terms)), std::bit_cast<uint64_t>(first)) << "permutation " << i;
  }
  // The case the class exists for: in double, the order shows in the last bits.
  EXPECT_TRUE(plain_differed) << "these terms do not show the problem; choose others";
}

TEST(ExactSum, SplitOverRanksLikeOneRank) {
  const std::vector<double> terms = batch_loss_sums(11);
  const double one = exact_sum(terms);
  for (int ranks : {2, 3, 8}) {
    std::vector<ExactSum> parts(static_cast<size_t>(ranks));
    for (size_t i = 0; i < terms.size(); ++i) parts[i % static_cast<size_t>(ranks)].add(terms[i]);
    ExactSum reduced;  // what the all-reduce does: sum the states
    for (ExactSum& p : parts)
      for (int k = 0; k < ExactSum::kValues; ++k) reduced.data()[k] += p.data()[k];
    EXPECT_EQ(std::bit_cast<uint64_t>(reduced.value()), std::bit_cast<uint64_t>(one)) << ranks << " ranks";
  }
}

TEST(ExactSum, CloseToTheTrueSum) {
  const std::vector<double> terms = {0.1, 0.2, 12345.678901234, 1e-12, -3.25};
  long double truth = 0;
  for (double t : terms) truth += t;
  EXPECT_NEAR(exact_sum(terms), static_cast<double>(truth), terms.size() * std::ldexp(1.0, -33));
  EXPECT_EQ(exact_sum({}), 0.0);
}

TEST(ExactSum, NotFiniteIsNaNAndTooLargeThrows) {
  EXPECT_TRUE(std::isnan(exact_sum({1.0, INFINITY, 2.0})));
  EXPECT_TRUE(std::isnan(exact_sum({std::nan("")})));
  ExactSum s;
  EXPECT_THROW(s.add(3e9), std::overflow_error);
}

}  // namespace
}  // namespace fsdpq
