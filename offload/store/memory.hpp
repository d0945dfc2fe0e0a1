// Where a cache's bytes come from, as offload/ sees them: device memory for the arena, host
// memory for the store (pinned on CUDA), and an exact account of both. Each backend in prefetch/
// implements this beside the streams that move the bytes; offload/ knows only this interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>

namespace kvo::offload {

struct MemoryCounters {
  std::uint64_t device_allocations = 0;  // calls to alloc_device that succeeded
  std::uint64_t device_bytes = 0;        // currently allocated
  std::uint64_t device_peak_bytes = 0;
  std::uint64_t host_bytes = 0;  // currently allocated through alloc_host
};

class MemoryResource {
 public:
  virtual ~MemoryResource() = default;
  // Device memory, every byte zero (finite rows past any slot's length for a caller that reads
  // whole static buffers, kvoffload/torch.hpp's static shapes). alloc_device throws
  // kvo::Error(kOutOfMemory) naming `bytes`.
  virtual void* alloc_device(std::size_t bytes) = 0;
  virtual void free_device(void* ptr) noexcept = 0;
  // Host memory for the store: pinned on CUDA, page-aligned on the host backend. Throws
  // kvo::Error(kOutOfMemory) naming `bytes` and the remedy.
  virtual void* alloc_host(std::size_t bytes) = 0;
  virtual void free_host(void* ptr) noexcept = 0;
  // Free device bytes right now (CUDA: cudaMemGetInfo; host: what the cap leaves, or
  // UINT64_MAX without one).
  virtual std::uint64_t device_free_bytes() = 0;
  // The budget of a cache whose config leaves it at 0: on CUDA, default_device_budget() of the
  // device's memory right now; on the host backend 0 (unlimited).
  virtual std::uint64_t default_budget() = 0;
  virtual MemoryCounters memory() const = 0;
};

// The allocations of one MemoryResource: each pointer's size and kind, to give its bytes back,
// and the counters. Thread-safe.
class AllocationLedger {
 public:
  enum class Kind { kDevice, kHost };
  void add(void* ptr, std::size_t bytes, Kind kind);
  // Forgets `ptr` and takes its bytes off the counters; an unknown pointer is ignored.
  void remove(void* ptr) noexcept;
  MemoryCounters counters() const;

 private:
  struct Entry {
    std::size_t bytes;
    Kind kind;
  };
  mutable std::mutex mutex_;
  std::unordered_map<void*, Entry> entries_;
  MemoryCounters counters_;
};

}  // namespace kvo::offload
