// The host backend's streams and events keep CUDA's ordering guarantees under random delays; its
// large blocks lie on huge pages.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "offload/util/host_pages.hpp"
#include "prefetch/backend/host_backend.hpp"

namespace kvo::prefetch {
namespace {

HostBackendOptions delays(std::uint32_t max_us, std::uint64_t seed) {
  HostBackendOptions options;
  options.max_delay_us = max_us;
  options.delay_seed = seed;
  return options;
}

// The flags of the mapping that holds `p` (/proc/self/smaps' VmFlags: "hg" is MADV_HUGEPAGE,
// "nh" MADV_NOHUGEPAGE), or "" where the file does not say.
std::string mapping_flags(const void* p) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(p);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    unsigned long long lo = 0, hi = 0;
    char dash = 0;
    if (std::sscanf(line.c_str(), "%llx%c%llx", &lo, &dash, &hi) == 3 && dash == '-') {
      inside = lo <= at && at < hi;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line.substr(8) + " ";
    }
  }
  return "";
}

// The K/V store and the arena's blocks of 2 MiB and more start on a 2 MiB boundary and are
// advised as huge pages (the kernel's transparent huge pages then back them where it has them);
// smaller blocks keep their alignment. The ledger counts the bytes asked for, rounded as before.
TEST(HostBackend, LargeBlocksLieOnHugePages) {
  HostBackend backend(HostBackendOptions{}, 0);
  const std::size_t big = (std::size_t{5} << 20) + 4096 * 3;
  void* host = backend.alloc_host(big);
  void* device = backend.alloc_device(big);
  void* small = backend.alloc_host(12345);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(host) % kHugePageBytes, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(device) % kHugePageBytes, 0u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(small) % 4096, 0u);
  EXPECT_EQ(backend.memory().host_bytes, big + 16384);  // 12345 rounded to 4096s
  std::memset(host, 1, big);                            // all of it is there to write
  const bool have_thp = std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
  const std::string host_flags = mapping_flags(host), device_flags = mapping_flags(device);
  if (have_thp && !host_flags.empty()) {
    EXPECT_NE(host_flags.find(" hg "), std::string::npos) << host_flags;
    EXPECT_NE(device_flags.find(" hg "), std::string::npos) << device_flags;
  }
  backend.free_host(host);
  backend.free_device(device);
  backend.free_host(small);
  EXPECT_EQ(backend.memory().host_bytes, 0u);
}

TEST(HostBackend, CopiesOnOneStreamRunInOrder) {
  HostBackend backend(delays(30, 1), 0);
  StreamHandle stream = backend.create_stream();
  std::vector<int> value(64), target(64, -1);
  // Each copy overwrites the same target; only the last one may survive.
  std::vector<std::vector<int>> sources(200, std::vector<int>(64));
  for (std::size_t i = 0; i < sources.size(); ++i) {
    std::iota(sources[i].begin(), sources[i].end(), static_cast<int>(i * 1000));
    backend.copy_async(target.data(), sources[i].data(), 64 * sizeof(int), stream);
  }
  backend.synchronize_stream(stream);
  EXPECT_EQ(target, sources.back());
  EXPECT_EQ(backend.copied_bytes(), 200u * 64 * sizeof(int));
  backend.destroy_stream(stream);
}

TEST(HostBackend, AStreamWaitsForAnEventRecordedOnAnother) {
  HostBackend backend(delays(200, 2), 0);
  StreamHandle producer = backend.create_stream();
  StreamHandle consumer = backend.create_stream();
  EventHandle ready = backend.create_event();
  std::mt19937 rng(3);
  for (int round = 0; round < 40; ++round) {
    std::vector<std::uint8_t> source(4096), middle(4096, 0), sink(4096, 0);
    for (auto& b : source) b = static_cast<std::uint8_t>(rng());
    backend.copy_async(middle.data(), source.data(), source.size(), producer);  // delayed
    backend.record(ready, producer);
    backend.wait(consumer, ready);  // without this, sink would often see zeros
    backend.copy_async(sink.data(), middle.data(), middle.size(), consumer);
    backend.synchronize_stream(consumer);
    ASSERT_EQ(sink, source) << "round " << round;
    backend.synchronize_stream(producer);
  }
  backend.destroy_event(ready);
  backend.destroy_stream(producer);
  backend.destroy_stream(consumer);
}

TEST(HostBackend, AWaitTakesTheRecordCurrentWhenItIsEnqueued) {
  // As cudaStreamWaitEvent: a later record does not affect an earlier wait, and an event that
  // was never recorded does not block.
  HostBackend backend(delays(0, 0), 0);
  EventHandle never = backend.create_event();
  backend.synchronize_event(never);
  backend.wait(nullptr, never);
  StreamHandle stream = backend.create_stream();
  int counter = 0;
  backend.launch_host_func(
      stream, [](void* p) { ++*static_cast<int*>(p); }, &counter);
  backend.record(never, stream);
  backend.synchronize_event(never);
  EXPECT_EQ(counter, 1);  // the host function ran before the record completed
  backend.destroy_event(never);
  backend.destroy_stream(stream);
}

TEST(HostBackend, NullStreamIsTheCallingThread) {
  HostBackend backend(delays(100, 4), 0);
  int x = 0;
  backend.launch_host_func(
      nullptr, [](void* p) { *static_cast<int*>(p) = 7; }, &x);
  EXPECT_EQ(x, 7);  // ran synchronously
  int src = 42, dst = 0;
  backend.copy_async(&dst, &src, sizeof(int), nullptr);
  EXPECT_EQ(dst, 42);
}

// A copy whose ranges overlap is refused before anything is written (cudaMemcpyAsync leaves it
// undefined); ranges that touch, or a piece of a move that shifts by its own length, are fine.
TEST(HostBackend, ACopyOverlappingItselfIsRefused) {
  HostBackend backend(delays(0, 0), 0);
  std::vector<int> buffer(64);
  std::iota(buffer.begin(), buffer.end(), 0);
  const std::vector<int> before = buffer;
  for (const std::ptrdiff_t shift : {1, -1, 15, -15}) {
    try {
      backend.copy_async(buffer.data() + 16 + shift, buffer.data() + 16, 16 * sizeof(int), nullptr);
      FAIL() << "an overlap by " << 16 - std::abs(shift) << " ints was copied";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInternal);
      EXPECT_NE(std::string(e.what()).find("overlap"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(buffer, before);
  backend.copy_async(buffer.data(), buffer.data() + 16, 16 * sizeof(int), nullptr);
  EXPECT_EQ(buffer[0], 16);
  EXPECT_EQ(buffer[15], 31);
}

TEST(HostBackend, DeviceMemoryIsCappedAndCounted) {
  HostBackend backend(delays(0, 0), 4096);
  void* a = backend.alloc_device(1000);  // rounded to 1024
  void* b = backend.alloc_device(3072);
  EXPECT_EQ(backend.memory().device_bytes, 4096u);
  EXPECT_EQ(backend.memory().device_allocations, 2u);
  EXPECT_EQ(backend.device_free_bytes(), 0u);
  try {
    backend.alloc_device(1);
    FAIL() << "the cap was not enforced";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
  }
  backend.free_device(a);
  EXPECT_EQ(backend.memory().device_bytes, 3072u);
  EXPECT_EQ(backend.memory().device_peak_bytes, 4096u);
  backend.free_device(b);
  EXPECT_EQ(backend.memory().device_bytes, 0u);
}

TEST(HostBackend, DestroyingAStreamRunsWhatWasEnqueued) {
  HostBackend backend(delays(50, 5), 0);
  StreamHandle stream = backend.create_stream();
  std::vector<int> hits(100, 0);
  for (int& h : hits) {
    backend.launch_host_func(
        stream, [](void* p) { *static_cast<int*>(p) = 1; }, &h);
  }
  backend.destroy_stream(stream);
  EXPECT_EQ(std::accumulate(hits.begin(), hits.end(), 0), 100);
}

// A driver too old for the CUDA runtime is an error naming both versions, never "no GPU".
TEST(CudaSetup, ADriverTooOldNamesBothVersions) {
  const std::string message = driver_too_old(12040, 13000);
  EXPECT_NE(message.find("supports CUDA 12.4"), std::string::npos) << message;
  EXPECT_NE(message.find("CUDA 13.0 runtime"), std::string::npos) << message;
  EXPECT_NE(message.find("r580+"), std::string::npos) << message;
  EXPECT_NE(message.find("host backend"), std::string::npos) << message;
}

}  // namespace
}  // namespace kvo::prefetch
