// Element-wise and row-wise kernels of a decoder layer: embedding, RMSNorm, RoPE, conversions to
// and from the cache dtype, bias, SwiGLU. Kernels first, then launchers.
#include "model/cuda/cuda_check.hpp"
#include "model/cuda/kernels.hpp"

namespace kvo::model::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embed_kernel(const std::int32_t* tokens, const void* table, DType type, int hidden,
                             float* out) {
  const int row = blockIdx.x;
  const std::int64_t base = static_cast<std::int64_t>(tokens[row]) * hidden;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
    out[static_cast<std::int64_t>(row) * hidden + j] = load_elem(table, base + j, type);
  }
}

__device__ float block_sum(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (lane == 0) shared[warp] = value;
  __syncthreads();
  float total = 0;
  if (threadIdx.x < 32) {
    total = threadIdx.x < blockDim.x / 32 ? shared[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2)
      total += __shfl_xor_sync(0xffffffffu, total, offset);
    if (threadIdx.x == 0) shared[0] = total;
  }
  __syncthreads();
  total = shared[0];
  __syncthreads();
  return total;
}

__global__ void rms_norm_kernel(const float* x, int hidden, const void* weight, DType type,
                                float eps, float offset, float* out) {
  __shared__ float shared[32];
  const float* xi = x + static_cast<std::int64_t>(blockIdx.x) * hidden;
  float sum = 0;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) sum += xi[j] * xi[j];
  sum = block_sum(sum, shared);
  const float scale = rsqrtf(sum / hidden + eps);
  float* oi = out + static_cast<std::int64_t>(blockIdx.x) * hidden;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
    oi[j] = (offset + load_elem(weight, j, type)) * (xi[j] * scale);
  }
}

// One block per row; threads over (head, pair) of q then k.
__global__ void rope_kernel(float* q, float* k, int heads, int kv_heads, int head_dim,
                            const float* inv_freq, float scale, const std::int32_t* positions,
                            int first_position) {
  const int row = blockIdx.x;
  const int pos = positions != nullptr ? positions[row] : first_position + row;
  const int half = head_dim / 2;
  const int pairs = (heads + kv_heads) * half;
  for (int t = threadIdx.x; t < pairs; t += blockDim.x) {
    const int head = t / half;
    const int i = t % half;
    float* x = head < heads
                   ? q + (static_cast<std::int64_t>(row) * heads + head) * head_dim
                   : k + (static_cast<std::int64_t>(row) * kv_heads + (head - heads)) * head_dim;
    const float angle = static_cast<float>(pos) * inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    c *= scale;
    s *= scale;
    const float a = x[i];
    const float b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

__global__ void convert_kernel(const float* x, std::int64_t count, void* out, DType type) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    store_elem(out, i, type, x[i]);
  }
}

__global__ void widen_kernel(const void* x, std::int64_t count, DType type, float* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = load_elem(x, i, type);
  }
}

__global__ void add_bias_kernel(float* y, std::int64_t count, int out, const void* bias,
                                DType type) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    y[i] += load_elem(bias, i % out, type);
  }
}

__global__ void gated_activation_kernel(float* gate, const float* up, std::int64_t count,
                                        bool gelu) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    gate[i] = (gelu ? gelu_tanh(g) : g / (1.0f + expf(-g))) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, std::int64_t count, float scale) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] = __fadd_rn(x[i], __fmul_rn(y[i], scale));  // rounded, then added: as the host path
  }
}

__global__ void soft_cap_kernel(float* x, std::int64_t count, float cap) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] = soft_cap_value(x[i], cap);
  }
}

__global__ void scale_kernel(float* x, std::int64_t count, float factor) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= factor;
  }
}

// grid (n, kv_heads): one head of one row. The largest magnitude first (a max, exact in any
// order, starting from +0 as quantize_row does), then each element by the host's arithmetic.
// The first head's block also zeroes the padding before the scales.
__global__ void quantize_rows_kernel(const float* x, int kv_heads, int dim, DType dtype,
                                     std::int64_t row_bytes, std::uint8_t* out) {
  __shared__ float shared[32];
  const int head = blockIdx.y;
  const float* xh = x + (static_cast<std::int64_t>(blockIdx.x) * kv_heads + head) * dim;
  std::uint8_t* row = out + static_cast<std::int64_t>(blockIdx.x) * row_bytes;
  float amax = 0.0f;
  for (int e = threadIdx.x; e < dim; e += blockDim.x) {
    const float a = xh[e] < 0.0f ? -xh[e] : xh[e];
    amax = a > amax ? a : amax;
  }
  for (int offset = 16; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, amax, offset);
    amax = other > amax ? other : amax;
  }
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = shared[0];
  for (int w = 1; w < static_cast<int>(blockDim.x) / 32; ++w)
    amax = shared[w] > amax ? shared[w] : amax;
  const float scale = quant::scale_for(amax, dtype);
  const std::uint64_t scales_at = quant_scale_offset(kv_heads, dim);
  if (threadIdx.x == 0) reinterpret_cast<float*>(row + scales_at)[head] = scale;
  std::uint8_t* q = row + static_cast<std::int64_t>(head) * dim;
  for (int e = threadIdx.x; e < dim; e += blockDim.x) q[e] = quant::quantize(xh[e], scale, dtype);
  if (head == 0) {
    const std::uint64_t elements = static_cast<std::uint64_t>(kv_heads) * dim;
    for (std::uint64_t i = elements + threadIdx.x; i < scales_at; i += blockDim.x) row[i] = 0;
  }
}

unsigned grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace

void embed(const std::int32_t* tokens, int n, const void* table, DType type, int hidden, float* out,
           cudaStream_t stream) {
  if (n == 0) return;
  embed_kernel<<<n, kThreads, 0, stream>>>(tokens, table, type, hidden, out);
  KVO_MODEL_LAUNCH_CHECK();
}

void rms_norm(const float* x, int n, int hidden, const void* weight, DType type, float eps,
              float offset, float* out, cudaStream_t stream) {
  if (n == 0) return;
  rms_norm_kernel<<<n, kThreads, 0, stream>>>(x, hidden, weight, type, eps, offset, out);
  KVO_MODEL_LAUNCH_CHECK();
}

void rope(float* q, float* k, int n, int heads, int kv_heads, int head_dim, const float* inv_freq,
          float scale, const std::int32_t* positions, int first_position, cudaStream_t stream) {
  if (n == 0) return;
  rope_kernel<<<n, kThreads, 0, stream>>>(q, k, heads, kv_heads, head_dim, inv_freq, scale,
                                          positions, first_position);
  KVO_MODEL_LAUNCH_CHECK();
}

void convert(const float* x, std::int64_t count, void* out, DType type, cudaStream_t stream) {
  if (count == 0) return;
  convert_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, out, type);
  KVO_MODEL_LAUNCH_CHECK();
}

void quantize_rows(const float* x, int n, int kv_heads, int dim, DType type, std::int64_t row_bytes,
                   void* out, cudaStream_t stream) {
  if (n == 0) return;
  if (!is_quantized(type)) {
    throw Error(ErrorCode::kInternal, "quantize_rows: the cache dtype is not quantized");
  }
  const DType dtype = type == DType::kInt8 ? DType::kInt8 : DType::kFP8E4M3;
  quantize_rows_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(kv_heads)), 128, 0,
                         stream>>>(x, kv_heads, dim, dtype, row_bytes,
                                   static_cast<std::uint8_t*>(out));
  KVO_MODEL_LAUNCH_CHECK();
}

void widen(const void* x, std::int64_t count, DType type, float* out, cudaStream_t stream) {
  if (count == 0) return;
  widen_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, type, out);
  KVO_MODEL_LAUNCH_CHECK();
}

void add_bias(float* y, int n, int out, const void* bias, DType type, cudaStream_t stream) {
  const std::int64_t count = static_cast<std::int64_t>(n) * out;
  if (count == 0) return;
  add_bias_kernel<<<grid_for(count), kThreads, 0, stream>>>(y, count, out, bias, type);
  KVO_MODEL_LAUNCH_CHECK();
}

void gated_activation(float* gate, const float* up, std::int64_t count, bool gelu,
                      cudaStream_t stream) {
  if (count == 0) return;
  gated_activation_kernel<<<grid_for(count), kThreads, 0, stream>>>(gate, up, count, gelu);
  KVO_MODEL_LAUNCH_CHECK();
}

void add(float* x, const float* y, std::int64_t count, float scale, cudaStream_t stream) {
  if (count == 0) return;
  add_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, y, count, scale);
  KVO_MODEL_LAUNCH_CHECK();
}

void soft_cap(float* x, std::int64_t count, float cap, cudaStream_t stream) {
  if (count == 0) return;
  soft_cap_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, cap);
  KVO_MODEL_LAUNCH_CHECK();
}

void scale(float* x, std::int64_t count, float factor, cudaStream_t stream) {
  if (count == 0) return;
  scale_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, factor);
  KVO_MODEL_LAUNCH_CHECK();
}

}  // namespace kvo::model::cuda
