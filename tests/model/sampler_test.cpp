// Sampling: greedy, and temperature / top-k / top-p from a seeded generator per slot.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <vector>

#include "model/common/numerics.hpp"
#include "model/decoder/sampler.hpp"

namespace kvo::model {
namespace {

std::vector<float> logits_of(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

TEST(Sampler, GreedyTakesTheFirstMaximum) {
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f};
  Sampler s(SamplingParams{}, 1, 0);
  EXPECT_EQ(s.sample(l.data(), 4), 1);
}

TEST(Sampler, FrequenciesFollowTheDistribution) {
  const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
  Sampler s(SamplingParams{1.0f, 0, 1.0f}, 42, 0);
  std::map<int, int> counts;
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) counts[s.sample(l.data(), 4)]++;
  EXPECT_NEAR(counts[0] / double(draws), 0.5, 0.02);
  EXPECT_NEAR(counts[1] / double(draws), 0.3, 0.02);
  EXPECT_NEAR(counts[3] / double(draws), 0.05, 0.01);
}

TEST(Sampler, TopKAndTopPCutTheTail) {
  const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
  Sampler top2(SamplingParams{1.0f, 2, 1.0f}, 7, 0);
  Sampler nucleus(SamplingParams{1.0f, 0, 0.75f}, 7, 0);  // 0.5 + 0.3 reaches 0.75
  std::map<int, int> k, p;
  for (int i = 0; i < 5000; ++i) {
    k[top2.sample(l.data(), 4)]++;
    p[nucleus.sample(l.data(), 4)]++;
  }
  EXPECT_EQ(k.count(2) + k.count(3), 0u);
  EXPECT_EQ(p.count(2) + p.count(3), 0u);
  EXPECT_NEAR(k[0] / 5000.0, 0.5 / 0.8, 0.03);
  EXPECT_NEAR(p[0] / 5000.0, 0.5 / 0.8, 0.03);
}

TEST(Sampler, SeedAndSlotFixTheSequence) {
  const std::vector<float> l = logits_of({0.25, 0.25, 0.25, 0.25});
  Sampler a(SamplingParams{0.8f, 0, 1.0f}, 3, 1), b(SamplingParams{0.8f, 0, 1.0f}, 3, 1),
      other_slot(SamplingParams{0.8f, 0, 1.0f}, 3, 2);
  std::vector<int> sa, sb, so;
  for (int i = 0; i < 64; ++i) {
    sa.push_back(a.sample(l.data(), 4));
    sb.push_back(b.sample(l.data(), 4));
    so.push_back(other_slot.sample(l.data(), 4));
  }
  EXPECT_EQ(sa, sb);
  EXPECT_NE(sa, so);
  EXPECT_THROW(Sampler(SamplingParams{-1.0f, 0, 1.0f}, 1, 0), std::exception);
}

TEST(Sampler, TopKKeepsTiesAtTheCut) {
  const std::vector<float> l = {3.0f, 1.0f, 2.0f, 2.0f, 0.0f};
  std::vector<float> scratch;
  std::map<int, int> counts;
  for (int i = 0; i < 2000; ++i) {
    counts[sample_token(l.data(), 5, SamplingParams{1.0f, 2, 1.0f},
                        (static_cast<float>(i) + 0.5f) / 2000, scratch)]++;
  }
  EXPECT_EQ(counts.count(1) + counts.count(4), 0u);  // ids 2 and 3 tie at the cut: both kept
  EXPECT_GT(counts[2], 0);
  EXPECT_GT(counts[3], 0);
}

TEST(Sampler, DrawsFollowIdOrderAndTheCounter) {
  // p = 0.5, 0.3, 0.15, 0.05 by id: u picks by the running sum in id order.
  const std::vector<float> l = logits_of({0.5, 0.3, 0.15, 0.05});
  std::vector<float> scratch;
  const SamplingParams p{1.0f, 0, 1.0f};
  EXPECT_EQ(sample_token(l.data(), 4, p, 0.49f, scratch), 0);
  EXPECT_EQ(sample_token(l.data(), 4, p, 0.51f, scratch), 1);
  EXPECT_EQ(sample_token(l.data(), 4, p, 0.79f, scratch), 1);
  EXPECT_EQ(sample_token(l.data(), 4, p, 0.96f, scratch), 3);
  Sampler s(p, 11, 4);
  for (std::uint64_t d = 0; d < 32; ++d) {
    EXPECT_EQ(s.sample(l.data(), 4),
              sample_token(l.data(), 4, p, sampling_uniform(11, 4, d), scratch));
  }
  EXPECT_EQ(s.draws(), 32u);
}

}  // namespace
}  // namespace kvo::model
