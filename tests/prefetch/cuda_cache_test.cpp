// The equivalence test on the CUDA backend: real streams, events and copy engines. Skipped where
// there is no GPU.
#include <gtest/gtest.h>

#include "cuda_required.hpp"
#include "prefetch/cache_driver.hpp"

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

}  // namespace
}  // namespace kvo
