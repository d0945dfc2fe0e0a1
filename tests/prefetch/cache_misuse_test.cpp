// Protocol misuse and bad input raise kvo::Error with a message a user understands, and the
// cache's data is intact and usable afterwards.
#include <gtest/gtest.h>

#include "expect_error.hpp"

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"

namespace kvo {
namespace {

constexpr int kLayers = 5;
constexpr int kSlots = 2;
constexpr int kMaxSeq = 32;
constexpr std::size_t kRow = 2 * 4 * 4;  // kv_heads 2, head_dim 4, f32

CacheConfig config() {
  CacheConfig c;
  c.layers = kLayers;
  c.kv_heads = 2;
  c.head_dim = 4;
  c.max_seq = kMaxSeq;
  c.slots = kSlots;
  c.dtype = DType::kF32;
  c.resident_layers = 1;
  c.ring_depth = 2;
  c.backend = BackendKind::kHost;
  c.host.max_delay_us = 20;
  return c;
}

using testing::expect_error;

// The row a (layer, kv, slot, token) holds in these tests: a recognisable pattern.
std::vector<std::uint8_t> rows_for(int layer, int kv, int slot, int first, int count) {
  std::vector<std::uint8_t> rows(static_cast<std::size_t>(count) * kRow);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::size_t token = static_cast<std::size_t>(first) + i / kRow;
    rows[i] = static_cast<std::uint8_t>(layer * 53 + kv * 29 + slot * 17 + token * 7 + i % kRow);
  }
  return rows;
}

class Misuse : public ::testing::Test {
 protected:
  Misuse() : cache(config()) {}

  // A full, correct step: every slot gets n[s] pattern rows on every layer; checks each view.
  void good_step(const std::vector<std::int32_t>& n) {
    cache.begin_step(n);
    for (int layer = 0; layer < kLayers; ++layer) {
      const LayerView view = cache.acquire(layer);
      check(view);
      for (int s = 0; s < kSlots; ++s) append_rows(layer, s, n[static_cast<std::size_t>(s)]);
      cache.release(layer);
    }
    cache.end_step();
  }
  void append_rows(int layer, int slot, int count) {
    const int at = cache.length(slot);
    const auto k = rows_for(layer, 0, slot, at, count);
    const auto v = rows_for(layer, 1, slot, at, count);
    cache.append(layer, slot, k.data(), v.data(), count);
  }
  void check(const LayerView& view) {
    for (int s = 0; s < kSlots; ++s) {
      const int len = view.lengths[s];
      if (len == 0) continue;  // memcmp of no bytes still needs valid pointers
      const auto k = rows_for(view.layer, 0, s, 0, len);
      const auto v = rows_for(view.layer, 1, s, 0, len);
      EXPECT_EQ(0, std::memcmp(view.k_row(s, 0), k.data(), k.size())) << "layer " << view.layer;
      EXPECT_EQ(0, std::memcmp(view.v_row(s, 0), v.data(), v.size())) << "layer " << view.layer;
    }
  }

  OffloadedStaticCache cache;
};

TEST_F(Misuse, ProtocolErrorsLeaveTheCacheUsable) {
  good_step({6, 3});
  const auto k = rows_for(0, 0, 0, 0, 1);

  expect_error([&] { cache.append(0, 0, k.data(), k.data(), 1); }, ErrorCode::kProtocol,
               "outside a step");
  expect_error([&] { cache.acquire(0); }, ErrorCode::kProtocol, "begin_step first");
  expect_error([&] { cache.end_step(); }, ErrorCode::kProtocol, "without begin_step");

  cache.begin_step({1, 1});
  expect_error([&] { cache.begin_step({1, 1}); }, ErrorCode::kProtocol, "step is open");
  expect_error([&] { cache.append(0, 0, k.data(), k.data(), 1); }, ErrorCode::kProtocol,
               "without acquire");
  expect_error([&] { cache.acquire(2); }, ErrorCode::kProtocol, "out of order: expected layer 0");
  expect_error([&] { cache.acquire(kLayers); }, ErrorCode::kInvalidArgument, "out of range");
  expect_error([&] { cache.reset_slot(0); }, ErrorCode::kProtocol, "between steps");
  expect_error([&] { cache.truncate_slot(0, 1); }, ErrorCode::kProtocol, "between steps");
  expect_error([&] { cache.end_step(); }, ErrorCode::kProtocol, "0 of 5 layers");

  for (int layer = 0; layer < kLayers; ++layer) {
    const LayerView view = cache.acquire(layer);
    check(view);
    expect_error([&] { cache.acquire(layer); }, ErrorCode::kProtocol, "still held");
    expect_error([&] { cache.release(layer); }, ErrorCode::kProtocol, "0 of its 1 new rows");
    expect_error([&] { cache.append(layer, 2, k.data(), k.data(), 1); },
                 ErrorCode::kInvalidArgument, "slot 2 is out of range");
    expect_error([&] { cache.append(layer, 0, k.data(), k.data(), 2); },
                 ErrorCode::kInvalidArgument, "declared 1");
    expect_error([&] { cache.append(layer, 0, k.data(), k.data(), -1); },
                 ErrorCode::kInvalidArgument, "negative");
    expect_error([&] { cache.append(layer, 0, nullptr, nullptr, 1); }, ErrorCode::kInvalidArgument,
                 "null");
    if (layer > 0) {
      expect_error([&] { cache.release(layer - 1); }, ErrorCode::kProtocol, "is the one acquired");
    }
    for (int s = 0; s < kSlots; ++s) append_rows(layer, s, 1);
    expect_error([&] { cache.end_step(); }, ErrorCode::kProtocol, "still held");
    cache.release(layer);
    expect_error([&] { cache.release(layer); }, ErrorCode::kProtocol, "without acquire");
  }
  expect_error([&] { cache.acquire(kLayers - 1); }, ErrorCode::kProtocol, "call end_step");
  cache.end_step();
  EXPECT_EQ(cache.length(0), 7);
  EXPECT_EQ(cache.length(1), 4);

  // Still usable, and every row written so far is still there.
  for (int i = 0; i < 4; ++i) good_step({1, 2});
  EXPECT_EQ(cache.length(0), 11);
  EXPECT_EQ(cache.length(1), 12);
}

TEST_F(Misuse, PositionsPastTheCacheAndBadSlots) {
  good_step({30, 2});
  expect_error(
      [&] {
        cache.begin_step({3, 1});
      },
      ErrorCode::kInvalidArgument, "would pass max_seq (32)");
  expect_error([&] { cache.begin_step({-1, 1}); }, ErrorCode::kInvalidArgument, "negative");
  expect_error([&] { cache.begin_step({1}); }, ErrorCode::kInvalidArgument,
               "one new-token count per slot");
  expect_error([&] { cache.reset_slot(5); }, ErrorCode::kInvalidArgument, "slot 5");
  expect_error([&] { cache.truncate_slot(-1, 0); }, ErrorCode::kInvalidArgument, "slot -1");
  expect_error([&] { cache.truncate_slot(1, 3); }, ErrorCode::kInvalidArgument,
               "cannot truncate to 3");
  expect_error([&] { cache.length(2); }, ErrorCode::kInvalidArgument, "out of range");
  expect_error([&] { cache.reserved("weights"); }, ErrorCode::kInvalidArgument, "weights");
  EXPECT_FALSE(cache.in_step());
  good_step({2, 1});  // exactly to max_seq
  EXPECT_EQ(cache.length(0), 32);
  cache.truncate_slot(0, 10);
  good_step({1, 1});
  EXPECT_EQ(cache.length(0), 11);
  cache.reset_slot(1);
  good_step({0, 5});
  EXPECT_EQ(cache.length(1), 5);
}

TEST(BadConfig, NamesTheField) {
  auto with = [](const std::function<void(CacheConfig&)>& change) {
    CacheConfig c = config();
    change(c);
    return c;
  };
  expect_error([&] { OffloadedStaticCache(with([](CacheConfig& c) { c.layers = 0; })); },
               ErrorCode::kInvalidArgument, "layers must be positive, got 0");
  expect_error([&] { OffloadedStaticCache(with([](CacheConfig& c) { c.head_dim = -4; })); },
               ErrorCode::kInvalidArgument, "head_dim must be positive, got -4");
  expect_error([&] { OffloadedStaticCache(with([](CacheConfig& c) { c.kv_heads = 0; })); },
               ErrorCode::kInvalidArgument, "kv_heads");
  expect_error([&] { OffloadedStaticCache(with([](CacheConfig& c) { c.max_seq = 0; })); },
               ErrorCode::kInvalidArgument, "max_seq");
  expect_error([&] { OffloadedStaticCache(with([](CacheConfig& c) { c.slots = -1; })); },
               ErrorCode::kInvalidArgument, "slots");
  expect_error([&] { OffloadedStaticCache(with([](CacheConfig& c) { c.ring_depth = 0; })); },
               ErrorCode::kInvalidArgument, "ring_depth");
  expect_error([&] { OffloadedStaticCache(with([](CacheConfig& c) { c.resident_layers = 9; })); },
               ErrorCode::kInvalidArgument, "resident_layers");
  expect_error(
      [&] {
        OffloadedStaticCache(with([](CacheConfig& c) { c.reserved = {{"a", 1}, {"a", 2}}; }));
      },
      ErrorCode::kInvalidArgument, "listed twice");
  expect_error(
      [&] {
        OffloadedStaticCache(with([](CacheConfig& c) {
          c.layers = 1 << 20;
          c.max_seq = 1 << 30;
          c.slots = 1 << 20;
        }));
      },
      ErrorCode::kInvalidArgument, "overflow");
}

TEST(BadConfig, ABudgetThatCannotFitNamesTheMissingBytes) {
  CacheConfig c = config();
  c.resident_layers = kAutoResidentLayers;
  const std::uint64_t layer = 2ull * kSlots * kMaxSeq * kRow;
  c.device_budget = 2 * layer - 100;  // a ring of 2 needs 2 * layer
  expect_error([&] { OffloadedStaticCache cache(c); }, ErrorCode::kOutOfMemory, "missing 100 B");
  c.resident_layers = 3;
  c.device_budget = 4 * layer;  // 3 resident + 2 ring = 5 layers
  expect_error([&] { OffloadedStaticCache cache(c); }, ErrorCode::kOutOfMemory, "missing");
  c.device_budget = 5 * layer;
  OffloadedStaticCache fits(c);
  EXPECT_EQ(fits.stats().plan.device_bytes, 5 * layer);
}

// A stream the host backend did not make, or one it destroyed, is refused: running it on the
// calling thread would hide the very ordering the host backend exists to check.
TEST(BadStream, UnknownAndDestroyedHandlesAreRefusedAndChangeNothing) {
  OffloadedStaticCache cache(config());
  void* stream = cache.create_stream();
  cache.destroy_stream(stream);
  int not_a_stream = 0;
  cache.begin_step({1, 0});
  for (void* bad : {stream, static_cast<void*>(&not_a_stream)}) {
    expect_error([&] { cache.acquire(0, bad); }, ErrorCode::kInvalidArgument,
                 "not a stream of this host-backend cache");
    EXPECT_THROW(cache.synchronize_stream(bad), Error);
    expect_error([&] { cache.destroy_stream(bad); }, ErrorCode::kInvalidArgument,
                 "not a stream this cache made");
    EXPECT_THROW(cache.launch_host_func(
                     bad, [](void*) {}, nullptr),
                 Error);
  }
  // Nothing changed: the step goes on with a good stream. `rows` outlives the stream, which
  // drains when it is destroyed, so a failure that leaves the test early frees them after.
  const std::vector<std::uint8_t> rows = rows_for(0, 0, 0, 0, 1);
  CacheStream good(cache);
  for (int layer = 0; layer < kLayers; ++layer) {
    cache.acquire(layer, good.get());
    EXPECT_THROW(cache.append(layer, 0, rows.data(), rows.data(), 1, &not_a_stream), Error);
    cache.append(layer, 0, rows.data(), rows.data(), 1, good.get());
    EXPECT_THROW(cache.release(layer, &not_a_stream), Error);
    cache.release(layer, good.get());
  }
  cache.end_step();
  cache.synchronize_stream(good.get());  // the appends read `rows` until the stream runs them
  EXPECT_EQ(cache.length(0), 1);
}

TEST(BadConfig, AHostStoreLargerThanTheMachineIsRefusedBeforeAllocating) {
  CacheConfig c;
  c.layers = 32;
  c.max_seq = 1 << 20;
  c.slots = 64;  // 8 TiB of host K/V
  c.resident_layers = 0;
  c.backend = BackendKind::kHost;
  expect_error([&] { OffloadedStaticCache cache(c); }, ErrorCode::kOutOfMemory, "available");
}

TEST(BadConfig, AskingForCudaWithoutADeviceIsAClearError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  CacheConfig c = config();
  c.backend = BackendKind::kCuda;
  try {
    OffloadedStaticCache cache(c);
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kDevice);
    EXPECT_NE(std::string(e.what()).find("host backend"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kvo
