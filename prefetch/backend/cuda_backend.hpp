// CudaBackend: pinned host memory, device memory, non-blocking streams and timing-free events.
// Every call makes `device` current for its duration and restores the caller's device.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <mutex>
#include <set>

#include "prefetch/backend/backend.hpp"

namespace kvo::prefetch {

class CudaBackend final : public Backend {
 public:
  // Throws kvo::Error(kDevice) when `device` is not a usable CUDA device.
  explicit CudaBackend(int device);
  ~CudaBackend() override;

  BackendKind kind() const override { return BackendKind::kCuda; }
  void* alloc_device(std::size_t bytes) override;
  void free_device(void* ptr) noexcept override;
  void* alloc_host(std::size_t bytes) override;
  void free_host(void* ptr) noexcept override;
  std::uint64_t device_free_bytes() override;
  std::uint64_t default_budget() override;

  StreamHandle create_stream() override;
  bool destroy_stream(StreamHandle stream) noexcept override;
  void check_stream(StreamHandle stream) const override;
  EventHandle create_event() override;
  void destroy_event(EventHandle event) noexcept override;

  void copy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream) override;
  void record(EventHandle event, StreamHandle stream) override;
  void wait(StreamHandle stream, EventHandle event) override;
  void wait_measured(StreamHandle stream, EventHandle event) override;
  void synchronize_event(EventHandle event) override;
  void synchronize_stream(StreamHandle stream) override;
  void launch_host_func(StreamHandle stream, void (*fn)(void*), void* arg) override;
  void synchronize_all() override;
  void copy_sync(void* dst, const void* src, std::size_t bytes) override;
  double stall_seconds() override;
  MemoryCounters memory() const override;

 private:
  // A pair of timing events around one measured wait, read back once both have completed.
  struct StallProbe {
    cudaEvent_t start = nullptr;
    cudaEvent_t end = nullptr;
    bool pending = false;
  };
  // Adds the probes that have completed to stall_ms_; never blocks.
  void harvest_probes();
  void destroy_probes() noexcept;

  int device_;
  cudaStream_t copy_stream_ = nullptr;  // copy_sync's own stream: ordered and waited on
  static constexpr std::size_t kProbes = 128;
  std::array<StallProbe, kProbes> probes_{};
  std::size_t next_probe_ = 0;
  double stall_ms_ = 0;
  offload::AllocationLedger ledger_;
  mutable std::mutex streams_mutex_;  // guards made_ and destroyed_
  std::set<StreamHandle> made_;       // streams this backend made and has not destroyed
  std::set<StreamHandle> destroyed_;  // streams it destroyed (until the handle is made again)
};

}  // namespace kvo::prefetch
