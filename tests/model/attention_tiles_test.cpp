// Attention over a quantized cache's bf16 tiles (model/cuda/attention_kernels.hpp: key_tiles, and
// lse_merge in model/decoder/numerics.hpp), checked on the CPU: the tiles cover a chunk's keys
// exactly, and attention computed tile by tile the way the CUDA path runs FlashInfer over them (the
// queries' own tile with a causal mask aligned to the bottom right and the window relative to
// each query, the tiles before it unmasked, each returning its normalized output and its
// log-sum-exp in log2 units of scaled scores) and merged in any order equals attention over all
// the keys at once. What this cannot check, FlashInfer's own kernels, the GPU tests do
// (cuda_attention_test.cpp).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "model/common/numerics.hpp"
#include "model/cuda/attention_kernels.hpp"

namespace kvo::model {
namespace {

constexpr double kLog2e = 1.4426950408889634;

// FlashInfer's single prefill (SinglePrefillWithKVCacheDispatched) as it computes: n query rows
// over kv_len keys; with the causal mask aligned to the bottom right, row i sits at key
// position kv_len - n + i, sees keys up to it and, with window_left >= 0, none before that
// position - window_left; unmasked, every key. Outputs are normalized; lse is log2 of the sum
// of 2^(score * scale * log2 e).
void flashinfer_prefill(const std::vector<float>& q, int n, const float* k, const float* v,
                        int kv_len, int d, bool causal, int window_left, float scale,
                        std::vector<float>& out, std::vector<float>& lse) {
  out.assign(static_cast<std::size_t>(n) * d, 0.0f);
  lse.assign(static_cast<std::size_t>(n), -INFINITY);
  for (int i = 0; i < n; ++i) {
    const int pos = kv_len - n + i;
    int lo = 0, hi = kv_len;  // visible keys [lo, hi)
    if (causal) {
      hi = pos + 1;
      if (window_left >= 0) lo = std::max(0, pos - window_left);
    }
    std::vector<double> s(static_cast<std::size_t>(kv_len), -INFINITY);
    double m = -INFINITY;
    for (int j = lo; j < hi; ++j) {
      double dot = 0;
      for (int e = 0; e < d; ++e) dot += static_cast<double>(q[i * d + e]) * k[j * d + e];
      s[j] = dot * scale * kLog2e;
      m = std::max(m, s[j]);
    }
    if (hi <= lo) continue;
    double sum = 0;
    for (int j = lo; j < hi; ++j) sum += std::exp2(s[j] - m);
    const double l = m + std::log2(sum);
    lse[i] = static_cast<float>(l);
    for (int e = 0; e < d; ++e) {
      double o = 0;
      for (int j = lo; j < hi; ++j) o += std::exp2(s[j] - l) * v[j * d + e];
      out[i * d + e] = static_cast<float>(o);
    }
  }
}

// What model/cuda/flashinfer_attention.cuh's run_prefill hands FlashInfer for a PrefillCall over
// the keys at k, v: causal, the keys from the first row's window on (first_position - window_left)
// to first_position + n; unmasked, keys [0, keys).
void prefill_call(const std::vector<float>& q, int n, const float* k, const float* v, int d,
                  bool causal, int first_position, int keys, int window_left, float scale,
                  std::vector<float>& out, std::vector<float>& lse) {
  if (!causal) {
    flashinfer_prefill(q, n, k, v, keys, d, false, -1, scale, out, lse);
    return;
  }
  const int first_key = window_left >= 0 ? std::max(0, first_position - window_left) : 0;
  flashinfer_prefill(q, n, k + first_key * d, v + first_key * d, first_position + n - first_key, d,
                     true, window_left, scale, out, lse);
}

TEST(KeyTiles, CoverTheChunksKeysOnceAndEndWithTheCausalTile) {
  std::mt19937 rng(1);
  for (int trial = 0; trial < 2000; ++trial) {
    const int tile = std::uniform_int_distribution<int>(1, 64)(rng);
    const int n = std::uniform_int_distribution<int>(1, tile)(rng);
    const int first_position = std::uniform_int_distribution<int>(0, 300)(rng);
    const int first_key = std::uniform_int_distribution<int>(0, first_position)(rng);
    const std::vector<KeyTile> tiles = key_tiles(first_key, first_position, n, tile);
    ASSERT_FALSE(tiles.empty());
    EXPECT_TRUE(tiles.front().causal);
    EXPECT_EQ(tiles.front().end, first_position + n);
    EXPECT_LE(tiles.front().begin, first_position);  // the queries' keys are all in it
    EXPECT_EQ(tiles.back().begin, first_key);
    for (std::size_t i = 0; i < tiles.size(); ++i) {
      EXPECT_LT(tiles[i].begin, tiles[i].end);
      EXPECT_LE(tiles[i].end - tiles[i].begin, tile);
      if (i > 0) {
        EXPECT_FALSE(tiles[i].causal);
        EXPECT_EQ(tiles[i].end, tiles[i - 1].begin);
        if (i + 1 < tiles.size()) {
          EXPECT_EQ(tiles[i].end - tiles[i].begin, tile);
        }
      }
    }
  }
}

TEST(KeyTiles, MergedTilesAreAttentionOverEveryKey) {
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int d = 16;
  for (int trial = 0; trial < 300; ++trial) {
    const int window = trial % 3 == 0 ? std::uniform_int_distribution<int>(1, 40)(rng) : 0;
    const int window_left = window > 0 ? window - 1 : -1;
    const int n = std::uniform_int_distribution<int>(1, 24)(rng);
    const int first_position = std::uniform_int_distribution<int>(0, 200)(rng);
    // As choose_attention_kernels sizes it: a chunk, and the window before it.
    const int tile = std::uniform_int_distribution<int>(n, 48)(rng) + std::max(0, window_left);
    const int total = first_position + n;
    std::vector<float> q(static_cast<std::size_t>(n) * d), k(static_cast<std::size_t>(total) * d),
        v(k.size());
    for (float& x : q) x = normal(rng);
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    const float scale = 0.25f;
    // All the keys at once.
    std::vector<float> expected, expected_lse;
    prefill_call(q, n, k.data(), v.data(), d, true, first_position, 0, window_left, scale, expected,
                 expected_lse);
    // Tile by tile, merged in the order key_tiles gives and in reverse.
    const int first_key =
        window > 0 ? std::max(0, first_position - window_left) : 0;  // first_key(c, position)
    std::vector<KeyTile> tiles = key_tiles(first_key, first_position, n, tile);
    for (bool reversed : {false, true}) {
      if (reversed) std::reverse(tiles.begin(), tiles.end());
      std::vector<float> out(expected.size()), lse(static_cast<std::size_t>(n), -INFINITY);
      std::vector<float> o, l;
      for (std::size_t t = 0; t < tiles.size(); ++t) {
        const KeyTile& kt = tiles[t];
        // As CudaOps::attend_tiles calls it: the tile's keys at its start.
        prefill_call(q, n, k.data() + kt.begin * d, v.data() + kt.begin * d, d, kt.causal,
                     first_position - kt.begin, kt.end - kt.begin, kt.causal ? window_left : -1,
                     scale, o, l);
        for (int i = 0; i < n; ++i) {
          const LseMerge m = t == 0 ? LseMerge{0.0f, 1.0f, l[i]} : lse_merge(lse[i], l[i]);
          for (int e = 0; e < d; ++e) {
            float& x = out[i * d + e];
            x = t == 0 ? o[i * d + e] : m.keep * x + m.take * o[i * d + e];
          }
          lse[i] = m.lse;
        }
      }
      // Each tile's output and log-sum-exp are rounded to f32 once, and each merge rounds a
      // few times more: its weights (exp2f, a division: 2 ulp each) and keep x + take o (2 u):
      // at most 8 u of max |v| (the outputs are weighted means of v) and of |lse| + 1 (log2f's
      // error is absolute near 0) per tile.
      double v_max = 0;
      for (float x : v) v_max = std::max(v_max, static_cast<double>(std::fabs(x)));
      const double u = 0x1p-24;
      const double per_tile = 8.0 * u * static_cast<double>(tiles.size());
      for (int i = 0; i < n; ++i) {
        ASSERT_NEAR(lse[i], expected_lse[i], per_tile * (std::fabs(expected_lse[i]) + 1))
            << "trial " << trial << " row " << i;
        for (int e = 0; e < d; ++e) {
          ASSERT_NEAR(out[i * d + e], expected[i * d + e], per_tile * v_max)
              << "trial " << trial << " row " << i << " reversed " << reversed;
        }
      }
    }
  }
}

// The merge's own arithmetic: -inf is "no keys", and two halves give the whole.
TEST(LseMerge, NoKeysAndTwoHalves) {
  const LseMerge empty = lse_merge(-INFINITY, 3.0f);
  EXPECT_EQ(empty.keep, 0.0f);
  EXPECT_EQ(empty.take, 1.0f);
  EXPECT_EQ(empty.lse, 3.0f);
  const LseMerge none = lse_merge(2.0f, -INFINITY);
  EXPECT_EQ(none.keep, 1.0f);
  EXPECT_EQ(none.take, 0.0f);
  // Equal halves: each weighs one half, and the sum doubles (one more in log2).
  const LseMerge halves = lse_merge(5.0f, 5.0f);
  EXPECT_EQ(halves.keep, 0.5f);
  EXPECT_EQ(halves.take, 0.5f);
  EXPECT_FLOAT_EQ(halves.lse, 6.0f);
  // Far apart: the larger takes (nearly) all, and no overflow.
  const LseMerge far = lse_merge(-200.0f, 300.0f);
  EXPECT_EQ(far.keep, 0.0f);
  EXPECT_EQ(far.take, 1.0f);
  EXPECT_EQ(far.lse, 300.0f);
}

}  // namespace
}  // namespace kvo::model
