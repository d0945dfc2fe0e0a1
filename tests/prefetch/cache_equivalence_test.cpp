// Offloaded caches (R = 0 and R > 0; ring depth 2 and 3; synchronous and asynchronous caller
// streams) and an all-resident cache run the same random steps on the host backend under
// random copy delays; every acquire must expose exactly the reference rows.
#include <gtest/gtest.h>

#include <deque>

#include "expect_error.hpp"
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

// Split attention under the same random steps and delays: steps split where the config says
// (kRows, 64 rows) or at rows begin_step is given (0, 1, 64, length - 1, length, any), and both
// alternate, so prefetches issued for a step with one split serve a step with another (the rows
// a smaller split lacks are copied before the layer is acquired). Every acquire's device rows
// past the split, and the host store's rows before it, equal the reference.
class SplitUnderDelays : public ::testing::TestWithParam<int> {};

TEST_P(SplitUnderDelays, DeviceRowsPastTheSplitAndHostRowsBeforeIt) {
  const int seed = GetParam();
  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kF32};
  CacheConfig base = shape(6, 3, 160, dtypes[seed % 3]);
  base.split.mode = SplitMode::kRows;
  base.split.rows = 64;
  auto caches = make_caches(base, kVariants, 40, static_cast<std::uint64_t>(seed));
  EXPECT_EQ(caches[0]->cache().stats().plan.split, SplitMode::kRows);
  DriverOptions options;
  options.steps = 60;
  options.split_probability = 0.5;
  testing::drive(caches, static_cast<std::uint64_t>(seed) * 6151 + 5, options);
  for (auto& c : caches) {
    EXPECT_EQ(c->failures(), 0) << c->name() << " seed " << seed;
    EXPECT_GT(c->checks(), 500) << c->name();
  }
}

INSTANTIATE_TEST_SUITE_P(Seeds, SplitUnderDelays, ::testing::Range(1, 9));

// Window layers (CacheConfig::layer_windows) beside full ones, streamed and resident, under the
// same random steps and delays: after every append, a window layer holds its window's rows of
// the reference (the window - 1 positions before the rows appended, and those), where its
// first_positions say; a window too wide for a buffer shorter than max_seq stays a full layer.
// Rows of a window never cross the bus.
class WindowsUnderDelays : public ::testing::TestWithParam<int> {};

TEST_P(WindowsUnderDelays, EveryAppendLeavesTheWindowsRows) {
  const int seed = GetParam();
  const DType dtypes[] = {DType::kBF16, DType::kF32, DType::kF16};
  CacheConfig base = shape(6, 3, 96, dtypes[seed % 3]);
  // 41: 40 + 16 + 5 rows, a buffer of 64 that moves its 40 rows in up to 5 pieces; 90: 89 + 16 +
  // 12 rows, 128, not below 96: kept full.
  base.layer_windows = {0, 5, 41, 0, 90, 0};
  base.max_append = 16;
  const std::vector<Variant> variants = {
      {0, 2, false}, {0, 2, true}, {1, 2, true}, {4, 2, false}, {0, 1, true}};
  auto caches = make_caches(base, variants, 40, static_cast<std::uint64_t>(seed));
  const CachePlan plan = caches[0]->cache().stats().plan;
  EXPECT_EQ(plan.layers, 6);
  EXPECT_EQ(plan.window_layers, 2);
  EXPECT_EQ(plan.streamed_layers, 4);
  EXPECT_EQ(window_rows(5, 16), 64);  // 4 + 16 + 1, in whole 64s
  EXPECT_EQ(window_rows(41, 16), 64);
  EXPECT_EQ(window_rows(90, 16), 128);
  EXPECT_EQ(window_rows(1, 16), 64);     // a window of one key: its own row alone
  EXPECT_EQ(window_rows(513, 64), 640);  // 512 + 64 + 64
  CacheConfig one = base;
  one.max_seq = 64;
  EXPECT_EQ(plan.window_bytes, 2 * kv_layout(one).layer_bytes());
  EXPECT_EQ(plan.host_bytes, 4 * plan.layer_bytes);
  EXPECT_EQ(caches[3]->cache().stats().plan.streamed_layers, 0);

  DriverOptions options;
  options.steps = 60;
  options.max_prefill = 40;
  options.windows = true;
  options.max_append = 16;
  options.reorder_probability = 0.1;
  testing::drive(caches, static_cast<std::uint64_t>(seed) * 104729 + 3, options);
  for (auto& c : caches) {
    EXPECT_EQ(c->failures(), 0) << c->name() << " seed " << seed;
    EXPECT_GT(c->checks(), 500) << c->name();
  }
  // The all-resident variant moved nothing over the bus, windows included.
  EXPECT_EQ(caches[3]->cache().stats().h2d_bytes_total, 0u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, WindowsUnderDelays, ::testing::Range(1, 9));

// One window layer step by step: its rows move to the front once the buffer is full (the
// window's last rows kept, where first_positions says), and what it no longer holds is refused
// clearly: a longer append than max_append, a truncation below its window, a saved context, a
// step after an abort that had moved its rows; and configs it cannot serve.
TEST(Windows, KeepTheLastRowsAndRefuseWhatTheyLost) {
  CacheConfig config = shape(3, 1, 200, DType::kF32);
  config.layer_windows = {4, 0, 4};
  config.max_append = 8;
  const std::size_t row = 2 * 8 * 4;
  CacheUnderTest cut(config, false, 8 * row);
  OffloadedStaticCache& cache = cut.cache();
  testing::Reference ref(3, 1, 200, row);
  std::mt19937_64 rng(11);
  // One step of n rows in appends of `piece`; returns the first position of layer 0 after it.
  const auto step = [&](int n, int piece, int abort_at_layer = -1) {
    cache.begin_step({n});
    int first = -1;
    for (int layer = 0; layer < 3; ++layer) {
      const LayerView view = cache.acquire(layer, cut.stream());
      EXPECT_EQ(view.window, layer == 1 ? 0 : 4);
      EXPECT_EQ(view.first_positions == nullptr, layer == 1);
      if (layer != 1) {
        EXPECT_TRUE(view.resident);
        EXPECT_EQ(view.layout.max_seq, 64);
      }
      const int length = view.lengths[0];
      for (int done = 0; done < n; done += piece) {
        const int m = std::min(piece, n - done);
        std::vector<std::uint8_t> k(m * row), v(m * row);
        for (auto& b : k) b = static_cast<std::uint8_t>(rng());
        for (auto& b : v) b = static_cast<std::uint8_t>(rng());
        std::memcpy(ref.row(layer, 0, 0, length + done), k.data(), k.size());
        std::memcpy(ref.row(layer, 1, 0, length + done), v.data(), v.size());
        cut.append(layer, 0, k.data(), v.data(), m, row);
        if (view.first_positions != nullptr) {
          cut.check_window(view, ref, 0, length + done, length + done + m);
        } else {
          cut.check(view, ref, 0, length + done + m);
        }
      }
      if (layer == 0) first = view.first_positions[0];
      if (layer == abort_at_layer) {
        cache.abort_step(cut.stream());
        cut.finish_step();
        return first;
      }
      cache.release(layer, cut.stream());
    }
    cache.end_step();
    cut.finish_step();
    return first;
  };
  for (int i = 0; i < 8; ++i) EXPECT_EQ(step(8, 8), 0);  // 64 rows: the buffer full, none moved
  EXPECT_EQ(step(8, 8), 61);  // 64 + 8 > 64: the 3 rows before the new ones moved first
  for (int i = 0; i < 60; ++i) step(1, 1);  // decode past a second move, at 61 + 64
  EXPECT_EQ(cache.length(0), 132);
  cache.begin_step({0});
  EXPECT_EQ(cache.acquire(0, cut.stream()).first_positions[0], 122);
  cache.abort_step(cut.stream());
  EXPECT_EQ(cut.failures(), 0);

  using testing::expect_error;
  // Refused, nothing changed.
  cache.begin_step({9});
  cache.acquire(0, cut.stream());
  std::vector<std::uint8_t> rows(9 * row);
  expect_error([&] { cache.append(0, 0, rows.data(), rows.data(), 9, cut.stream()); },
               ErrorCode::kInvalidArgument, "at most max_append (8)");
  cache.abort_step(cut.stream());
  expect_error([&] { cache.truncate_slot(0, 50); }, ErrorCode::kInvalidArgument,
               "window layers no longer hold the rows a length of 50 needs");
  EXPECT_EQ(cache.length(0), 132);
  cache.truncate_slot(0, 131);  // its window is there
  EXPECT_EQ(cache.length(0), 131);
  expect_error([&] { cache.save_slot(0, "/tmp/kvo-windows-refused.kvo"); },
               ErrorCode::kInvalidArgument, "window layers");
  // An aborted step whose appends moved rows past what 131 needs: the slot takes no step until
  // it is reset.
  EXPECT_GT(step(60, 8, /*abort_at_layer=*/0), 131 - 3);
  EXPECT_EQ(cache.length(0), 131);
  expect_error([&] { cache.begin_step({1}); }, ErrorCode::kInvalidArgument,
               "lost rows of its window layers in an aborted step");
  cache.reset_slot(0);
  EXPECT_EQ(step(8, 8), 0);
  EXPECT_EQ(cut.failures(), 0);

  // Configs: one entry per layer, windows not negative, max_append with windows, one full
  // layer at least, resident_layers among the full ones, the region's name the cache's own.
  const auto refused = [&](CacheConfig c, const std::string& needle) {
    expect_error([&] { validate(c); }, ErrorCode::kInvalidArgument, needle);
  };
  CacheConfig bad = config;
  bad.layer_windows = {4, 0};
  refused(bad, "2 entries for 3 layers");
  bad.layer_windows = {4, -1, 0};
  refused(bad, "layer_windows[1]");
  bad.layer_windows = {4, 0, 4};
  bad.max_append = 0;
  refused(bad, "max_append");
  bad.max_append = 8;
  bad.layer_windows = {4, 4, 4};
  refused(bad, "at least one must stay full");
  bad.layer_windows = {4, 0, 4};
  bad.resident_layers = 2;
  refused(bad, "at most 1 here");
  bad.resident_layers = kAutoResidentLayers;
  bad.reserved.push_back({kWindowRegion, 64});
  refused(bad, "the cache's own");
}

// A window of 513 keys appended 64 rows at most: a buffer of exactly 512 + 64 + 64 rows, so a
// move can shift its 512 rows by as little as 65, in 8 pieces; each piece must read rows no
// earlier one wrote (the backends refuse a copy that overlaps itself). After every append the
// window's rows equal the reference's, on a stream of its own and on the caller's thread.
TEST(Windows, AMoveInEightPiecesKeepsEveryRow) {
  for (const bool async : {false, true}) {
    CacheConfig config = shape(2, 1, 2048, DType::kF16);
    config.layer_windows = {513, 0};
    config.max_append = 64;
    const std::size_t row = 2 * 8 * 2;
    CacheUnderTest cut(config, async, 64 * row);
    OffloadedStaticCache& cache = cut.cache();
    EXPECT_EQ(cache.stats().plan.window_layers, 1);
    testing::Reference ref(2, 1, 2048, row);
    std::mt19937_64 rng(5);
    const auto step = [&](int n) {
      cache.begin_step({n});
      int first = -1;
      std::vector<std::uint8_t> rows[2][2];  // [layer][k, v], read by the stream until the end
      for (int layer = 0; layer < 2; ++layer) {
        const LayerView view = cache.acquire(layer, cut.stream());
        const int length = view.lengths[0];
        std::vector<std::uint8_t>& k = rows[layer][0];
        std::vector<std::uint8_t>& v = rows[layer][1];
        k.resize(n * row);
        v.resize(n * row);
        for (auto& b : k) b = static_cast<std::uint8_t>(rng());
        for (auto& b : v) b = static_cast<std::uint8_t>(rng());
        std::memcpy(ref.row(layer, 0, 0, length), k.data(), k.size());
        std::memcpy(ref.row(layer, 1, 0, length), v.data(), v.size());
        cut.append(layer, 0, k.data(), v.data(), n, row);
        if (layer == 0) {
          EXPECT_EQ(view.layout.max_seq, 640);
          cut.check_window(view, ref, 0, length, length + n);
          first = view.first_positions[0];
        } else {
          cut.check(view, ref, 0, length + n);
        }
        cache.release(layer, cut.stream());
      }
      cache.end_step();
      cut.finish_step();
      return first;
    };
    for (int i = 0; i < 10; ++i) EXPECT_EQ(step(64), 0);   // 640 rows: full, nothing moved
    EXPECT_EQ(step(1), 128);                               // 512 rows shifted by 128: 4 pieces
    EXPECT_EQ(step(64), 128);                              // 577 rows held
    EXPECT_EQ(step(64), 193);                              // 512 rows shifted by 65: 8 pieces
    for (int i = 0; i < 35; ++i) step(1 + (i * 37) % 64);  // 1 to 64 rows, moves at any shift
    EXPECT_LE(cache.length(0), 2048);
    EXPECT_EQ(cut.failures(), 0) << (async ? "async" : "sync");
    EXPECT_GT(cut.checks(), 50);
  }
}

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
