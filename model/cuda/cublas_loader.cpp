#include "model/cuda/cublas_loader.hpp"

#include <dlfcn.h>

#include <mutex>
#include <string>

#include "kvoffload/error.hpp"

namespace kvo::model::cublas {

namespace {

template <typename Fn>
void bind(void* library, const char* name, Fn& out, const std::string& from) {
  out = reinterpret_cast<Fn>(::dlsym(library, name));
  if (out == nullptr) {
    throw Error(ErrorCode::kDevice, from + " has no " + name +
                                        " (a cuBLAS older than the one "
                                        "this build was made with?)");
  }
}

Api load() {
  std::string tried;
  void* library = nullptr;
  for (const char* name : {KVO_CUBLAS_SONAME, KVO_CUBLAS_DIR "/" KVO_CUBLAS_SONAME}) {
    library = ::dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (library != nullptr) break;
    const char* why = ::dlerror();
    tried += std::string(tried.empty() ? "" : "; ") + (why != nullptr ? why : name);
  }
  if (library == nullptr) {
    throw Error(ErrorCode::kDevice, "cannot load cuBLAS (" KVO_CUBLAS_SONAME
                                    "), which the CUDA path computes its "
                                    "GEMMs with: " +
                                        tried +
                                        ". Install the CUDA toolkit's cuBLAS, or run with "
                                        "--backend host");
  }
  const std::string from = KVO_CUBLAS_SONAME;
  Api api;
  bind(library, "cublasCreate_v2", api.create, from);
  bind(library, "cublasDestroy_v2", api.destroy, from);
  bind(library, "cublasSetStream_v2", api.set_stream, from);
  bind(library, "cublasSetWorkspace_v2", api.set_workspace, from);
  bind(library, "cublasSetMathMode", api.set_math_mode, from);
  bind(library, "cublasGemmEx", api.gemm_ex, from);
  bind(library, "cublasGemmStridedBatchedEx", api.gemm_strided_batched_ex, from);
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

const Api& api() {
  static std::once_flag once;
  static Api loaded;
  std::call_once(once, [] { loaded = load(); });
  return loaded;
}

}  // namespace kvo::model::cublas
