#include "prefetch/backend/cuda_backend.hpp"

#include <cstdint>
#include <string>

#include "kvoffload/error.hpp"
#include "kvoffload/plan.hpp"
#include "prefetch/backend/cuda_check.hpp"

namespace kvo::prefetch {

void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  cudaGetLastError();  // clear a sticky-free error so that later calls are not blamed for it
  const ErrorCode code =
      status == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kDevice;
  throw Error(code, std::string(call) + " failed: " + cudaGetErrorName(status) + " (" +
                        cudaGetErrorString(status) + ") at " + file + ":" + std::to_string(line));
}

namespace {

// Makes `device` current for one scope and puts the caller's device back. A failure to switch
// throws (never go on silently on the wrong device), except in the noexcept release paths,
// which pass check = false and do their best.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device, bool check = true) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      const cudaError_t status = cudaSetDevice(device);
      if (status == cudaSuccess) {
        restore_ = true;
      } else if (check) {
        cuda_check(status, "cudaSetDevice(device)", __FILE__, __LINE__);
      }
    }
  }
  ~DeviceGuard() {
    if (restore_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool restore_ = false;
};

cudaStream_t as_stream(StreamHandle stream) {
  return static_cast<cudaStream_t>(stream);
}
cudaEvent_t as_event(EventHandle event) {
  return static_cast<cudaEvent_t>(event);
}

}  // namespace

CudaBackend::CudaBackend(int device) : device_(device) {
  const int count = cuda_device_count();  // throws for a driver too old or a broken setup
  if (count == 0) {
    throw Error(ErrorCode::kDevice,
                "no CUDA device (no NVIDIA driver, or no GPU visible); use the host backend "
                "(--backend host)");
  }
  if (device < 0 || device >= count) {
    throw Error(ErrorCode::kInvalidArgument, "CUDA device " + std::to_string(device) +
                                                 " does not exist (found " + std::to_string(count) +
                                                 ")");
  }
  DeviceGuard guard(device_);
  try {
    KVO_CUDA_CHECK(cudaSetDevice(device_));
    for (StallProbe& probe : probes_) {
      KVO_CUDA_CHECK(cudaEventCreate(&probe.start));
      KVO_CUDA_CHECK(cudaEventCreate(&probe.end));
    }
    KVO_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  } catch (...) {
    destroy_probes();
    throw;
  }
}

void CudaBackend::destroy_probes() noexcept {
  for (StallProbe& probe : probes_) {
    if (probe.start != nullptr) cudaEventDestroy(probe.start);
    if (probe.end != nullptr) cudaEventDestroy(probe.end);
    probe = StallProbe{};
  }
  if (copy_stream_ != nullptr) cudaStreamDestroy(copy_stream_);
  copy_stream_ = nullptr;
}

CudaBackend::~CudaBackend() {
  DeviceGuard guard(device_, false);
  destroy_probes();
}

void* CudaBackend::alloc_device(std::size_t bytes) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  const cudaError_t status = cudaMalloc(&ptr, bytes);
  if (status != cudaSuccess) {
    cudaGetLastError();
    std::size_t free_bytes = 0, total_bytes = 0;
    cudaMemGetInfo(&free_bytes, &total_bytes);
    throw Error(ErrorCode::kOutOfMemory,
                "cudaMalloc of " + format_bytes(bytes) + " failed (" + cudaGetErrorString(status) +
                    "); the device has " + format_bytes(free_bytes) + " free of " +
                    format_bytes(total_bytes) + ": lower the budget or max_seq");
  }
  // Zeroed once, before any stream of the cache touches it (the copy streams do not wait on the
  // legacy stream cudaMemset runs on, so the host waits here).
  const cudaError_t zeroed = cudaMemset(ptr, 0, bytes);
  const cudaError_t synced = zeroed == cudaSuccess ? cudaDeviceSynchronize() : zeroed;
  if (synced != cudaSuccess) {
    cudaFree(ptr);
    KVO_CUDA_CHECK(synced);
  }
  ledger_.add(ptr, bytes, offload::AllocationLedger::Kind::kDevice);
  return ptr;
}

void CudaBackend::free_device(void* ptr) noexcept {
  if (ptr == nullptr) return;
  DeviceGuard guard(device_, false);
  cudaFree(ptr);
  ledger_.remove(ptr);
}

void* CudaBackend::alloc_host(std::size_t bytes) {
  DeviceGuard guard(device_);
  void* ptr = nullptr;
  const cudaError_t status = cudaHostAlloc(&ptr, bytes, cudaHostAllocPortable);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kOutOfMemory,
                "cudaHostAlloc could not pin " + format_bytes(bytes) +
                    " of host memory for the KV store (" + cudaGetErrorString(status) +
                    "); lower max_seq or slots, keep more layers resident, or raise the "
                    "locked-memory limit (ulimit -l)");
  }
  ledger_.add(ptr, bytes, offload::AllocationLedger::Kind::kHost);
  return ptr;
}

void CudaBackend::free_host(void* ptr) noexcept {
  if (ptr == nullptr) return;
  DeviceGuard guard(device_, false);
  cudaFreeHost(ptr);
  ledger_.remove(ptr);
}

std::uint64_t CudaBackend::device_free_bytes() {
  DeviceGuard guard(device_);
  std::size_t free_bytes = 0, total_bytes = 0;
  KVO_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

std::uint64_t CudaBackend::default_budget() {
  DeviceGuard guard(device_);
  std::size_t free_bytes = 0, total_bytes = 0;
  KVO_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return default_device_budget(free_bytes, total_bytes);
}

StreamHandle CudaBackend::create_stream() {
  DeviceGuard guard(device_);
  cudaStream_t stream = nullptr;
  KVO_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  std::lock_guard<std::mutex> lock(streams_mutex_);
  made_.insert(stream);
  destroyed_.erase(stream);  // the runtime may hand out a destroyed stream's handle again
  return stream;
}

bool CudaBackend::destroy_stream(StreamHandle stream) noexcept {
  if (stream == nullptr) return true;
  {
    // Only streams made here: a caller's own stream (torch's, say) is never destroyed.
    std::lock_guard<std::mutex> lock(streams_mutex_);
    if (made_.erase(stream) == 0) return false;
    destroyed_.insert(stream);
  }
  DeviceGuard guard(device_, false);
  cudaStreamSynchronize(as_stream(stream));
  cudaStreamDestroy(as_stream(stream));
  return true;
}

void CudaBackend::check_stream(StreamHandle stream) const {
  // nullptr and the special handles cudaStreamLegacy (1) and cudaStreamPerThread (2).
  if (reinterpret_cast<std::uintptr_t>(stream) <= 2) return;
  {
    std::lock_guard<std::mutex> lock(streams_mutex_);
    if (made_.count(stream) > 0) return;
    if (destroyed_.count(stream) > 0) {
      throw Error(ErrorCode::kInvalidArgument,
                  "stream handle was destroyed (destroy_stream) and cannot be used");
    }
  }
  // The caller's own stream (torch's, say): the runtime must know it.
  DeviceGuard guard(device_);
  unsigned int flags = 0;
  const cudaError_t status = cudaStreamGetFlags(as_stream(stream), &flags);
  if (status != cudaSuccess) {
    cudaGetLastError();
    throw Error(ErrorCode::kInvalidArgument, std::string("stream handle is not a CUDA stream (") +
                                                 cudaGetErrorName(status) + ")");
  }
}

EventHandle CudaBackend::create_event() {
  DeviceGuard guard(device_);
  cudaEvent_t event = nullptr;
  KVO_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  return event;
}

void CudaBackend::destroy_event(EventHandle event) noexcept {
  if (event == nullptr) return;
  DeviceGuard guard(device_, false);
  cudaEventDestroy(as_event(event));
}

void CudaBackend::copy_async(void* dst, const void* src, std::size_t bytes, StreamHandle stream) {
  if (bytes == 0) return;
  check_disjoint(dst, src, bytes);
  DeviceGuard guard(device_);
  KVO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, as_stream(stream)));
}

void CudaBackend::record(EventHandle event, StreamHandle stream) {
  DeviceGuard guard(device_);
  KVO_CUDA_CHECK(cudaEventRecord(as_event(event), as_stream(stream)));
}

void CudaBackend::wait(StreamHandle stream, EventHandle event) {
  DeviceGuard guard(device_);
  KVO_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
}

void CudaBackend::wait_measured(StreamHandle stream, EventHandle event) {
  DeviceGuard guard(device_);
  StallProbe& probe = probes_[next_probe_];
  if (probe.pending) harvest_probes();
  if (probe.pending) {  // still in flight: leave this wait unmeasured rather than block
    KVO_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
    return;
  }
  KVO_CUDA_CHECK(cudaEventRecord(probe.start, as_stream(stream)));
  KVO_CUDA_CHECK(cudaStreamWaitEvent(as_stream(stream), as_event(event), 0));
  KVO_CUDA_CHECK(cudaEventRecord(probe.end, as_stream(stream)));
  probe.pending = true;
  next_probe_ = (next_probe_ + 1) % kProbes;
}

void CudaBackend::harvest_probes() {
  for (StallProbe& probe : probes_) {
    if (!probe.pending) continue;
    // Not ready is the one expected answer; anything else (a sticky error from a failed
    // kernel, say) is an error, not a wait still in flight.
    const cudaError_t status = cudaEventQuery(probe.end);
    if (status == cudaErrorNotReady) continue;
    KVO_CUDA_CHECK(status);
    float ms = 0;
    KVO_CUDA_CHECK(cudaEventElapsedTime(&ms, probe.start, probe.end));
    stall_ms_ += ms;
    probe.pending = false;
  }
}

void CudaBackend::synchronize_event(EventHandle event) {
  DeviceGuard guard(device_);
  KVO_CUDA_CHECK(cudaEventSynchronize(as_event(event)));
}

void CudaBackend::synchronize_stream(StreamHandle stream) {
  DeviceGuard guard(device_);
  KVO_CUDA_CHECK(cudaStreamSynchronize(as_stream(stream)));
}

void CudaBackend::launch_host_func(StreamHandle stream, void (*fn)(void*), void* arg) {
  DeviceGuard guard(device_);
  KVO_CUDA_CHECK(cudaLaunchHostFunc(as_stream(stream), fn, arg));
}

// On a stream of its own and waited for: plain cudaMemcpy may return before a pageable
// host-to-device copy has landed, and the legacy stream does not order non-blocking streams.
void CudaBackend::copy_sync(void* dst, const void* src, std::size_t bytes) {
  DeviceGuard guard(device_);
  KVO_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, copy_stream_));
  KVO_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
}

void CudaBackend::synchronize_all() {
  DeviceGuard guard(device_);
  KVO_CUDA_CHECK(cudaDeviceSynchronize());
}

double CudaBackend::stall_seconds() {
  DeviceGuard guard(device_);
  harvest_probes();
  return stall_ms_ * 1e-3;
}

MemoryCounters CudaBackend::memory() const {
  return ledger_.counters();
}

}  // namespace kvo::prefetch
