// HostBackend: the schedule's executor where there is no GPU. Each stream is one worker thread
// fed through a lock-free single-producer queue; "device memory" is host memory under a cap, so
// every byte count and budget is exact. Copies can be delayed at random to shake out ordering
// bugs: a correct schedule gives identical results under any delays.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>

#include "prefetch/backend/backend.hpp"

namespace kvo::prefetch {

class HostStream;

class HostBackend final : public Backend {
 public:
  // device_capacity: bytes alloc_device may hand out in total (0: unlimited).
  HostBackend(const HostBackendOptions& options, std::uint64_t device_capacity);
  ~HostBackend() override;

  BackendKind kind() const override { return BackendKind::kHost; }
  void* alloc_device(std::size_t bytes) override;
  void free_device(void* ptr) noexcept override;
  void* alloc_host(std::size_t bytes) override;
  void free_host(void* ptr) noexcept override;
  std::uint64_t device_free_bytes() override;
  std::uint64_t default_budget() override { return 0; }  // unlimited

  StreamHandle create_stream() override;
  bool destroy_stream(StreamHandle stream) noexcept override;
  void check_stream(StreamHandle stream) const override { (void)async_stream(stream); }
  EventHandle create_event() override;
  void destroy_event(EventHandle event) noexcept override;

  void copy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream) override;
  void record(EventHandle event, StreamHandle stream) override;
  void wait(StreamHandle stream, EventHandle event) override;
  void wait_measured(StreamHandle stream, EventHandle event) override;
  // Host blocks until `event`'s last record has completed (how synchronize_all drains).
  void synchronize_event(EventHandle event) override;
  void synchronize_stream(StreamHandle stream) override;
  void launch_host_func(StreamHandle stream, void (*fn)(void*), void* arg) override;
  void synchronize_all() override;
  void copy_sync(void* dst, const void* src, std::size_t bytes) override;
  double stall_seconds() override;
  MemoryCounters memory() const override;

  // Successful alloc_device and alloc_host calls of every HostBackend in this process, so that a
  // test can prove that a refusal came before anything was allocated.
  static std::uint64_t allocations_in_process();

  // Bytes the workers actually copied (not what the schedule says it asked for).
  std::uint64_t copied_bytes() const { return copied_bytes_.load(); }

 private:
  // nullptr is the calling thread (synchronous), nullptr is returned; a stream this backend made
  // is returned; any other handle (a destroyed stream, a CUDA stream) throws
  // kvo::Error(kInvalidArgument): running it synchronously would hide the very ordering bugs
  // this backend exists to catch.
  HostStream* async_stream(StreamHandle stream) const;
  void wait_impl(StreamHandle stream, EventHandle event, bool measured);

  HostBackendOptions options_;
  std::uint64_t device_capacity_;
  std::uint64_t streams_made_ = 0;
  mutable std::mutex mutex_;  // guards streams_ and the device cap's check-and-add
  std::set<HostStream*> streams_;
  offload::AllocationLedger ledger_;
  std::atomic<std::uint64_t> copied_bytes_{0};
  std::atomic<std::uint64_t> stall_ns_{0};
};

}  // namespace kvo::prefetch
