// The equivalence test on the CUDA backend: real streams, events and copy engines. Skipped where
// there is no GPU.
#include <gtest/gtest.h>

#include "cuda_required.hpp"
#include "prefetch/cache_driver.hpp"
#include "prefetch/slow_reader.hpp"

namespace kvo {
namespace {

using testing::CacheUnderTest;

void run_equivalence(int max_seq, int steps, std::uint64_t seed) {
  CacheConfig base;
  base.layers = 6;
  base.kv_heads = 4;
  base.head_dim = 32;
  base.max_seq = max_seq;
  base.slots = 3;
  base.dtype = DType::kBF16;
  base.backend = BackendKind::kCuda;
  const std::size_t max_append = static_cast<std::size_t>(max_seq) * 4 * 32 * 2;
  std::vector<std::unique_ptr<CacheUnderTest>> caches;
  for (auto [resident, ring] : {std::pair{0, 2}, {2, 2}, {0, 3}, {6, 2}}) {
    CacheConfig config = base;
    config.resident_layers = resident;
    config.ring_depth = ring;
    caches.push_back(std::make_unique<CacheUnderTest>(config, true, max_append));
  }
  testing::DriverOptions options;
  options.steps = steps;
  options.max_prefill = max_seq / 2;
  options.reorder_probability = 0.1;  // beam search's reorders: resident rows through the device
  testing::drive(caches, seed, options);
  for (auto& c : caches) {
    EXPECT_EQ(c->failures(), 0) << c->name();
    EXPECT_GT(c->checks(), 0) << c->name();
  }
  EXPECT_GT(caches[0]->cache().stats().h2d_bytes_total, 0u);
  EXPECT_EQ(caches[3]->cache().stats().h2d_bytes_total, 0u);
}

TEST(CudaCache, EveryAcquireMatchesTheReference) {
  KVO_SKIP_WITHOUT_CUDA();
  for (std::uint64_t seed = 1; seed <= 4; ++seed) run_equivalence(256, 40, seed);
}

TEST(CudaCache, LongPrefixes) {
  KVO_SKIP_WITHOUT_CUDA();
  run_equivalence(8192, 12, 77);
}

TEST(CudaCache, PinnedStoreAndOneDeviceAllocation) {
  KVO_SKIP_WITHOUT_CUDA();
  CacheConfig config;
  config.layers = 8;
  config.max_seq = 1024;
  config.resident_layers = 2;
  config.backend = BackendKind::kCuda;
  OffloadedStaticCache cache(config);
  EXPECT_EQ(cache.backend(), BackendKind::kCuda);
  EXPECT_EQ(cache.stats().device_allocations, 1u);
  EXPECT_EQ(cache.stats().plan.device_bytes, 4 * cache.stats().plan.layer_bytes);
}

// Write-after-read, made observable: each layer's attention is a kernel that spins for
// milliseconds before it copies its view, while releasing the layer lets the ring refill the same
// buffer with the layer two ahead (and, near the end of a step, with the next step's first
// layers). The copies must show the layer's own rows: a prefetch that did not wait for the
// caller's release (or for the write-back that waits for it) would overwrite the buffer
// mid-read. Every layer's rows carry its own bit pattern; the cache only moves bytes.
TEST(CudaCache, ASlowReaderSeesItsOwnLayerWhileTheRingRefills) {
  KVO_SKIP_WITHOUT_CUDA();
  CacheConfig config;
  config.layers = 6;
  config.kv_heads = 2;
  config.head_dim = 64;
  config.max_seq = 1024;
  config.dtype = DType::kBF16;
  config.resident_layers = 0;
  config.ring_depth = 2;
  config.backend = BackendKind::kCuda;
  const std::size_t row = static_cast<std::size_t>(config.kv_heads) * config.head_dim;
  const int prompt = 600;
  const int steps = 5;
  config.reserved = {
      {"rows", 2 * static_cast<std::uint64_t>(prompt) * row * 2},
      {"copies", static_cast<std::uint64_t>(config.layers) * config.max_seq * row * 2}};
  OffloadedStaticCache cache(config);
  void* stream = cache.create_stream();
  auto* rows = static_cast<std::uint16_t*>(cache.reserved("rows"));
  auto* copies = static_cast<std::uint16_t*>(cache.reserved("copies"));
  // K element e of token t of layer l: a pattern unique to (l, t, e).
  const auto pattern = [&](int layer, int token, std::size_t e) {
    return static_cast<std::uint16_t>((layer * 7919 + token * 131 + static_cast<int>(e)) & 0xffff);
  };
  std::vector<std::uint16_t> host_rows;
  int length = 0;
  for (int step = 0; step < steps; ++step) {
    const int n = step == 0 ? prompt : 1;
    cache.begin_step({n});
    for (int layer = 0; layer < config.layers; ++layer) {
      const LayerView view = cache.acquire(layer, stream);
      cache.synchronize_stream(stream);  // the staging rows below are free again
      host_rows.resize(2 * static_cast<std::size_t>(n) * row);
      for (int t = 0; t < n; ++t) {
        for (std::size_t e = 0; e < row; ++e) {
          host_rows[static_cast<std::size_t>(t) * row + e] = pattern(layer, length + t, e);
          host_rows[(static_cast<std::size_t>(n + t)) * row + e] = 0;  // V: not checked
        }
      }
      cache.copy_to_device(rows, host_rows.data(), host_rows.size() * 2);
      cache.append(layer, 0, rows, rows + static_cast<std::size_t>(n) * row, n, stream);
      // About 2 ms at 2 GHz: far longer than the ring's copies of these few hundred KiB.
      testing::slow_copy(static_cast<const std::uint16_t*>(view.k),
                         copies + static_cast<std::size_t>(layer) * config.max_seq * row,
                         static_cast<std::size_t>(length + n) * row, 4000000, stream);
      cache.release(layer, stream);
    }
    cache.end_step();
    cache.synchronize_stream(stream);
    length += n;
    std::vector<std::uint16_t> seen(static_cast<std::size_t>(length) * row);
    for (int layer = 0; layer < config.layers; ++layer) {
      cache.copy_to_host(seen.data(),
                         copies + static_cast<std::size_t>(layer) * config.max_seq * row,
                         seen.size() * 2);
      int wrong = 0;
      for (int t = 0; t < length; ++t) {
        for (std::size_t e = 0; e < row; ++e) {
          wrong += seen[static_cast<std::size_t>(t) * row + e] != pattern(layer, t, e);
        }
      }
      EXPECT_EQ(wrong, 0) << "step " << step << ", layer " << layer;
    }
  }
  EXPECT_GT(cache.stats().h2d_bytes_total, 0u);
  cache.destroy_stream(stream);
}

// A failed kernel leaves a sticky error that every later CUDA call reports. The stall probes'
// cudaEventQuery must raise it, not take it for a wait still in flight and go on as if nothing
// happened. In a child process (the context cannot be used after a trap).
TEST(CudaCacheDeathTest, AStickyErrorIsRaisedNotTakenForAWaitInFlight) {
  KVO_SKIP_WITHOUT_CUDA();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        CacheConfig config;
        config.layers = 4;
        config.kv_heads = 2;
        config.head_dim = 64;
        config.max_seq = 64;
        config.resident_layers = 0;
        config.backend = BackendKind::kCuda;
        OffloadedStaticCache cache(config);
        void* stream = cache.create_stream();
        cache.begin_step({0});
        cache.acquire(0, stream);  // a measured wait: a stall probe pending on the stream
        testing::trap(stream);
        try {
          cache.synchronize_stream(stream);  // the trap surfaces here
        } catch (const Error&) {
        }
        try {
          cache.stats();  // harvests the pending probe: must raise the sticky error
        } catch (const Error& e) {
          std::exit(e.code() == ErrorCode::kDevice ? 0 : 2);
        }
        std::exit(1);
      },
      ::testing::ExitedWithCode(0), "");
}

}  // namespace
}  // namespace kvo
