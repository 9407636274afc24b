// Next-token choice: greedy, transformers' temperature + top-p filter, and reproducible draws.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

#include "model/sampling.h"
#include "test_support.h"

namespace fsdpq {
namespace {

using test::error_of;

// The nucleus as the papers state it, computed independently of sampling.cpp: softmax(logits / T),
// then the smallest set of most likely tokens whose probability reaches top_p.
std::vector<double> reference_distribution(const std::vector<float>& logits, double temperature, double top_p) {
  std::vector<double> p(logits.size());
  double total = 0;
  for (size_t i = 0; i < logits.size(); ++i) total += p[i] = std::exp(logits[i] / temperature);
  for (double& v : p) v /= total;
  std::vector<size_t> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] > p[b]; });
  std::vector<double> kept(p.size(), 0.0);
  double sum = 0;
  for (size_t token : order) {
    if (sum >= top_p) break;
    kept[token] = p[token];
    sum += p[token];
  }
  for (double& v : kept) v /= sum;
  return kept;
}

TEST(Sampling, GreedyTakesTheArgmaxWithLowestIndexOnTies) {
  SamplingOptions greedy{0.0, 0.9, 7};
  EXPECT_EQ(sample_token({0.1f, 3.0f, -2.0f, 2.9f}, greedy, 0), 1);
  EXPECT_EQ(sample_token({1.0f, 5.0f, 5.0f, 5.0f}, greedy, 0), 1);
  EXPECT_EQ(sample_token({-INFINITY, -3.0f, -3.0f}, greedy, 0), 1);
  // The seed and step change nothing.
  for (uint64_t step = 0; step < 50; ++step)
    EXPECT_EQ(sample_token({0.5f, 0.4f, 0.5f}, SamplingOptions{0.0, 0.5, step * 31}, step), 0);
  const auto p = sampling_distribution({0.5f, 2.0f, 0.5f}, greedy);
  EXPECT_EQ(p, (std::vector<double>{0, 1, 0}));
}

TEST(Sampling, TinyTopPKeepsOnlyTheMostLikelyToken) {
  const std::vector<float> logits = {1.0f, 1.5f, 1.4f, -1.0f, 1.45f};
  for (uint64_t seed = 0; seed < 200; ++seed)
    ASSERT_EQ(sample_token(logits, SamplingOptions{1.0, 1e-9, seed}, seed % 7), 1) << seed;
  EXPECT_EQ(sampling_distribution(logits, SamplingOptions{5.0, 1e-9, 0}), (std::vector<double>{0, 1, 0, 0, 0}));
}

TEST(Sampling, FilterMatchesTheNucleusDefinition) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 1.7f, 0.0f, -3.0f, 1.0f, 0.9f};
  for (double t : {0.3, 0.7, 1.0, 2.5})
    for (double top_p : {0.05, 0.5, 0.8, 0.9, 0.95, 0.999}) {
      const auto got = sampling_distribution(logits, SamplingOptions{t, top_p, 0});
      const auto want = reference_distribution(logits, t, top_p);
      for (size_t i = 0; i < logits.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12) << "T " << t << " top_p " << top_p;
    }
  // top_p = 1 is plain softmax(logits / T): nothing filtered, -inf gets probability 0.
  const auto all = sampling_distribution({0.0f, std::log(3.0f), -INFINITY}, SamplingOptions{1.0, 1.0, 0});
  EXPECT_NEAR(all[0], 0.25, 1e-7);
  EXPECT_NEAR(all[1], 0.75, 1e-7);
  EXPECT_EQ(all[2], 0.0);
}

// Over many draws the tokens follow the filtered distribution. Pearson's chi-square over the kept
// tokens (4 kept: 3 degrees of freedom) must stay below 25, whose p-value is 2e-5; a filtered token
// must never appear. The draws are deterministic, so this passes or fails the same way every run.
TEST(Sampling, DrawsFollowTheFilteredDistribution) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 2.0f, 0.7f, -2.0f, -1.5f, 1.2f};
  const SamplingOptions base{0.8, 0.9, 0};
  const auto p = sampling_distribution(logits, base);
  const int kept = static_cast<int>(std::count_if(p.begin(), p.end(), [](double v) { return v > 0; }));
  ASSERT_EQ(kept, 4) << "the case is meant to filter some tokens";
  constexpr int kDraws = 40000;
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < kDraws; ++i) {
    SamplingOptions o = base;
    o.seed = static_cast<uint64_t>(i) * 2654435761u + 17;  // one step of many seeds
    ++counts[static_cast<size_t>(sample_token(logits, o, 3))];
  }
  double chi2 = 0;
  for (size_t t = 0; t < logits.size(); ++t) {
    if (p[t] == 0) {
      EXPECT_EQ(counts[t], 0) << "filtered token " << t << " was drawn";
      continue;
    }
    const double expected = p[t] * kDraws;
    chi2 += (counts[t] - expected) * (counts[t] - expected) / expected;
  }
  EXPECT_LT(chi2, 25.0);
  // And along the steps of one seed (what a generation does).
  std::fill(counts.begin(), counts.end(), 0);
  for (int step = 0; step < kDraws; ++step) ++counts[static_cast<size_t>(sample_token(logits, base, step))];
  chi2 = 0;
  for (size_t t = 0; t < logits.size(); ++t)
    if (p[t] > 0) chi2 += (counts[t] - p[t] * kDraws) * (counts[t] - p[t] * kDraws) / (p[t] * kDraws);
  EXPECT_LT(chi2, 25.0);
}

TEST(Sampling, SameSeedAndStepSameToken) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(std::sin(i * 0.37) * 3);
  const SamplingOptions a{1.0, 0.95, 123};
  std::vector<int32_t> first, again, other_seed;
  for (uint64_t step = 0; step < 100; ++step) {
    first.push_back(sample_token(logits, a, step));
    again.push_back(sample_token(logits, a, step));
    other_seed.push_back(sample_token(logits, SamplingOptions{1.0, 0.95, 124}, step));
  }
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other_seed);
  // Different steps of one seed differ too (the step is part of the counter).
  EXPECT_GT(std::set<int32_t>(first.begin(), first.end()).size(), 10u);
  // The uniform draw itself: pinned, and inside [0, 1).
  EXPECT_EQ(sampling_uniform(123, 5), sampling_uniform(123, 5));
  EXPECT_NE(sampling_uniform(123, 5), sampling_uniform(123, 6));
  EXPECT_NE(sampling_uniform(123, 5), sampling_uniform(124, 5));
  double mean = 0;
  for (uint64_t s = 0; s < 10000; ++s) {
    const double u = sampling_uniform(s, 0);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    mean += u / 10000;
  }
  EXPECT_NEAR(mean, 0.5, 0.015);  // standard error 0.0029
}

TEST(Sampling, BadOptionsAndLogits) {
  EXPECT_EQ(error_of([] { sample_token({1.0f}, SamplingOptions{-0.5, 0.9, 0}, 0); }),
            "--temperature -0.5: must be a number >= 0 (0 = greedy decoding)");
  EXPECT_EQ(error_of([] { sample_token({1.0f}, SamplingOptions{0.7, 0.0, 0}, 0); }),
            "--top_p 0: must be in (0, 1] (1 keeps every token)");
  EXPECT_EQ(error_of([] { sample_token({1.0f}, SamplingOptions{0.7, 1.5, 0}, 0); }),
            "--top_p 1.5: must be in (0, 1] (1 keeps every token)");
  EXPECT_EQ(error_of([] { sample_token({}, SamplingOptions{}, 0); }), "sampling: the model returned no logits");
  EXPECT_EQ(error_of([] { sample_token({1.0f, NAN}, SamplingOptions{}, 0); }),
            "sampling: the model's logits are not finite (NaN or +inf)");
  EXPECT_EQ(error_of([] { sample_token({-INFINITY, -INFINITY}, SamplingOptions{0.0, 1.0, 0}, 0); }),
            "sampling: every logit is -inf; no token can be chosen");
  // -inf logits are never drawn.
  for (uint64_t step = 0; step < 500; ++step)
    ASSERT_NE(sample_token({0.0f, -INFINITY, 0.0f}, SamplingOptions{1.0, 1.0, 9}, step), 1);
}

}  // namespace
}  // namespace fsdpq
