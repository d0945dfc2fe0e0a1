// WindowLayers on its own, under random copy delays: every slot keeps, in position order, the
// rows its window can still need, whatever the appends' sizes; a move past the buffer keeps the
// window - 1 rows before the new ones; what a length needs is covered or marked lost; a reorder
// moves each slot's held rows and first position with it.
#include "prefetch/ring/window_layers.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "kvoffload/plan.hpp"
#include "offload/store/window_layers.hpp"
#include "prefetch/backend/host_backend.hpp"

namespace kvo::prefetch {
namespace {

// A config of one full layer and one window layer of `window` keys, f32 rows of 4 elements.
CacheConfig config(int window, int max_append, int slots) {
  CacheConfig c;
  c.layers = 2;
  c.kv_heads = 1;
  c.head_dim = 4;
  c.max_seq = 256;
  c.slots = slots;
  c.dtype = DType::kF32;
  c.layer_windows = {0, window};
  c.max_append = max_append;
  c.backend = BackendKind::kHost;
  return c;
}

// The row of `slot` at `position`: its 4 values say where they come from (K negated in V).
std::vector<float> row(int slot, int position, int kv) {
  const float v = static_cast<float>(slot * 10000 + position) * (kv == 0 ? 1.0f : -1.0f);
  return {v, v + 0.25f, v + 0.5f, v + 0.75f};
}

struct Fixture {
  Fixture(int window, int max_append, int slots, std::uint64_t seed)
      : plan(offload::plan_windows(config(window, max_append, slots))),
        backend(
            [&] {
              HostBackendOptions o;
              o.max_delay_us = 50;
              o.delay_seed = seed;
              return o;
            }(),
            0),
        region(plan.bytes),
        windows(backend, plan, region.data(), slots),
        stream(backend.create_stream()) {}
  ~Fixture() { backend.destroy_stream(stream); }
  // Appends rows [position, position + n) of `slot` (the caller's rows stay alive until synced).
  void append(int slot, int position, int n) {
    std::vector<float>& k = held.emplace_back();
    std::vector<float>& v = held.emplace_back();
    for (int i = 0; i < n; ++i) {
      for (float x : row(slot, position + i, 0)) k.push_back(x);
      for (float x : row(slot, position + i, 1)) v.push_back(x);
    }
    windows.append(0, slot, position, k.data(), v.data(), n, stream);
  }
  // Every row slot `slot` holds in position order, from its first position to `length`.
  void expect_rows(int slot, int length) {
    backend.synchronize_stream(stream);
    const int first = windows.first_positions(0)[slot];
    ASSERT_LE(first, length);
    for (int p = first; p < length; ++p) {
      for (int kv = 0; kv < 2; ++kv) {
        std::vector<float> got(4);
        std::memcpy(got.data(), windows.slot_rows(0, slot, kv) + (p - first) * 16, 16);
        ASSERT_EQ(got, row(slot, p, kv)) << "slot " << slot << " position " << p << " kv " << kv;
      }
    }
  }
  offload::WindowPlan plan;
  HostBackend backend;
  std::vector<std::byte> region;
  WindowLayers windows;
  StreamHandle stream;
  std::deque<std::vector<float>> held;  // references stay valid as it grows
};

TEST(WindowLayers, AppendsOfAnySizeKeepEveryRowAWindowNeeds) {
  for (const int window : {1, 2, 9, 40}) {
    for (const int max_append : {1, 7, 64}) {
      Fixture f(window, max_append, 2, static_cast<std::uint64_t>(window * 100 + max_append));
      const int rows = f.windows.window(0).layout.max_seq;
      ASSERT_EQ(rows, window_rows(window, max_append));
      std::mt19937 rng(static_cast<unsigned>(window + max_append));
      int length[2] = {0, 0};
      for (int step = 0; step < 60; ++step) {
        for (int s = 0; s < 2; ++s) {
          const int n = 1 + static_cast<int>(rng() % static_cast<unsigned>(max_append));
          f.append(s, length[s], n);
          length[s] += n;
          ASSERT_TRUE(f.windows.covers(s, length[s]));
          // The rows the window needs, and no more than the buffer holds.
          const int first = f.windows.first_positions(0)[s];
          EXPECT_LE(length[s] - first, rows);
          EXPECT_LE(first, std::max(0, length[s] - window));
        }
        for (int s = 0; s < 2; ++s) f.expect_rows(s, length[s]);
      }
    }
  }
}

TEST(WindowLayers, AMoveForgetsOnlyWhatNoWindowNeedsAndIsMarkedLostWhenAborted) {
  Fixture f(9, 4, 1, 7);
  int length = 0;
  while (f.windows.first_positions(0)[0] == 0) {  // until the first move
    f.append(0, length, 4);
    length += 4;
  }
  f.expect_rows(0, length);
  // A committed length before the appends that moved rows is no longer covered.
  const int first = f.windows.first_positions(0)[0];
  EXPECT_TRUE(f.windows.covers(0, first + 8));
  EXPECT_FALSE(f.windows.covers(0, first + 7));
  f.windows.mark_lost({first + 7});
  EXPECT_TRUE(f.windows.lost(0));
  f.windows.clear_lost(0);
  EXPECT_FALSE(f.windows.lost(0));
  f.windows.mark_lost({first + 7});
  f.windows.reset(0);  // the slot starts over from position 0
  EXPECT_FALSE(f.windows.lost(0));
  EXPECT_EQ(f.windows.first_positions(0)[0], 0);
  EXPECT_TRUE(f.windows.covers(0, 0));
}

TEST(WindowLayers, AReorderMovesEachSlotsRowsAndFirstPosition) {
  Fixture f(9, 4, 3, 11);
  std::vector<std::int32_t> lengths = {150, 5, 100};  // slots 0 and 2 pass their 64 rows
  for (int s = 0; s < 3; ++s) {
    for (int p = 0; p < lengths[static_cast<std::size_t>(s)]; p += 1) f.append(s, p, 1);
  }
  f.backend.synchronize_all();
  const std::vector<std::int32_t> first = {f.windows.first_positions(0)[0],
                                           f.windows.first_positions(0)[1],
                                           f.windows.first_positions(0)[2]};
  ASSERT_GT(first[0], 0);                       // slot 0 moved
  f.windows.mark_lost({first[0] + 7, 5, 100});  // slot 0 lost: a length whose window it moved past
  ASSERT_TRUE(f.windows.lost(0));
  ASSERT_FALSE(f.windows.lost(1));
  ASSERT_FALSE(f.windows.lost(2));
  const std::vector<int> source = {2, 0, 0};
  const std::uint64_t bytes = f.windows.reorder(source, lengths);
  // Slot 0 takes slot 2's rows, slots 1 and 2 slot 0's.
  EXPECT_EQ(f.windows.first_positions(0)[0], first[2]);
  EXPECT_EQ(f.windows.first_positions(0)[1], first[0]);
  EXPECT_EQ(f.windows.first_positions(0)[2], first[0]);
  EXPECT_FALSE(f.windows.lost(0));
  EXPECT_TRUE(f.windows.lost(1));
  EXPECT_TRUE(f.windows.lost(2));
  const auto held = [&](int s) { return static_cast<std::uint64_t>(lengths[s] - first[s]); };
  EXPECT_EQ(bytes, 2 * 16 * (held(2) + held(0) + held(0)));
  for (int s = 0; s < 3; ++s) {
    const int from = source[static_cast<std::size_t>(s)];
    const int f0 = f.windows.first_positions(0)[s];
    for (int p = f0; p < lengths[static_cast<std::size_t>(from)]; ++p) {
      std::vector<float> got(4);
      std::memcpy(got.data(), f.windows.slot_rows(0, s, 0) + (p - f0) * 16, 16);
      ASSERT_EQ(got, row(from, p, 0)) << "slot " << s << " position " << p;
    }
  }
}

}  // namespace
}  // namespace kvo::prefetch
