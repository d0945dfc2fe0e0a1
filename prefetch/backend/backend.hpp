// The executor the schedule runs on: streams, events, asynchronous copies, host waits. Two
// implementations, each also the cache's offload::MemoryResource: CudaBackend (streams, events,
// cudaMemcpyAsync) and HostBackend (worker threads). Stream and Event own their handles.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "kvoffload/config.hpp"
#include "kvoffload/types.hpp"
#include "offload/store/memory.hpp"

namespace kvo::prefetch {

// Raw handles, as callers pass them: a cudaStream_t / cudaEvent_t on CUDA, backend objects on
// the host. nullptr is the legacy default stream on CUDA and the calling thread on the host.
using StreamHandle = void*;
using EventHandle = void*;
using offload::MemoryCounters;

class Backend : public offload::MemoryResource {
 public:
  virtual BackendKind kind() const = 0;

  virtual StreamHandle create_stream() = 0;
  // Waits for the stream's work and frees it. nullptr is a no-op (true); false, and nothing done,
  // for a handle this backend did not make or has destroyed already.
  virtual bool destroy_stream(StreamHandle stream) noexcept = 0;
  virtual EventHandle create_event() = 0;
  virtual void destroy_event(EventHandle event) noexcept = 0;
  // Throws kvo::Error(kInvalidArgument) for a stream handle this backend cannot use: one it
  // destroyed, on either backend; on the host backend also one it did not make; on CUDA one the
  // runtime does not know. nullptr is always valid. Every call below that takes a stream checks
  // it so.
  virtual void check_stream(StreamHandle stream) const = 0;

  // Copies `bytes` from src to dst after the work already enqueued on `stream`. Throws
  // kvo::Error(kInternal) when the two ranges overlap (cudaMemcpyAsync leaves that undefined).
  virtual void copy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream) = 0;
  // Marks the point in `stream` reached by the work enqueued so far.
  virtual void record(EventHandle event, StreamHandle stream) = 0;
  // Work enqueued on `stream` after this call starts once `event`'s last record has completed.
  virtual void wait(StreamHandle stream, EventHandle event) = 0;
  // As wait(), and adds the time `stream` is held by it to stall_seconds(). For acquire.
  virtual void wait_measured(StreamHandle stream, EventHandle event) = 0;
  // Host blocks until `event`'s last record has completed (at once if never recorded).
  virtual void synchronize_event(EventHandle event) = 0;
  // Host blocks until `stream` is drained.
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
};

// A stream of a backend, owned: destroyed (after its work) with its owner. Move-only.
class Stream {
 public:
  Stream() = default;
  explicit Stream(Backend& backend) : backend_(&backend), handle_(backend.create_stream()) {}
  ~Stream() { reset(); }
  Stream(Stream&& other) noexcept : backend_(other.backend_), handle_(other.release()) {}
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      reset();
      backend_ = other.backend_;
      handle_ = other.release();
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  StreamHandle get() const { return handle_; }
  void reset() noexcept {
    if (handle_ != nullptr) backend_->destroy_stream(handle_);
    handle_ = nullptr;
  }

 private:
  StreamHandle release() noexcept { return std::exchange(handle_, nullptr); }
  Backend* backend_ = nullptr;
  StreamHandle handle_ = nullptr;
};

// An event of a backend, owned. Move-only.
class Event {
 public:
  Event() = default;
  explicit Event(Backend& backend) : backend_(&backend), handle_(backend.create_event()) {}
  ~Event() { reset(); }
  Event(Event&& other) noexcept : backend_(other.backend_), handle_(other.release()) {}
  Event& operator=(Event&& other) noexcept {
    if (this != &other) {
      reset();
      backend_ = other.backend_;
      handle_ = other.release();
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  EventHandle get() const { return handle_; }
  void reset() noexcept {
    if (handle_ != nullptr) backend_->destroy_event(handle_);
    handle_ = nullptr;
  }

 private:
  EventHandle release() noexcept { return std::exchange(handle_, nullptr); }
  Backend* backend_ = nullptr;
  EventHandle handle_ = nullptr;
};

// The message for a driver older than the CUDA runtime this library was built with (versions as
// cudaDriverGetVersion and cudaRuntimeGetVersion give them: 12040 is CUDA 12.4).
std::string driver_too_old(int driver_version, int runtime_version);

// Throws kvo::Error(kInternal) when [dst, dst + bytes) and [src, src + bytes) overlap: a copy
// within one buffer (a window layer's rows moving to its front) must come in pieces that do not.
void check_disjoint(const void* dst, const void* src, std::size_t bytes);

// Makes the backend `config.backend` asks for (kAuto: CUDA when usable, else host).
std::unique_ptr<Backend> make_backend(const CacheConfig& config);

}  // namespace kvo::prefetch
