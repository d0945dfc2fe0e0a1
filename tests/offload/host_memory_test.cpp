// The whole plan against this machine's memory: on the host backend the "device" arena is host
// memory too, so both parts count, and the remedy must be one that works there. Refused before
// anything is allocated.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "expect_error.hpp"
#include "kvoffload/kvoffload.hpp"
#include "kvoffload/planner.hpp"
#include "offload/store/host_memory.hpp"
#include "prefetch/backend/host_backend.hpp"

namespace kvo {
namespace {

using kvo::testing::expect_error;

CachePlan plan_of(std::uint64_t device, std::uint64_t host) {
  CachePlan p;
  p.device_bytes = device;
  p.host_bytes = host;
  p.streamed_layers = 16;
  return p;
}

TEST(HostMemory, TheHostBackendCountsTheArenaToo) {
  const std::uint64_t gib = 1ull << 30;
  // 16.9 GiB of "device" plus 15 GiB of store on a 22 GiB machine: each part fits, the sum
  // does not.
  const CachePlan p = plan_of(17 * gib, 15 * gib);
  EXPECT_NO_THROW(offload::require_host_memory(p, BackendKind::kCuda, 22 * gib));
  expect_error([&] { offload::require_host_memory(p, BackendKind::kHost, 22 * gib); },
               ErrorCode::kOutOfMemory,
               "the plan needs 32.00 GiB (34359738368 bytes) of host memory (17.00 GiB "
               "(18253611008 bytes) for the device arena, which is host memory on the host "
               "backend, and 15.00 GiB (16106127360 bytes) for the KV store) but this machine has "
               "22.00 GiB (23622320128 bytes) available: missing 10.00 GiB");
  expect_error([&] { offload::require_host_memory(p, BackendKind::kHost, 22 * gib); },
               ErrorCode::kOutOfMemory, "keeping layers resident does not reduce it");
  EXPECT_NO_THROW(offload::require_host_memory(p, BackendKind::kHost, 32 * gib));
}

TEST(HostMemory, OnCudaTheStoreAloneCountsAndMoreResidentLayersHelp) {
  const std::uint64_t gib = 1ull << 30;
  const CachePlan p = plan_of(20 * gib, 30 * gib);
  expect_error([&] { offload::require_host_memory(p, BackendKind::kCuda, 22 * gib); },
               ErrorCode::kOutOfMemory,
               "the pinned host KV store needs 30.00 GiB (32212254720 bytes) (16 streamed layers) "
               "but this machine has 22.00 GiB (23622320128 bytes) available: missing 8.00 GiB");
  expect_error([&] { offload::require_host_memory(p, BackendKind::kCuda, 22 * gib); },
               ErrorCode::kOutOfMemory, "Keep more layers resident on the device");
  // A real plan also says what would fit: a million tokens of Llama-3-8B's shape in fp8, every
  // layer streamed, is 66 GiB of store; 50 GiB holds 50 GiB / (32 x 2 x 1056) tokens.
  CacheConfig c;
  c.layers = 32;
  c.kv_heads = 8;
  c.head_dim = 128;
  c.max_seq = 1 << 20;
  c.dtype = DType::kFP8E4M3;
  c.resident_layers = 0;
  c.backend = BackendKind::kCuda;
  const CachePlan million = plan_cache(c, 0);
  EXPECT_EQ(million.row_bytes, 1056u);
  expect_error([&] { offload::require_host_memory(million, BackendKind::kCuda, 50 * gib); },
               ErrorCode::kOutOfMemory,
               "(here it holds at most " + std::to_string(50 * gib / (32 * 2 * 1056)) +
                   " tokens per slot for 1 slot)");
}

TEST(HostMemory, ACacheBeyondThisMachineIsRefusedBeforeAllocating) {
  // kvo-replay's shape with 16 layers resident, scaled past any machine: 2^30 tokens of
  // Llama-3-8B's KV shape is 4 TiB per layer.
  CacheConfig c;
  c.backend = BackendKind::kHost;
  c.max_seq = 1 << 30;
  c.resident_layers = 16;
  const std::uint64_t before = prefetch::HostBackend::allocations_in_process();
  expect_error([&] { OffloadedStaticCache cache(c); }, ErrorCode::kOutOfMemory,
               "for the device arena, which is host memory on the host backend, and 64.00 TiB "
               "(70368744177664 bytes) for the KV store) but this machine has");
  EXPECT_EQ(prefetch::HostBackend::allocations_in_process(), before);
  // A cache that fits allocates, and the counter sees it: the check above is not vacuous.
  c.max_seq = 64;
  { OffloadedStaticCache cache(c); }
  EXPECT_GT(prefetch::HostBackend::allocations_in_process(), before);
}

// What the machine can give: on a virtual machine whose memory is handed over as it is used,
// MemAvailable starts far below MemTotal while little is committed, and the store must not be
// refused for it; where programs reserve more than they touch, Committed_AS passes MemTotal and
// MemAvailable is the floor.
TEST(HostMemory, AvailableIsTheLargerOfTwoFloors) {
  const offload::MemInfo growing = offload::parse_meminfo(
      "MemTotal:       131072000 kB\nMemFree:         8000000 kB\n"
      "MemAvailable:    8388608 kB\nCommitted_AS:    2097152 kB\n");
  EXPECT_EQ(growing.total, 131072000ull * 1024);
  EXPECT_EQ(growing.available, 8388608ull * 1024);
  EXPECT_EQ(growing.committed, 2097152ull * 1024);
  EXPECT_EQ(offload::available_bytes(growing), (131072000ull - 2097152ull) * 1024);
  const offload::MemInfo overcommitted = {16ull << 30, 10ull << 30, 30ull << 30};
  EXPECT_EQ(offload::available_bytes(overcommitted), 10ull << 30);
  // Lines it does not know, and malformed ones, are skipped.
  const offload::MemInfo odd =
      offload::parse_meminfo("Hugepagesize: 2048 kB\nMemTotal: x kB\nMemAvailable: 4 kB\n");
  EXPECT_EQ(odd.total, 0u);
  EXPECT_EQ(odd.available, 4096u);
  // And this machine's figure is at least its MemAvailable.
  EXPECT_GT(host_available_bytes(), 0u);
}

// A stated figure replaces /proc/meminfo's (a virtual machine whose MemTotal starts far below
// what it gives): a store above it is refused, one under it is not, and an unreadable one is an
// error naming the variable, never a silent fallback.
TEST(HostMemory, AStatedFigureReplacesTheMachines) {
  struct Unset {
    ~Unset() { unsetenv("KVO_HOST_MEMORY"); }
  } unset;
  ASSERT_EQ(setenv("KVO_HOST_MEMORY", "96GiB", 1), 0);
  EXPECT_EQ(host_available_bytes(), 96ull << 30);
  ASSERT_EQ(setenv("KVO_HOST_MEMORY", "1MiB", 1), 0);
  CacheConfig c;
  c.layers = 2;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.max_seq = 4096;  // 4 MiB of store at bf16
  c.resident_layers = 0;
  expect_error([&] { OffloadedStaticCache cache(c); }, ErrorCode::kOutOfMemory,
               "but this machine has 1.00 MiB");
  ASSERT_EQ(setenv("KVO_HOST_MEMORY", "lots", 1), 0);
  expect_error([] { host_available_bytes(); }, ErrorCode::kInvalidArgument, "KVO_HOST_MEMORY: ");
  ASSERT_EQ(setenv("KVO_HOST_MEMORY", "64MiB", 1), 0);
  OffloadedStaticCache fits(c);
  const CachePlan& plan = fits.stats().plan;
  EXPECT_GT(plan.device_bytes + plan.host_bytes, 1ull << 20);  // what 1 MiB refused
}

// Ranks of one node share its memory: each checks its store against its share, says so when it
// does not fit, and reports the share and its heads in the plan.
TEST(HostMemory, EachRankOfANodeGetsItsShare) {
  struct Unset {
    ~Unset() { unsetenv("KVO_HOST_MEMORY"); }
  } unset;
  ASSERT_EQ(setenv("KVO_HOST_MEMORY", "6MiB", 1), 0);
  CacheConfig c;
  c.layers = 2;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.max_seq = 4096;  // 4 MiB of K/V at bf16: host memory, all of it, on the host backend
  c.resident_layers = 0;
  c.backend = BackendKind::kHost;
  c.shard.kv_head_begin = 2;
  c.shard.model_kv_heads = 4;
  OffloadedStaticCache alone(c);
  EXPECT_EQ(alone.stats().plan.host_share_bytes, 6ull << 20);
  EXPECT_EQ(alone.stats().plan.kv_head_begin, 2);
  EXPECT_EQ(alone.stats().plan.model_kv_heads, 4);
  c.shard.ranks_per_node = 2;
  expect_error([&] { OffloadedStaticCache cache(c); }, ErrorCode::kOutOfMemory,
               "but this rank's share of the node (its available memory / 2 ranks) is 3.00 MiB");
  ASSERT_EQ(setenv("KVO_HOST_MEMORY", "12MiB", 1), 0);
  OffloadedStaticCache shared(c);
  EXPECT_EQ(shared.stats().plan.host_share_bytes, 6ull << 20);
  EXPECT_EQ(shared.stats().plan.ranks_per_node, 2);
  // The node's memory as the ranks measured it together, before any allocated, replaces what
  // this one would find now.
  c.shard.node_available_bytes = 6ull << 20;
  expect_error([&] { OffloadedStaticCache cache(c); }, ErrorCode::kOutOfMemory,
               "(its available memory / 2 ranks) is 3.00 MiB");
}

TEST(HostMemory, AShardOutsideTheModelIsRefused) {
  CacheConfig c;
  c.layers = 2;
  c.kv_heads = 2;
  c.head_dim = 16;
  c.max_seq = 64;
  c.backend = BackendKind::kHost;
  const char* needle = "CacheConfig.shard holds KV heads [kv_head_begin, kv_head_begin + kv_heads)";
  c.shard.kv_head_begin = 3;
  c.shard.model_kv_heads = 4;  // [3, 5) of 4
  expect_error([&] { validate(c); }, ErrorCode::kInvalidArgument, needle);
  c.shard.model_kv_heads = 0;  // a begin without a model
  expect_error([&] { validate(c); }, ErrorCode::kInvalidArgument, needle);
  c.shard.kv_head_begin = -1;
  c.shard.model_kv_heads = 4;
  expect_error([&] { validate(c); }, ErrorCode::kInvalidArgument, needle);
  c.shard.kv_head_begin = 2;
  c.shard.ranks_per_node = 0;
  expect_error([&] { validate(c); }, ErrorCode::kInvalidArgument,
               "CacheConfig.shard.ranks_per_node must be from 1 to 4096, got 0");
  c.shard.ranks_per_node = 2;
  validate(c);  // [2, 4) of 4 on one of two ranks
}

}  // namespace
}  // namespace kvo
