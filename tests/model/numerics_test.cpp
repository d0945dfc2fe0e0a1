// The __host__ __device__ arithmetic the kernels share with the host path, checked on the CPU
// against references computed independently in double precision.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/common/numerics.hpp"
#include "model/common/rope.hpp"
#include "rounding.hpp"

namespace kvo::model {
namespace {

// The bounds below are derived from float32's unit roundoff and gamma_n (rounding.hpp), operation
// by operation, and do not depend on the machine: libm's expf, sinf, cosf and powf are taken to
// 2 ulp (4u relative), correctly rounded basic operations to u.
using testing::gamma;
using testing::kU;

// The nearest value of a format with `mantissa` stored bits to x, ties to even, by brute
// force over the two neighbours (x normal, in range).
double nearest(double x, int mantissa) {
  int exponent = 0;
  std::frexp(x, &exponent);
  const double ulp = std::ldexp(1.0, exponent - 1 - mantissa);
  const double below = std::floor(x / ulp) * ulp;
  const double above = below + ulp;
  if (x - below < above - x) return below;
  if (above - x < x - below) return above;
  return std::fmod(below / ulp, 2.0) == 0 ? below : above;
}

TEST(Numerics, Bf16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(1.00390625f), 0x3f80);  // halfway, to even
  EXPECT_EQ(float_to_bf16(1.01171875f), 0x3f82);  // halfway, to even
  EXPECT_EQ(float_to_bf16(-2.0f), 0xc000);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = dist(rng);
    if (x == 0) continue;
    EXPECT_EQ(static_cast<double>(bf16_to_float(float_to_bf16(x))), nearest(x, 7)) << x;
  }
}

TEST(Numerics, F16RoundsToNearestEvenAndRoundTrips) {
  for (std::uint32_t h = 0; h < 65536; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float x = f16_to_float(bits);
    if (std::isnan(x)) continue;
    EXPECT_EQ(float_to_f16(x), bits) << h;
  }
  EXPECT_EQ(f16_to_float(0x3c00), 1.0f);
  EXPECT_EQ(f16_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(float_to_f16(65520.0f), 0x7c00);               // rounds to infinity
  EXPECT_EQ(float_to_f16(std::ldexp(1.0f, -25)), 0x0000);  // half the smallest: to even (0)
  EXPECT_EQ(float_to_f16(std::ldexp(3.0f, -25)), 0x0002);  // 1.5 ulp: to even (2)
  EXPECT_EQ(f16_to_float(0x0001), std::ldexp(1.0f, -24));
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-60000.0f, 60000.0f);
  for (int i = 0; i < 100000; ++i) {
    const float x = dist(rng);
    if (std::fabs(x) < 6.2e-5f) continue;
    EXPECT_EQ(static_cast<double>(f16_to_float(float_to_f16(x))), nearest(x, 10)) << x;
  }
}

TEST(Numerics, Llama3RopeScalingMatchesTheFormula) {
  const int head_dim = 128;
  const double theta = 500000.0;
  RopeScaling s;
  s.type = RopeType::kLlama3;
  s.factor = 8;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position = 8192;
  const std::vector<float> llama3 =
      rope_table(s, static_cast<float>(theta), head_dim, 131072, 0).inv_freq;
  const std::vector<float> plain =
      rope_table(RopeScaling{}, static_cast<float>(theta), head_dim, 131072, 0).inv_freq;
  int scaled = 0, kept = 0, smoothed = 0;
  for (int i = 0; i < head_dim / 2; ++i) {
    const double inv = 1.0 / std::pow(theta, 2.0 * i / head_dim);
    const double wavelen = 2 * M_PI / inv;
    double expected = inv;
    bool in_smoothed_band = false;
    if (wavelen > 8192.0 / 1.0) {
      expected = inv / 8, ++scaled;
    } else if (wavelen >= 8192.0 / 4.0) {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      expected = (1 - smooth) * inv / 8 + smooth * inv, ++smoothed;
      in_smoothed_band = true;
    } else {
      ++kept;
    }
    // powf to 4u and a divide: 5u for the unscaled frequency (2i / head_dim is exact), one more
    // divide for the scaled band. The smoothed band also computes the wavelength (2 more
    // operations, so the frequency's 5u become 8u in it) and smooth = (original / wavelength
    // - 1) / 3, whose error is at most (original / wavelength) 10u / 3 <= 14u absolute (the
    // ratio is at most 4); smooth weighs 7/8 of inv against at least inv / 8 of the result: 98u,
    // and the blend's 4 operations: 4u; 112u in all, relative to the result.
    const double bound = (in_smoothed_band ? 112 : 6) * kU;
    EXPECT_NEAR(llama3[static_cast<std::size_t>(i)], expected, bound * expected) << i;
    EXPECT_NEAR(plain[static_cast<std::size_t>(i)], inv, 5 * kU * inv);
  }
  EXPECT_GT(scaled, 0);
  EXPECT_GT(kept, 0);
  EXPECT_GT(smoothed, 0);
}

TEST(Numerics, RopeRotatesPairsLikeRotateHalf) {
  const int d = 16;
  std::vector<float> inv(d / 2), x(d);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist;
  inv = rope_table(RopeScaling{}, 10000.0f, d, 4096, 0).inv_freq;
  for (auto& v : x) v = dist(rng);
  std::vector<float> y = x;
  const int pos = 37;
  rope_rotate(y.data(), d, inv.data(), pos);
  for (int i = 0; i < d / 2; ++i) {
    const double a = pos * static_cast<double>(inv[i]);
    const double xa = std::fabs(x[i]), xb = std::fabs(x[i + d / 2]);
    // The float angle pos * inv is off by u |a|, cosf and sinf by 4u more (|cos|, |sin| <= 1),
    // so each of cos and sin by u (|a| + 4); then two products and a sum: 3u of |x c| + |x' s|.
    const double bound = (xa + xb) * kU * (std::fabs(a) + 4) + 3 * kU * (xa + xb);
    EXPECT_NEAR(y[i], x[i] * std::cos(a) - x[i + d / 2] * std::sin(a), bound);
    EXPECT_NEAR(y[i + d / 2], x[i + d / 2] * std::cos(a) + x[i] * std::sin(a), bound);
  }
}

TEST(Numerics, SoftmaxMergeEqualsOneSoftmax) {
  std::mt19937 rng(4);
  std::normal_distribution<float> dist(0, 5);
  const int n = 100, d = 4;
  std::vector<float> score(n), value(n * d);
  for (auto& s : score) s = dist(rng);
  for (auto& v : value) v = dist(rng);
  // Reference in double, and the float32 bound: each weight exp(s - m) is off by
  // u (|s - m| + 4) + 4u relative (the argument's rounding, expf, and at most two merge factors
  // of the same form, taken as 4u each); the weighted sums and the normalising sum take
  // gamma_n, each merge two more operations, the final divide u.
  double m = -INFINITY, sum = 0;
  for (float s : score) m = std::max(m, static_cast<double>(s));
  std::vector<double> expected(d, 0), bound(d, 0);
  for (int j = 0; j < n; ++j) {
    const double p = std::exp(score[j] - m);
    sum += p;
    const double weight_error = kU * (std::fabs(score[j] - m) + 16) + gamma(n + 6);
    for (int e = 0; e < d; ++e) {
      expected[e] += p * value[j * d + e];
      bound[e] += p * std::fabs(value[j * d + e]) * 2 * weight_error;  // numerator and sum
    }
  }
  // Three partial ranges, one empty, merged.
  const int cuts[] = {0, 30, 30, n};
  SoftmaxState total;
  std::vector<float> acc(d, 0);
  for (int part = 0; part < 3; ++part) {
    SoftmaxState st;
    std::vector<float> partial(d, 0);
    for (int j = cuts[part]; j < cuts[part + 1]; ++j) st.max = std::max(st.max, score[j]);
    for (int j = cuts[part]; j < cuts[part + 1]; ++j) {
      const float p = std::exp(score[j] - st.max);
      st.sum += p;
      for (int e = 0; e < d; ++e) partial[e] += p * value[j * d + e];
    }
    const MergeScales k = softmax_merge(total, st);
    for (int e = 0; e < d; ++e) acc[e] = acc[e] * k.a + partial[e] * k.b;
  }
  for (int e = 0; e < d; ++e) {
    EXPECT_NEAR(acc[e] / total.sum, expected[e] / sum,
                bound[e] / sum + kU * std::fabs(expected[e] / sum));
  }
}

TEST(Numerics, SeededUniformIsInRangeAndCentred) {
  double sum = 0;
  float lo = 1, hi = -1;
  for (int i = 0; i < 100000; ++i) {
    const float u = seeded_uniform(7, 3, static_cast<std::uint64_t>(i));
    lo = std::min(lo, u);
    hi = std::max(hi, u);
    sum += u;
  }
  EXPECT_GE(lo, -1.0f);
  EXPECT_LT(hi, 1.0f);
  EXPECT_LT(lo, -0.999f);
  EXPECT_GT(hi, 0.999f);
  EXPECT_NEAR(sum / 100000, 0.0, 0.01);
  EXPECT_NE(seeded_uniform(7, 3, 0), seeded_uniform(8, 3, 0));
  EXPECT_NE(seeded_uniform(7, 3, 0), seeded_uniform(7, 4, 0));
}

// The blocked prefill attention's step: scores in blocks, some keys masked (whole blocks too),
// rescaled as each block raises the max, give the softmax-weighted sum of one pass in double.
TEST(Numerics, SoftmaxBlockRescaleEqualsOneSoftmax) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  const int keys = 50;
  const int block = 8;
  std::vector<float> score(keys), value(keys);
  std::vector<bool> masked(keys);
  for (int j = 0; j < keys; ++j) {
    score[j] = normal(rng);
    value[j] = normal(rng);
    masked[j] = j < 11 || j % 7 == 3;  // the first block and a bit of the second all masked
  }
  double top = -INFINITY;
  for (int j = 0; j < keys; ++j) {
    if (!masked[j]) top = std::max(top, static_cast<double>(score[j]));
  }
  // The float32 bound, as in SoftmaxMergeEqualsOneSoftmax: each weight off by
  // u (|s - top| + 4) for its argument and expf, and 4u per rescale it went through (at most one
  // per block); the sums take gamma_keys.
  const int blocks = (keys + block - 1) / block;
  double num = 0, den = 0, num_bound = 0, den_bound = 0;
  for (int j = 0; j < keys; ++j) {
    if (masked[j]) continue;
    const double w = std::exp(score[j] - top);
    const double weight_error =
        kU * (std::fabs(score[j] - top) + 4 + 4 * blocks) + gamma(keys + blocks);
    num += w * value[j];
    den += w;
    num_bound += w * std::fabs(value[j]) * weight_error;
    den_bound += w * weight_error;
  }
  SoftmaxState state;
  float acc = 12345.0f;  // garbage before the first key: must be dropped, not scaled
  for (int k0 = 0; k0 < keys; k0 += block) {
    float block_max = -INFINITY;
    for (int j = k0; j < std::min(keys, k0 + block); ++j) {
      if (!masked[j]) block_max = std::max(block_max, score[j]);
    }
    const float factor = softmax_block_rescale(state, block_max);
    float sum = 0, weighted = 0;
    for (int j = k0; j < std::min(keys, k0 + block); ++j) {
      const float p = masked[j] || state.max == -INFINITY ? 0.0f : std::exp(score[j] - state.max);
      sum += p;
      weighted += p * value[j];
    }
    acc = (factor == 0 ? 0.0f : acc * factor) + weighted;
    state.sum = state.sum * factor + sum;
  }
  EXPECT_FLOAT_EQ(state.max, static_cast<float>(top));
  EXPECT_NEAR(state.sum, den, den_bound);
  EXPECT_NEAR(acc / state.sum, num / den,
              (num_bound + std::fabs(num / den) * den_bound) / den + kU * std::fabs(num / den));
}

TEST(Numerics, SoftmaxBlockRescaleBeforeAnyKey) {
  SoftmaxState state;
  EXPECT_EQ(softmax_block_rescale(state, -INFINITY), 0.0f);  // still nothing seen
  EXPECT_EQ(state.max, -INFINITY);
  EXPECT_EQ(softmax_block_rescale(state, 2.0f), 0.0f);  // first keys: start from zero
  EXPECT_EQ(state.max, 2.0f);
  EXPECT_EQ(softmax_block_rescale(state, 1.0f), 1.0f);  // lower block: max kept
  EXPECT_EQ(softmax_block_rescale(state, -INFINITY), 1.0f);
  EXPECT_FLOAT_EQ(softmax_block_rescale(state, 3.0f), std::exp(-1.0f));
  EXPECT_EQ(state.max, 3.0f);
}

TEST(Numerics, OrderKeyKeepsTheOrderOfFloats) {
  const std::vector<float> sorted = {-INFINITY, -1e30f, -2.5f, -1e-40f, 0.0f,
                                     1e-40f,    1.0f,   1.5f,  3e38f,   INFINITY};
  for (std::size_t i = 1; i < sorted.size(); ++i) {
    EXPECT_LT(order_key(sorted[i - 1]), order_key(sorted[i])) << sorted[i];
  }
  EXPECT_EQ(order_key(-0.0f), order_key(0.0f));
}

TEST(Numerics, SamplingUniformIsACounterBasedDraw) {
  double sum = 0;
  const int n = 20000;
  for (int d = 0; d < n; ++d) {
    const float u = sampling_uniform(9, 2, static_cast<std::uint64_t>(d));
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 0.01);
  EXPECT_EQ(sampling_uniform(9, 2, 17), sampling_uniform(9, 2, 17));
  EXPECT_NE(sampling_uniform(9, 2, 17), sampling_uniform(9, 3, 17));
  EXPECT_NE(sampling_uniform(9, 2, 17), sampling_uniform(10, 2, 17));
}

}  // namespace
}  // namespace kvo::model
