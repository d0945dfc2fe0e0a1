// One check for CUDA runtime calls: throws kvo::Error(kDevice) with the call, file and line.
// Only compiled where the CUDA toolkit is present (KVO_WITH_CUDA).
#pragma once

#include <cuda_runtime_api.h>

namespace kvo::prefetch {

// Throws kvo::Error: kOutOfMemory for cudaErrorMemoryAllocation, kDevice for any other error.
void cuda_check(cudaError_t status, const char* call, const char* file, int line);

}  // namespace kvo::prefetch

#define KVO_CUDA_CHECK(call) ::kvo::prefetch::cuda_check((call), #call, __FILE__, __LINE__)
