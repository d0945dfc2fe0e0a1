// The small executor interface the schedule runs on: allocate, copy asynchronously on a stream,
// record an event, make a stream wait an event, wait on the host. Two implementations:
// CudaBackend (streams, events, cudaMemcpyAsync) and HostBackend (worker threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvoffload/config.hpp"
#include "kvoffload/types.hpp"

namespace kvo::prefetch {

// Opaque handles: a cudaStream_t / cudaEvent_t on CUDA, backend objects on the host.
using StreamHandle = void*;
using EventHandle = void*;

struct MemoryCounters {
  std::uint64_t device_allocations = 0;  // calls to alloc_device that succeeded
  std::uint64_t device_bytes = 0;        // currently allocated
  std::uint64_t device_peak_bytes = 0;
  std::uint64_t host_bytes = 0;  // currently allocated through alloc_host
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual BackendKind kind() const = 0;

  // Device memory. alloc_device throws kvo::Error(kOutOfMemory) naming `bytes`.
  virtual void* alloc_device(std::size_t bytes) = 0;
  virtual void free_device(void* ptr) noexcept = 0;
  // Host memory for the store: pinned on CUDA, page-aligned on the host backend. Throws
  // kvo::Error(kOutOfMemory) naming `bytes` and the remedy.
  virtual void* alloc_host(std::size_t bytes) = 0;
  virtual void free_host(void* ptr) noexcept = 0;
  // Free device bytes right now (CUDA: cudaMemGetInfo; host: unlimited -> UINT64_MAX).
  virtual std::uint64_t device_free_bytes() = 0;
  // The budget of a cache whose config leaves it at 0: on CUDA, default_device_budget() of the
  // device's memory right now; on the host backend 0 (unlimited).
  virtual std::uint64_t default_budget() = 0;

  virtual StreamHandle create_stream() = 0;
  virtual void destroy_stream(StreamHandle stream) noexcept = 0;
  virtual EventHandle create_event() = 0;
  virtual void destroy_event(EventHandle event) noexcept = 0;

  // Copies `bytes` from src to dst after the work already enqueued on `stream`.
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream) = 0;
  // Marks the point in `stream` reached by the work enqueued so far.
  virtual void record(EventHandle event, StreamHandle stream) = 0;
  // Work enqueued on `stream` after this call starts once `event`'s last record has completed.
  virtual void wait(StreamHandle stream, EventHandle event) = 0;
  // As wait(), and adds the time `stream` is held by it to stall_seconds(). For acquire.
  virtual void wait_measured(StreamHandle stream, EventHandle event) = 0;
  // Host blocks until `event`'s last record has completed / until `stream` is drained.
  virtual void synchronize_event(EventHandle event) = 0;
  virtual void synchronize_stream(StreamHandle stream) = 0;
  // fn must not call into the backend or the cache (as with cudaLaunchHostFunc).
  virtual void launch_host_func(StreamHandle stream, void (*fn)(void*), void* arg) = 0;
  // Host blocks until every stream this backend made (and, on CUDA, the device) is idle.
  virtual void synchronize_all() = 0;
  // Blocking copies for tools and tests (not on the hot path).
  virtual void copy_sync(void* dst, const void* src, std::size_t bytes) = 0;

  // Total time wait_measured() held streams, counting the waits that have completed; never
  // blocks. Exact once the streams that waited are idle.
  virtual double stall_seconds() = 0;

  virtual MemoryCounters memory() const = 0;
};

// The message for a driver older than the CUDA runtime this library was built with (versions as
// cudaDriverGetVersion and cudaRuntimeGetVersion give them: 12040 is CUDA 12.4).
std::string driver_too_old(int driver_version, int runtime_version);

// Makes the backend `config.backend` asks for (kAuto: CUDA when usable, else host).
std::unique_ptr<Backend> make_backend(const CacheConfig& config);

}  // namespace kvo::prefetch
