// cuBLAS, loaded when the CUDA path first needs it, not when a program starts: libcublas and
// libcublasLt map about 700 MB of address space, which a run on the host backend (or a tool that
// never computes on a GPU) should not pay, and could not under a tight `ulimit -v`.
//
// The entry points the CUDA path calls are looked up once (dlopen of the toolkit's
// libcublas.so.<major>, by the loader's search path and then the toolkit's library folder found
// at build time); model/cuda/cuda_ops.cpp calls them through api(). Only compiled with CUDA.
#pragma once

#include <cublas_v2.h>

namespace kvo::model::cublas {

struct Api {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  // The C declarations (C++ adds overloads of these two, so they are spelled out).
  using GemmEx = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int,
                                    int, const void*, const void*, cudaDataType, int, const void*,
                                    cudaDataType, int, const void*, void*, cudaDataType, int,
                                    cublasComputeType_t, cublasGemmAlgo_t);
  using GemmStridedBatchedEx = cublasStatus_t (*)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*, const void*,
      cudaDataType, int, long long int, const void*, cudaDataType, int, long long int, const void*,
      void*, cudaDataType, int, long long int, int, cublasComputeType_t, cublasGemmAlgo_t);
  GemmEx gemm_ex = nullptr;
  GemmStridedBatchedEx gemm_strided_batched_ex = nullptr;
};

// The loaded entry points. Throws kvo::Error(kDevice) naming the library and the loader's reason
// when cuBLAS cannot be loaded or lacks one of them.
const Api& api();

}  // namespace kvo::model::cublas
