// Element-wise and row-wise kernels of a decoder layer: embedding, RMSNorm, RoPE, conversions to
// and from the cache dtype, bias, SwiGLU. Kernels first, then launchers.
#include "model/cuda_check.hpp"
#include "model/kernels.hpp"

namespace kvo::model::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void embed_kernel(const std::int32_t* tokens, const void* table, Elem type, int hidden,
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

__global__ void rms_norm_kernel(const float* x, int hidden, const void* weight, Elem type,
                                float eps, float* out) {
  __shared__ float shared[32];
  const float* xi = x + static_cast<std::int64_t>(blockIdx.x) * hidden;
  float sum = 0;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) sum += xi[j] * xi[j];
  sum = block_sum(sum, shared);
  const float scale = rsqrtf(sum / hidden + eps);
  float* oi = out + static_cast<std::int64_t>(blockIdx.x) * hidden;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
    oi[j] = load_elem(weight, j, type) * (xi[j] * scale);
  }
}

// One block per row; threads over (head, pair) of q then k.
__global__ void rope_kernel(float* q, float* k, int heads, int kv_heads, int head_dim,
                            const float* inv_freq, const std::int32_t* positions,
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
    const float a = x[i];
    const float b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

__global__ void convert_kernel(const float* x, std::int64_t count, void* out, Elem type) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    store_elem(out, i, type, x[i]);
  }
}

__global__ void widen_kernel(const void* x, std::int64_t count, Elem type, float* out) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    out[i] = load_elem(x, i, type);
  }
}

__global__ void add_bias_kernel(float* y, std::int64_t count, int out, const void* bias,
                                Elem type) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    y[i] += load_elem(bias, i % out, type);
  }
}

__global__ void swiglu_kernel(float* gate, const float* up, std::int64_t count) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

unsigned grid_for(std::int64_t count) {
  const std::int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

}  // namespace

void embed(const std::int32_t* tokens, int n, const void* table, Elem type, int hidden, float* out,
           cudaStream_t stream) {
  if (n == 0) return;
  embed_kernel<<<n, kThreads, 0, stream>>>(tokens, table, type, hidden, out);
  KVO_MODEL_LAUNCH_CHECK();
}

void rms_norm(const float* x, int n, int hidden, const void* weight, Elem type, float eps,
              float* out, cudaStream_t stream) {
  if (n == 0) return;
  rms_norm_kernel<<<n, kThreads, 0, stream>>>(x, hidden, weight, type, eps, out);
  KVO_MODEL_LAUNCH_CHECK();
}

void rope(float* q, float* k, int n, int heads, int kv_heads, int head_dim, const float* inv_freq,
          const std::int32_t* positions, int first_position, cudaStream_t stream) {
  if (n == 0) return;
  rope_kernel<<<n, kThreads, 0, stream>>>(q, k, heads, kv_heads, head_dim, inv_freq, positions,
                                          first_position);
  KVO_MODEL_LAUNCH_CHECK();
}

void convert(const float* x, std::int64_t count, void* out, Elem type, cudaStream_t stream) {
  if (count == 0) return;
  convert_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, out, type);
  KVO_MODEL_LAUNCH_CHECK();
}

void widen(const void* x, std::int64_t count, Elem type, float* out, cudaStream_t stream) {
  if (count == 0) return;
  widen_kernel<<<grid_for(count), kThreads, 0, stream>>>(x, count, type, out);
  KVO_MODEL_LAUNCH_CHECK();
}

void add_bias(float* y, int n, int out, const void* bias, Elem type, cudaStream_t stream) {
  const std::int64_t count = static_cast<std::int64_t>(n) * out;
  if (count == 0) return;
  add_bias_kernel<<<grid_for(count), kThreads, 0, stream>>>(y, count, out, bias, type);
  KVO_MODEL_LAUNCH_CHECK();
}

void swiglu(float* gate, const float* up, std::int64_t count, cudaStream_t stream) {
  if (count == 0) return;
  swiglu_kernel<<<grid_for(count), kThreads, 0, stream>>>(gate, up, count);
  KVO_MODEL_LAUNCH_CHECK();
}

}  // namespace kvo::model::cuda
