// Checks for CUDA runtime and cuBLAS calls in model/: throw kvo::Error(kDevice) naming the call,
// file and line. Only compiled with CUDA.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>

#include "kvoffload/error.hpp"

namespace kvo::model {

inline void cuda_check(cudaError_t status, const char* call, const char* file, int line) {
  if (status == cudaSuccess) return;
  throw Error(status == cudaErrorMemoryAllocation ? ErrorCode::kOutOfMemory : ErrorCode::kDevice,
              std::string(call) + " failed: " + cudaGetErrorString(status) + " (" + file + ":" +
                  std::to_string(line) + ")");
}

inline void cublas_check(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw Error(ErrorCode::kDevice, std::string(call) + " failed: cuBLAS status " +
                                      std::to_string(static_cast<int>(status)) + " (" + file + ":" +
                                      std::to_string(line) + ")");
}

}  // namespace kvo::model

#define KVO_MODEL_CUDA_CHECK(call) ::kvo::model::cuda_check((call), #call, __FILE__, __LINE__)
#define KVO_MODEL_CUBLAS_CHECK(call) ::kvo::model::cublas_check((call), #call, __FILE__, __LINE__)
// After every kernel launch.
#define KVO_MODEL_LAUNCH_CHECK() KVO_MODEL_CUDA_CHECK(cudaGetLastError())
