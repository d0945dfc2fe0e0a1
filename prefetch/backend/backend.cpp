#include "prefetch/backend/backend.hpp"

#include <cstdint>
#include <string>

#include "kvoffload/error.hpp"
#include "prefetch/backend/host_backend.hpp"
#ifdef KVO_WITH_CUDA
#include <cuda_runtime_api.h>

#include "prefetch/backend/cuda_backend.hpp"
#endif

namespace kvo {

int cuda_device_count() {
#ifdef KVO_WITH_CUDA
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status == cudaSuccess) return count;
  cudaGetLastError();
  if (status == cudaErrorNoDevice) return 0;
  int driver = 0;
  int runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  // No NVIDIA driver at all reads as "insufficient driver" with version 0: a machine without a
  // GPU, not a broken one.
  if (status == cudaErrorInsufficientDriver && driver == 0) return 0;
  if (status == cudaErrorInsufficientDriver) {
    throw Error(ErrorCode::kDevice, prefetch::driver_too_old(driver, runtime));
  }
  throw Error(ErrorCode::kDevice, std::string("cudaGetDeviceCount failed: ") +
                                      cudaGetErrorName(status) + " (" + cudaGetErrorString(status) +
                                      "); fix the CUDA setup, or use the host backend");
#else
  return 0;
#endif
}

BackendKind resolve_backend(BackendKind kind) {
  if (kind != BackendKind::kAuto) return kind;
  return cuda_device_count() > 0 ? BackendKind::kCuda : BackendKind::kHost;
}

namespace prefetch {

std::string driver_too_old(int driver_version, int runtime_version) {
  const auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  const int branch = runtime_version >= 13000 ? 580 : runtime_version >= 12000 ? 525 : 450;
  return "the NVIDIA driver supports CUDA " + version(driver_version) +
         ", but this build of kvoffload uses the CUDA " + version(runtime_version) +
         " runtime, which needs a driver for CUDA " + version(runtime_version) + " or newer (r" +
         std::to_string(branch) + "+ on Linux): update the driver, or use the host backend";
}

void check_disjoint(const void* dst, const void* src, std::size_t bytes) {
  const auto d = reinterpret_cast<std::uintptr_t>(dst);
  const auto s = reinterpret_cast<std::uintptr_t>(src);
  if (bytes > 0 && (d < s ? s - d : d - s) < bytes) {
    throw Error(ErrorCode::kInternal, "copy_async: the " + std::to_string(bytes) +
                                          "-byte ranges of source and destination overlap");
  }
}

std::unique_ptr<Backend> make_backend(const CacheConfig& config) {
  const BackendKind kind = resolve_backend(config.backend);
  if (kind == BackendKind::kCuda) {
#ifdef KVO_WITH_CUDA
    return std::make_unique<CudaBackend>(config.device);
#else
    throw Error(ErrorCode::kDevice,
                "this build of kvoffload has no CUDA support (configured with "
                "KVO_WITH_CUDA=OFF); use the host backend");
#endif
  }
  return std::make_unique<HostBackend>(config.host, config.device_budget);
}

}  // namespace prefetch
}  // namespace kvo
