#include "prefetch/backend.hpp"

#include "kvoffload/error.hpp"
#include "prefetch/host_backend.hpp"
#ifdef KVO_WITH_CUDA
#include <cuda_runtime_api.h>

#include "prefetch/cuda_backend.hpp"
#endif

namespace kvo {

int cuda_device_count() {
#ifdef KVO_WITH_CUDA
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return count;
#else
  return 0;
#endif
}

BackendKind resolve_backend(BackendKind kind) {
  if (kind != BackendKind::kAuto) return kind;
  return cuda_device_count() > 0 ? BackendKind::kCuda : BackendKind::kHost;
}

namespace prefetch {

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
