// The CUDA path: cuBLAS for every projection (f32 accumulation; bf16/f16 weights take their
// input converted to the same type), kernels for the rest. Everything is ordered on one stream
// and uses only the workspace planned with the cache.
#include "model/cuda_ops.hpp"

#include <algorithm>

#include "model/cuda_check.hpp"
#include "model/kernels.hpp"
#include "model/memory_plan.hpp"

namespace kvo::model {
namespace {

Elem elem(DType d) {
  return static_cast<Elem>(static_cast<int>(d));
}

cudaDataType_t cuda_type(DType d) {
  return d == DType::kF32 ? CUDA_R_32F : d == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
}

class CudaOps final : public Ops {
 public:
  CudaOps(const OpsShape& shape, void* stream, void* workspace)
      : shape_(shape),
        elem_(elem(shape.weight_dtype)),
        stream_(static_cast<cudaStream_t>(stream)),
        layout_(shape.config, shape.weight_dtype, shape.max_rows, shape.max_decode_rows) {
    auto* base = static_cast<std::byte*>(workspace);
    gemm_input_ = base + layout_.gemm_input;
    partials_ = reinterpret_cast<float*>(base + layout_.partials);
    KVO_MODEL_CUBLAS_CHECK(cublasCreate(&handle_));
    try {
      KVO_MODEL_CUBLAS_CHECK(cublasSetStream(handle_, stream_));
      KVO_MODEL_CUBLAS_CHECK(cublasSetWorkspace(handle_, base, kCublasWorkspaceBytes));
      KVO_MODEL_CUBLAS_CHECK(cublasSetMathMode(handle_, CUBLAS_DEFAULT_MATH));
    } catch (...) {
      cublasDestroy(handle_);
      throw;
    }
  }
  ~CudaOps() override { cublasDestroy(handle_); }

  void embed(const std::int32_t* tokens, int n, const void* table, float* out) override {
    cuda::embed(tokens, n, table, elem_, shape_.config.hidden_size, out, stream_);
  }
  void rms_norm(const float* x, int n, const void* weight, float* out) override {
    cuda::rms_norm(x, n, shape_.config.hidden_size, weight, elem_, shape_.config.rms_norm_eps, out,
                   stream_);
  }
  void linear(const float* x, int n, int in, const void* w, const void* bias, int out, float* y,
              bool accumulate) override {
    if (n == 0) return;
    const void* input = x;
    if (shape_.weight_dtype != DType::kF32) {
      cuda::convert(x, static_cast<std::int64_t>(n) * in, gemm_input_, elem_, stream_);
      input = gemm_input_;
    }
    const float alpha = 1.0f;
    const float beta = accumulate ? 1.0f : 0.0f;
    const cudaDataType_t type = cuda_type(shape_.weight_dtype);
    // Row-major y [n][out] = x [n][in] W^T is column-major y^T [out][n] = W^T [out][in] x^T.
    KVO_MODEL_CUBLAS_CHECK(cublasGemmEx(handle_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, w,
                                        type, in, input, type, in, &beta, y, CUDA_R_32F, out,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (bias != nullptr) cuda::add_bias(y, n, out, bias, elem_, stream_);
  }
  void rope(float* q, float* k, int n, const std::int32_t* positions, int first_position) override {
    const ModelConfig& c = shape_.config;
    cuda::rope(q, k, n, c.heads, c.kv_heads, c.head_dim, shape_.inv_freq, positions, first_position,
               stream_);
  }
  void to_cache_rows(const float* x, std::int64_t count, void* out) override {
    cuda::convert(x, count, out, elem_, stream_);
  }
  void attention_prefill(const float* q, int n, int slot, int first_position, const LayerView& view,
                         float* out) override {
    cuda::AttentionArgs a = args(q, n, view, out);
    a.slot = slot;
    a.first_position = first_position;
    cuda::attention(a, 1, partials_, stream_);
  }
  void attention_decode(const float* q, int n, const DecodeRows& rows, const LayerView& view,
                        float* out) override {
    cuda::AttentionArgs a = args(q, n, view, out);
    a.slots = rows.slots;
    a.positions = rows.positions;
    // Enough key ranges to fill the GPU when few rows decode over long prefixes.
    int longest = 0;
    for (int i = 0; i < n; ++i) longest = std::max(longest, rows.host_positions[i] + 1);
    const int splits = std::clamp(longest / 256, 1, kMaxAttentionSplits);
    cuda::attention(a, splits, partials_, stream_);
  }
  void swiglu(float* gate, const float* up, std::int64_t count) override {
    cuda::swiglu(gate, up, count, stream_);
  }

 private:
  cuda::AttentionArgs args(const float* q, int n, const LayerView& view, float* out) const {
    cuda::AttentionArgs a;
    a.q = q;
    a.out = out;
    a.n = n;
    a.heads = shape_.config.heads;
    a.kv_heads = shape_.config.kv_heads;
    a.head_dim = shape_.config.head_dim;
    a.sliding_window = shape_.config.sliding_window;
    a.k = view.k;
    a.v = view.v;
    a.type = elem(view.dtype);
    a.slot_stride = view.slot_stride;
    a.token_stride = view.token_stride;
    a.head_stride = view.head_stride;
    return a;
  }

  OpsShape shape_;
  Elem elem_;
  cudaStream_t stream_;
  WorkspaceLayout layout_;
  cublasHandle_t handle_ = nullptr;
  std::byte* gemm_input_ = nullptr;
  float* partials_ = nullptr;
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(const OpsShape& shape, void* stream, void* workspace) {
  return std::make_unique<CudaOps>(shape, stream, workspace);
}

void fill_synthetic_on_device(const WeightLayout& layout, const WeightEntry& entry,
                              std::uint64_t seed, void* dst, void* stream) {
  cuda::fill_synthetic(dst, entry.elements, elem(layout.dtype()), seed, entry.stream, entry.scale,
                       entry.kind == WeightKind::kNorm, static_cast<cudaStream_t>(stream));
}

std::uint64_t cuda_device_bytes_in_use() {
  std::size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return 0;
  return total - free_bytes;
}

}  // namespace kvo::model
