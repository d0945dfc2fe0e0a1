// HostStore layout and lengths; DeviceArena regions.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "offload/store/device_arena.hpp"
#include "offload/store/host_store.hpp"
#include "prefetch/backend/host_backend.hpp"

namespace kvo::offload {
namespace {

CacheConfig shape() {
  CacheConfig c;
  c.layers = 6;
  c.kv_heads = 3;
  c.head_dim = 5;  // rows of 30 bytes in f16: nothing is a power of two
  c.max_seq = 7;
  c.slots = 4;
  c.dtype = DType::kF16;
  c.resident_layers = 2;
  c.ring_depth = 2;
  c.reserved = {{"weights", 1000}, {"scratch", 10}};
  return c;
}

TEST(HostStore, EachSlotsPrefixIsOneContiguousRange) {
  const CacheConfig c = shape();
  const CachePlan plan = plan_cache(c, 0);
  prefetch::HostBackend backend({}, 0);
  HostStore store(backend, plan);
  EXPECT_EQ(store.bytes(), plan.host_bytes);
  EXPECT_EQ(store.row_bytes(), 30u);
  EXPECT_EQ(plan.tensor_bytes, 1024u);  // 4 slots x 7 tokens x 30 bytes = 840, padded to 256
  for (int i = 0; i < plan.streamed_layers; ++i) {
    for (int s = 0; s + 1 < c.slots; ++s) {
      EXPECT_EQ(store.k(i, s + 1) - store.k(i, s), 7 * 30);  // [slot][token][row]
      EXPECT_EQ(store.v(i, s + 1) - store.v(i, s), 7 * 30);
    }
    EXPECT_EQ(store.v(i, 0) - store.k(i, 0), static_cast<std::ptrdiff_t>(plan.tensor_bytes));
    if (i > 0) {
      EXPECT_EQ(store.k(i, 0) - store.k(i - 1, 0), static_cast<std::ptrdiff_t>(plan.layer_bytes));
    }
  }
  // The last row of the last streamed layer ends inside the allocation.
  const int last = plan.streamed_layers - 1;
  EXPECT_LE(static_cast<std::size_t>(store.v(last, c.slots - 1) + 7 * 30 - store.k(0, 0)),
            store.bytes());
  EXPECT_EQ(backend.memory().host_bytes, (plan.host_bytes + 4095) / 4096 * 4096);
}

// Lengths belong to the cache (every layer's rows of a slot share one length), not to the store.
TEST(CacheLengths, ResetAndTruncate) {
  CacheConfig c = shape();
  c.backend = BackendKind::kHost;
  c.reserved.clear();
  OffloadedStaticCache cache(c);
  for (int s = 0; s < c.slots; ++s) EXPECT_EQ(cache.length(s), 0);
  const std::size_t row = plan_cache(c, 0).row_bytes;
  const std::vector<std::uint8_t> rows(6 * row);
  cache.begin_step({0, 6, 3, 0});
  for (int layer = 0; layer < c.layers; ++layer) {
    cache.acquire(layer);
    cache.append(layer, 1, rows.data(), rows.data(), 6);
    cache.append(layer, 2, rows.data(), rows.data(), 3);
    cache.release(layer);
  }
  cache.end_step();
  cache.truncate_slot(1, 4);
  EXPECT_THROW(cache.truncate_slot(2, 5), Error);  // never grows
  EXPECT_EQ(cache.length(1), 4);
  EXPECT_EQ(cache.length(2), 3);
  cache.reset_slot(1);
  EXPECT_EQ(cache.length(1), 0);
  cache.begin_step({0, 0, 0, 0});
  EXPECT_EQ(cache.acquire(0).lengths[2], 3);
}

TEST(DeviceArena, OneAllocationCarvedAsPlanned) {
  const CacheConfig c = shape();
  const CachePlan plan = plan_cache(c, 0);
  prefetch::HostBackend backend({}, plan.device_bytes);  // exactly the plan fits the cap
  {
    DeviceArena arena(backend, plan, c.reserved);
    EXPECT_EQ(backend.memory().device_allocations, 1u);
    EXPECT_EQ(backend.memory().device_bytes, plan.device_bytes);
    EXPECT_EQ(arena.resident_layer(1) - arena.resident_layer(0),
              static_cast<std::ptrdiff_t>(plan.layer_bytes));
    EXPECT_EQ(arena.staging_buffer(0) - arena.resident_layer(0),
              static_cast<std::ptrdiff_t>(plan.resident_bytes));
    EXPECT_EQ(arena.reserved("weights") - arena.resident_layer(0),
              static_cast<std::ptrdiff_t>(plan.resident_bytes + plan.staging_bytes));
    EXPECT_EQ(arena.reserved("scratch") - arena.reserved("weights"), 1024);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(arena.reserved("scratch")) % 256, 0u);
    EXPECT_THROW(arena.reserved("nope"), Error);
    // The cap is exact: one more byte does not fit.
    EXPECT_THROW(backend.alloc_device(1), Error);
  }
  EXPECT_EQ(backend.memory().device_bytes, 0u);
}

}  // namespace
}  // namespace kvo::offload
