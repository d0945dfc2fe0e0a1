#include <cuda_runtime_api.h>

#include <string>

#include "kvoffload/error.hpp"
#include "prefetch/slow_reader.hpp"

namespace kvo::testing {
namespace {

__global__ void slow_copy_kernel(const std::uint16_t* src, std::uint16_t* dst, std::size_t count,
                                 long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  for (std::size_t i = blockIdx.x * static_cast<std::size_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    dst[i] = src[i];
  }
}

__global__ void trap_kernel() {
  __trap();
}

}  // namespace

void trap(void* stream) {
  trap_kernel<<<1, 1, 0, static_cast<cudaStream_t>(stream)>>>();
}

void slow_copy(const std::uint16_t* src, std::uint16_t* dst, std::size_t count, long long cycles,
               void* stream) {
  slow_copy_kernel<<<4, 256, 0, static_cast<cudaStream_t>(stream)>>>(src, dst, count, cycles);
  const cudaError_t status = cudaGetLastError();
  if (status != cudaSuccess) {
    throw Error(ErrorCode::kDevice, std::string("slow_copy_kernel: ") + cudaGetErrorString(status));
  }
}

}  // namespace kvo::testing
