// Offloaded caches (R = 0 and R > 0; ring depth 2 and 3; synchronous and asynchronous caller
// streams) and an all-resident cache run the same random steps on the host backend under
// random copy delays; every acquire must expose exactly the reference rows.
#include <gtest/gtest.h>

#include <deque>

#include "prefetch/cache_driver.hpp"

namespace kvo {
namespace {

using testing::CacheUnderTest;
using testing::DriverOptions;

CacheConfig shape(int layers, int slots, int max_seq, DType dtype) {
  CacheConfig config;
  config.layers = layers;
  config.kv_heads = 2;
  config.head_dim = 8;
  config.max_seq = max_seq;
  config.slots = slots;
  config.dtype = dtype;
  config.backend = BackendKind::kHost;
  return config;
}

struct Variant {
  int resident;
  int ring;
  bool async;
};

std::vector<std::unique_ptr<CacheUnderTest>> make_caches(const CacheConfig& base,
                                                         const std::vector<Variant>& variants,
                                                         std::uint32_t max_delay_us,
                                                         std::uint64_t seed) {
  std::vector<std::unique_ptr<CacheUnderTest>> caches;
  const std::size_t max_append =
      static_cast<std::size_t>(base.max_seq) * base.kv_heads * base.head_dim * 4;
  for (const Variant& v : variants) {
    CacheConfig config = base;
    config.resident_layers = v.resident;
    config.ring_depth = v.ring;
    config.host.max_delay_us = max_delay_us;
    config.host.delay_seed = seed;
    caches.push_back(std::make_unique<CacheUnderTest>(config, v.async, max_append));
  }
  return caches;
}

const std::vector<Variant> kVariants = {
    {0, 2, false}, {0, 2, true},  {2, 2, true}, {0, 3, true},
    {1, 3, false}, {6, 2, false}, {0, 1, true},
};

class EquivalenceUnderDelays : public ::testing::TestWithParam<int> {};

TEST_P(EquivalenceUnderDelays, EveryAcquireMatchesTheReference) {
  const int seed = GetParam();
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  const CacheConfig base = shape(6, 3, 96, dtypes[seed % 3]);
  auto caches = make_caches(base, kVariants, 40, static_cast<std::uint64_t>(seed));
  // The variants really are what they claim: streamed layers go through a ring.
  EXPECT_EQ(caches[0]->cache().stats().plan.streamed_layers, 6);
  EXPECT_EQ(caches[2]->cache().stats().plan.streamed_layers, 4);
  EXPECT_EQ(caches[3]->cache().stats().plan.ring_depth, 3);
  EXPECT_EQ(caches[5]->cache().stats().plan.streamed_layers, 0);

  DriverOptions options;
  options.steps = 50;
  testing::drive(caches, static_cast<std::uint64_t>(seed) * 7919 + 1, options);
  for (auto& c : caches) {
    EXPECT_EQ(c->failures(), 0) << c->name() << " seed " << seed;
    EXPECT_GT(c->checks(), 500) << c->name();
  }
  // The offloaded caches did move bytes; the all-resident one did not.
  EXPECT_GT(caches[0]->cache().stats().h2d_bytes_total, 0u);
  EXPECT_EQ(caches[5]->cache().stats().h2d_bytes_total, 0u);
  EXPECT_EQ(caches[5]->cache().stats().d2h_bytes_total, 0u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, EquivalenceUnderDelays, ::testing::Range(1, 13));

// Beam search's reorders between steps (any mapping: cycles, one source for several slots), under
// random copy delays: every later acquire holds the source's rows, resident or streamed, and the
// prefetches made before a reorder are issued again. Rows move in place (resident ones on the
// device), a cycle through a scratch: first a swap, a 3-cycle beside a fixed slot, two swaps, a
// 4-cycle and a fan-out feeding a cycle, then random mappings; every variant, the all-resident
// one without a staging buffer to use as the device scratch.
TEST(Equivalence, ReorderedSlotsHoldTheirSourcesRows) {
  for (int seed = 1; seed <= 4; ++seed) {
    const CacheConfig base = shape(6, 4, 80, DType::kBF16);
    auto caches = make_caches(base, kVariants, 40, static_cast<std::uint64_t>(seed));
    DriverOptions options;
    options.steps = 40;
    options.reorder_probability = 0.4;
    options.reorders = {{1, 0, 2, 3}, {1, 2, 0, 3}, {1, 0, 3, 2}, {3, 0, 1, 2}, {1, 2, 1, 0}};
    testing::drive(caches, static_cast<std::uint64_t>(seed) * 31 + 7, options);
    for (auto& c : caches) {
      EXPECT_EQ(c->failures(), 0) << c->name() << " seed " << seed;
      EXPECT_GT(c->cache().stats().reorder_bytes, 0u) << c->name();
    }
    EXPECT_GT(caches[0]->cache().stats().prefetch_reissues, 0u);
  }
  // Misuse changes nothing: a wrong count, a source outside the slots, inside a step.
  CacheConfig c = shape(2, 3, 16, DType::kF32);
  c.backend = BackendKind::kHost;
  OffloadedStaticCache cache(c);
  EXPECT_THROW(cache.reorder_slots({0, 1}), Error);
  EXPECT_THROW(cache.reorder_slots({0, 3, 1}), Error);
  cache.begin_step({1, 1, 1});
  try {
    cache.reorder_slots({1, 1, 1});
    FAIL() << "expected a protocol error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kProtocol);
  }
  cache.abort_step();
  for (int s = 0; s < 3; ++s) EXPECT_EQ(cache.length(s), 0);
}

// Long prefills that fill slots to max_seq, then decodes at the limit, with no delays (the
// fast path) and with long delays (copies that take longer than the caller's work).
TEST(Equivalence, FullSlotsAndLongDelays) {
  for (std::uint32_t delay : {0u, 300u}) {
    const CacheConfig base = shape(5, 2, 64, DType::kBF16);
    auto caches = make_caches(base, {{0, 2, true}, {1, 3, true}, {5, 2, false}}, delay, 99);
    DriverOptions options;
    options.steps = 30;
    options.max_prefill = 64;
    options.reset_probability = 0.05;
    options.truncate_probability = 0.02;
    testing::drive(caches, 4242 + delay, options);
    for (auto& c : caches) EXPECT_EQ(c->failures(), 0) << c->name() << " delay " << delay;
  }
}

// A step that is aborted half-way leaves lengths and contents as they were, and the next steps
// (whose prefetches are re-issued) see exactly the committed rows.
TEST(Equivalence, AbortedStepChangesNothing) {
  CacheConfig config = shape(5, 2, 64, DType::kF16);
  config.resident_layers = 1;
  config.host.max_delay_us = 50;
  const std::size_t row = 2 * 8 * 2;
  CacheUnderTest cut(config, true, 64 * row);
  OffloadedStaticCache& cache = cut.cache();
  testing::Reference ref(5, 2, 64, row);
  std::mt19937_64 rng(5);

  auto run_step = [&](const std::vector<std::int32_t>& n, int abort_at_layer) {
    cache.begin_step(n);
    std::vector<std::vector<std::uint8_t>> rows;
    for (int layer = 0; layer < 5; ++layer) {
      if (layer == abort_at_layer) {
        cache.abort_step(cut.stream());
        cut.finish_step();
        return;
      }
      const LayerView view = cache.acquire(layer, cut.stream());
      for (int s = 0; s < 2; ++s) {
        cut.check(view, ref, s, view.lengths[s]);
        std::vector<std::uint8_t> k(n[s] * row), v(n[s] * row);
        for (auto& b : k) b = static_cast<std::uint8_t>(rng());
        for (auto& b : v) b = static_cast<std::uint8_t>(rng());
        if (abort_at_layer < 0 && n[s] > 0) {
          std::memcpy(ref.row(layer, 0, s, view.lengths[s]), k.data(), k.size());
          std::memcpy(ref.row(layer, 1, s, view.lengths[s]), v.data(), v.size());
        }
        cut.append(layer, s, k.data(), v.data(), n[s], row);
        rows.push_back(std::move(k));
        rows.push_back(std::move(v));
      }
      if (layer == 3 && abort_at_layer == 4) {
        cache.abort_step(cut.stream());  // abort while a layer is held
        cut.finish_step();
        return;
      }
      cache.release(layer, cut.stream());
    }
    cache.end_step();
    cut.finish_step();
  };

  run_step({10, 7}, -1);
  run_step({1, 1}, -1);
  run_step({5, 3}, 3);  // aborted after three layers
  EXPECT_EQ(cache.length(0), 11);
  EXPECT_EQ(cache.length(1), 8);
  run_step({1, 2}, 4);  // aborted with layer 3 held
  EXPECT_EQ(cache.length(0), 11);
  for (int i = 0; i < 4; ++i) run_step({1, 1}, -1);
  EXPECT_EQ(cache.length(0), 15);
  EXPECT_EQ(cache.length(1), 12);
  EXPECT_EQ(cut.failures(), 0);
  EXPECT_GT(cache.stats().prefetch_reissues, 0u);
}

// The caller may use another stream for every step. Each step's checks and appends run late on
// their own stream (long delays); the next step, on a different stream, must still see them:
// acquire orders resident layers after the previous release as it does streamed ones.
TEST(Equivalence, StreamsMayChangeBetweenSteps) {
  CacheConfig config = shape(5, 2, 48, DType::kF32);
  config.resident_layers = 2;
  config.ring_depth = 2;
  config.host.max_delay_us = 400;
  OffloadedStaticCache cache(config);
  void* streams[3] = {cache.create_stream(), nullptr, cache.create_stream()};
  const std::size_t row = 2 * 8 * 4;
  testing::Reference ref(5, 2, 48, row);
  std::deque<std::vector<std::uint8_t>> inputs;  // alive until every stream has run
  std::deque<testing::CheckTask> tasks;
  std::atomic<int> failures{0};
  std::mt19937_64 rng(11);
  int length = 0;
  for (int step = 0; step < 12; ++step) {
    void* stream = streams[step % 3];
    const int n = step == 0 ? 9 : 1;
    cache.begin_step({n, n});
    for (int layer = 0; layer < 5; ++layer) {
      const LayerView view = cache.acquire(layer, stream);
      for (int s = 0; s < 2; ++s) {
        for (int kv = 0; kv < 2; ++kv) {
          const std::size_t bytes = static_cast<std::size_t>(length) * row;
          if (bytes > 0) {
            tasks.push_back(
                {static_cast<const std::uint8_t*>(kv == 0 ? view.k_row(s, 0) : view.v_row(s, 0)),
                 ref.row(layer, kv, s, 0), bytes, &failures});
            cache.launch_host_func(stream, &testing::CheckTask::run, &tasks.back());
          }
        }
        auto& k = inputs.emplace_back(static_cast<std::size_t>(n) * row);
        auto& v = inputs.emplace_back(static_cast<std::size_t>(n) * row);
        for (auto& b : k) b = static_cast<std::uint8_t>(rng());
        for (auto& b : v) b = static_cast<std::uint8_t>(rng());
        std::memcpy(ref.row(layer, 0, s, length), k.data(), k.size());
        std::memcpy(ref.row(layer, 1, s, length), v.data(), v.size());
        cache.append(layer, s, k.data(), v.data(), n, stream);
      }
      cache.release(layer, stream);
    }
    cache.end_step();
    length += n;
  }
  cache.synchronize_stream(streams[0]);
  cache.synchronize_stream(streams[2]);
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(tasks.size(), 11u * 5 * 2 * 2);  // every step after the first checks every layer
  cache.destroy_stream(streams[0]);
  cache.destroy_stream(streams[2]);
}

}  // namespace
}  // namespace kvo
