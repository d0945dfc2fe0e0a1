// Exact bytes: each decode step moves every streamed layer's valid prefix host->device, and
// only the appended rows device->host; an all-resident cache moves nothing; nothing is
// allocated on the device after construction.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "kvoffload/quant.hpp"

namespace kvo {
namespace {

CacheConfig small(int layers, int resident, int ring) {
  CacheConfig config;
  config.layers = layers;
  config.kv_heads = 2;
  config.head_dim = 16;
  config.max_seq = 128;
  config.slots = 3;
  config.dtype = DType::kF16;
  config.resident_layers = resident;
  config.ring_depth = ring;
  config.backend = BackendKind::kHost;
  config.host.max_delay_us = 20;
  return config;
}

// Runs one step appending n[s] rows (of one repeated byte) per slot to every layer; with
// `split`, split attention at those rows.
void step(OffloadedStaticCache& cache, const std::vector<std::int32_t>& n,
          const std::vector<std::int32_t>* split = nullptr) {
  const CacheConfig& c = cache.config();
  const std::vector<std::uint8_t> rows(
      static_cast<std::size_t>(c.max_seq) * kv_row_bytes(c.dtype, c.kv_heads, c.head_dim), 0x5a);
  if (split != nullptr) {
    cache.begin_step(n, *split);
  } else {
    cache.begin_step(n);
  }
  for (int layer = 0; layer < c.layers; ++layer) {
    cache.acquire(layer);
    for (int s = 0; s < c.slots; ++s) {
      cache.append(layer, s, rows.data(), rows.data(), n[static_cast<std::size_t>(s)]);
    }
    cache.release(layer);
  }
  cache.end_step();
}

std::uint64_t total_length(const OffloadedStaticCache& cache) {
  std::uint64_t total = 0;
  for (int s = 0; s < cache.config().slots; ++s) total += cache.length(s);
  return total;
}

struct Shape {
  int layers;
  int resident;
  int ring;
};

class DecodeBytes : public ::testing::TestWithParam<Shape> {};

TEST_P(DecodeBytes, EachStepMovesExactlyThePrefixAndTheNewRows) {
  const Shape shape = GetParam();
  OffloadedStaticCache cache(small(shape.layers, shape.resident, shape.ring));
  const CachePlan& plan = cache.stats().plan;
  const std::uint64_t row = 2 * 16 * 2;
  ASSERT_EQ(plan.row_bytes, row);
  const std::uint64_t streamed = static_cast<std::uint64_t>(plan.streamed_layers);
  ASSERT_EQ(streamed, static_cast<std::uint64_t>(shape.layers - shape.resident));
  const std::uint64_t allocations = cache.stats().device_allocations;
  EXPECT_EQ(allocations, 1u);  // one arena

  std::mt19937 rng(static_cast<unsigned>(shape.layers * 31 + shape.resident * 7 + shape.ring));
  step(cache, {17, 5, 0});                           // prefill of different lengths; slot 2 idle
  EXPECT_EQ(cache.stats().h2d_bytes_last_step, 0u);  // nothing valid on the host yet
  EXPECT_EQ(cache.stats().d2h_bytes_last_step, 2 * streamed * (17 + 5) * row);

  for (int i = 0; i < 25; ++i) {
    std::vector<std::int32_t> n = {1, 1, static_cast<std::int32_t>(rng() % 2)};
    if (i % 9 == 4) n = {6, 0, 3};  // a chunk of prompt among the decodes
    const std::uint64_t before = total_length(cache);
    const std::uint64_t added = static_cast<std::uint64_t>(std::accumulate(n.begin(), n.end(), 0));
    step(cache, n);
    const CacheStats st = cache.stats();
    EXPECT_EQ(st.h2d_bytes_last_step, 2 * streamed * before * row) << "step " << i;
    EXPECT_EQ(st.d2h_bytes_last_step, 2 * streamed * added * row) << "step " << i;
  }
  EXPECT_EQ(cache.stats().device_allocations, allocations);  // nothing allocated after setup
}

INSTANTIATE_TEST_SUITE_P(Shapes, DecodeBytes,
                         ::testing::Values(Shape{6, 0, 2}, Shape{6, 2, 2}, Shape{7, 0, 3},
                                           Shape{9, 3, 3}, Shape{4, 0, 1}));

// Quantized rows move with their scales: at the Llama-3-8B head shape (8 kv heads of 128) a row
// is 8 x 128 bytes and 8 f32 scales, 1056 bytes against bf16's 2048, in every step's prefetches
// and write-backs alike.
TEST(Bytes, QuantizedRowsMoveTheirScalesAndHalfTheBytesOfBf16) {
  std::uint64_t bf16_h2d = 0;
  for (DType dtype : {DType::kBF16, DType::kFP8E4M3, DType::kInt8}) {
    CacheConfig c = small(5, 1, 2);
    c.kv_heads = 8;
    c.head_dim = 128;
    c.max_seq = 64;
    c.slots = 2;
    c.dtype = dtype;
    OffloadedStaticCache cache(c);
    const std::uint64_t row = is_quantized(dtype) ? 8 * 128 + 8 * 4 : 8 * 128 * 2;
    ASSERT_EQ(cache.stats().plan.row_bytes, row) << dtype_name(dtype);
    std::uint64_t length = 0;
    for (const std::vector<std::int32_t>& n :
         std::vector<std::vector<std::int32_t>>{{20, 9}, {1, 1}, {1, 0}, {3, 1}, {1, 1}}) {
      step(cache, n);
      const CacheStats st = cache.stats();
      EXPECT_EQ(st.h2d_bytes_last_step, 2 * 4 * length * row) << dtype_name(dtype);
      const auto added = static_cast<std::uint64_t>(n[0] + n[1]);
      EXPECT_EQ(st.d2h_bytes_last_step, 2 * 4 * added * row) << dtype_name(dtype);
      length += added;
    }
    const std::uint64_t h2d = cache.stats().h2d_bytes_last_step;
    if (dtype == DType::kBF16) {
      bf16_h2d = h2d;
    } else {
      EXPECT_LE(static_cast<double>(h2d), 0.53 * static_cast<double>(bf16_h2d));
      EXPECT_EQ(h2d * 2048, bf16_h2d * 1056);
    }
  }
}

TEST(Bytes, AllResidentMovesNothing) {
  OffloadedStaticCache cache(small(5, 5, 2));
  step(cache, {40, 3, 9});
  for (int i = 0; i < 10; ++i) step(cache, {1, 1, 1});
  const CacheStats st = cache.stats();
  EXPECT_EQ(st.plan.streamed_layers, 0);
  EXPECT_EQ(st.plan.host_bytes, 0u);
  EXPECT_EQ(st.h2d_bytes_total, 0u);
  EXPECT_EQ(st.d2h_bytes_total, 0u);
}

TEST(Bytes, StreamedLayersThatFitTheRingStayThereAndMoveNothing) {
  // 2 streamed layers and a ring of 2: every layer is kept resident.
  OffloadedStaticCache cache(small(6, 4, 2));
  EXPECT_EQ(cache.stats().plan.resident_layers, 6);
  EXPECT_EQ(cache.stats().plan.ring_depth, 0);
  EXPECT_EQ(cache.stats().plan.device_bytes, 6 * cache.stats().plan.layer_bytes);
  step(cache, {12, 12, 12});
  step(cache, {1, 1, 1});
  EXPECT_EQ(cache.stats().h2d_bytes_total, 0u);
  EXPECT_EQ(cache.stats().d2h_bytes_total, 0u);
}

TEST(Bytes, TotalsAddUpOverSteps) {
  OffloadedStaticCache cache(small(6, 1, 2));
  std::uint64_t h2d = 0, d2h = 0;
  step(cache, {30, 20, 10});
  d2h += cache.stats().d2h_bytes_last_step;
  h2d += cache.stats().h2d_bytes_last_step;
  for (int i = 0; i < 6; ++i) {
    step(cache, {1, 1, 1});
    h2d += cache.stats().h2d_bytes_last_step;
    d2h += cache.stats().d2h_bytes_last_step;
  }
  cache.synchronize();
  const CacheStats st = cache.stats();
  EXPECT_EQ(st.d2h_bytes_total, d2h);
  // The total also holds the prefetches already made for the next step: its first D layers.
  const std::uint64_t next = 2 * 2 * total_length(cache) * st.plan.row_bytes;
  EXPECT_EQ(st.h2d_bytes_total, h2d + next);
  EXPECT_EQ(st.steps, 7u);
}

// A reset or truncation between steps re-issues what was prefetched at the old length, so the
// next step moves exactly its new prefixes.
TEST(Bytes, ResetAndTruncateReissueWhatWasPrefetched) {
  OffloadedStaticCache cache(small(6, 1, 2));
  const std::uint64_t row = cache.stats().plan.row_bytes;
  step(cache, {40, 30, 20});
  step(cache, {1, 1, 1});
  cache.reset_slot(0);
  cache.truncate_slot(1, 5);
  cache.truncate_slot(2, 21);                      // no change
  EXPECT_EQ(cache.stats().prefetch_reissues, 2u);  // the ring's 2 buffers, once
  step(cache, {1, 1, 1});
  EXPECT_EQ(cache.stats().h2d_bytes_last_step, 2 * 5 * (0 + 5 + 21) * row);
  cache.reset_slot(2);
  cache.reset_slot(2);  // already empty: nothing more to re-issue
  EXPECT_EQ(cache.stats().prefetch_reissues, 4u);
  step(cache, {1, 1, 1});
  EXPECT_EQ(cache.stats().h2d_bytes_last_step, 2 * 5 * (1 + 6 + 0) * row);
}

// Split attention: a decode step moves each streamed layer's rows past the split alone, to the
// byte, once the prefetches made during the step before knew the split (the same rows given
// again, or the config's); a smaller split than they guessed gets the rows between, so the step
// still moves exactly its tails; a larger one moves what was prefetched already; a prefill
// step after a split gets whole prefixes.
TEST(Bytes, ASplitStepMovesTheRowsPastItsSplitAlone) {
  OffloadedStaticCache cache(small(6, 1, 2));  // 5 streamed layers, a ring of 2
  const std::uint64_t row = cache.stats().plan.row_bytes;
  const std::uint64_t streamed = 5, depth = 2;
  const auto tails = [&](const std::vector<std::int32_t>& split) {
    std::uint64_t rows = 0;
    for (int s = 0; s < 3; ++s) {
      rows += static_cast<std::uint64_t>(cache.length(s) - split[static_cast<std::size_t>(s)]);
    }
    return 2 * row * rows;
  };
  step(cache, {40, 30, 20});
  const std::vector<std::int32_t> ten = {10, 0, 20}, five = {5, 0, 20}, thirty = {30, 0, 20};
  // The first 2 layers were prefetched whole during the prefill; the other 3 move their tails.
  const std::uint64_t whole = 2 * row * (40 + 30 + 20);
  std::uint64_t expected = depth * whole + (streamed - depth) * tails(ten);
  step(cache, {1, 1, 1}, &ten);
  EXPECT_EQ(cache.stats().h2d_bytes_last_step, expected);
  expected = streamed * tails(ten);  // every layer: its tails, prefetched as the split guessed
  step(cache, {1, 1, 1}, &ten);
  EXPECT_EQ(cache.stats().h2d_bytes_last_step, expected);
  expected = streamed * tails(five);  // rows [5, 10) of slot 0 come before the first 2 layers
  step(cache, {1, 1, 1}, &five);
  EXPECT_EQ(cache.stats().h2d_bytes_last_step, expected);
  // A larger split than guessed: the first 2 layers hold rows from 5 already.
  expected = depth * tails(five) + (streamed - depth) * tails(thirty);
  step(cache, {1, 1, 1}, &thirty);
  EXPECT_EQ(cache.stats().h2d_bytes_last_step, expected);
  std::uint64_t prefixes = 0;
  for (int s = 0; s < 3; ++s) prefixes += static_cast<std::uint64_t>(cache.length(s));
  step(cache, {6, 0, 3});  // a chunk of prompt: no split, whole prefixes (idle slot 1 too)
  EXPECT_EQ(cache.stats().h2d_bytes_last_step, streamed * 2 * row * prefixes);
  EXPECT_EQ(cache.stats().prefetch_reissues, 0u);

  // Planned by the config: 64 rows stay on the host once a slot holds more.
  CacheConfig planned = small(6, 1, 2);
  planned.split.mode = SplitMode::kRows;
  planned.split.rows = 64;
  OffloadedStaticCache by_config(planned);
  step(by_config, {90, 70, 10});
  step(by_config, {1, 1, 1});  // prefetched whole for the first 2 layers during the prefill
  for (int i = 0; i < 3; ++i) {
    std::uint64_t rows = 0;
    for (int s = 0; s < 3; ++s) {
      const int len = by_config.length(s);
      rows += static_cast<std::uint64_t>(len - split_rows(planned.split, len));
    }
    step(by_config, {1, 1, 1});
    EXPECT_EQ(by_config.stats().h2d_bytes_last_step, streamed * 2 * row * rows) << "step " << i;
  }
  EXPECT_EQ(split_rows(planned.split, 91), 64);
  EXPECT_EQ(split_rows(planned.split, 11), 11);  // fewer rows than the split: all on the host
}

// Keys and values of different head sizes (multi-head latent attention caches a wide K and a
// narrow V): each tensor keeps its own row size everywhere, in the views, in what is staged and
// written back, and in the plan. K rows of 2 x 24 and V rows of 2 x 8 f16 elements; every layer
// streamed but the first, copies delayed at random.
TEST(KeysAndValuesOfDifferentHeadSizes, EveryRowAndByteIsTheirOwn) {
  CacheConfig c = small(5, 1, 2);
  c.head_dim = 24;
  c.v_head_dim = 8;
  OffloadedStaticCache cache(c);
  const CachePlan& plan = cache.stats().plan;
  const std::uint64_t k_row = 2 * 24 * 2;
  const std::uint64_t v_row = 2 * 8 * 2;
  EXPECT_EQ(plan.layout.k_row_bytes, k_row);
  EXPECT_EQ(plan.layout.v_row_bytes, v_row);
  EXPECT_EQ(plan.layer_bytes,
            (3 * 128 * k_row + 255) / 256 * 256 + (3 * 128 * v_row + 255) / 256 * 256);
  EXPECT_EQ(plan.host_bytes, 4 * plan.layer_bytes);

  // Rows carry (layer, kv, slot, token) in every byte pair, so any misplaced one shows.
  const auto fill = [&](int layer, int kv, int slot, int first, int count) {
    const std::uint64_t row = kv == 0 ? k_row : v_row;
    std::vector<std::uint16_t> rows(static_cast<std::size_t>(count) * row / 2);
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const std::size_t token = static_cast<std::size_t>(first) + i / (row / 2);
      rows[i] = static_cast<std::uint16_t>(layer * 4000 + kv * 2000 + slot * 600 + token * 4 +
                                           i % (row / 2) % 4);
    }
    return rows;
  };
  std::mt19937 rng(3);
  std::vector<int> lengths(3, 0);
  for (int step = 0; step < 12; ++step) {
    std::vector<std::int32_t> n(3);
    for (int s = 0; s < 3; ++s)
      n[static_cast<std::size_t>(s)] = step == 0 ? 5 + s : static_cast<int>(rng() % 3);
    cache.begin_step(n);
    for (int layer = 0; layer < c.layers; ++layer) {
      const LayerView view = cache.acquire(layer);
      ASSERT_EQ(view.layout.head_dim, 24);
      ASSERT_EQ(view.layout.v_head_dim, 8);
      ASSERT_EQ(view.token_stride, 2 * 24);
      ASSERT_EQ(view.v_token_stride, 2 * 8);
      for (int s = 0; s < 3; ++s) {
        const auto k =
            fill(layer, 0, s, lengths[static_cast<std::size_t>(s)], n[static_cast<std::size_t>(s)]);
        const auto v =
            fill(layer, 1, s, lengths[static_cast<std::size_t>(s)], n[static_cast<std::size_t>(s)]);
        cache.append(layer, s, k.data(), v.data(), n[static_cast<std::size_t>(s)]);
      }
      // Every row before this step, read through the view's strides.
      for (int s = 0; s < 3; ++s) {
        const int len = lengths[static_cast<std::size_t>(s)];
        if (len == 0) continue;  // nothing to compare (and memcmp takes no null pointer)
        const auto k = fill(layer, 0, s, 0, len);
        const auto v = fill(layer, 1, s, 0, len);
        EXPECT_EQ(std::memcmp(view.k_row(s, 0), k.data(), k.size() * 2), 0)
            << "K " << step << " " << layer << " " << s;
        EXPECT_EQ(std::memcmp(view.v_row(s, 0), v.data(), v.size() * 2), 0)
            << "V " << step << " " << layer << " " << s;
      }
      cache.release(layer);
    }
    cache.end_step();
    std::uint64_t prefix = 0, appended = 0;
    for (int s = 0; s < 3; ++s) {
      prefix += static_cast<std::uint64_t>(lengths[static_cast<std::size_t>(s)]);
      appended += static_cast<std::uint64_t>(n[static_cast<std::size_t>(s)]);
      lengths[static_cast<std::size_t>(s)] += n[static_cast<std::size_t>(s)];
    }
    // The step's copies: each streamed layer's prefix before the step came in, and exactly the
    // appended rows went back, K and V each at their own row size.
    EXPECT_EQ(cache.stats().h2d_bytes_last_step, 4 * prefix * (k_row + v_row)) << step;
    EXPECT_EQ(cache.stats().d2h_bytes_last_step, 4 * appended * (k_row + v_row)) << step;
  }
}

}  // namespace
}  // namespace kvo
