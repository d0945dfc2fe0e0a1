// Launchers of the model's CUDA kernels (defined in kernels_*.cu). Every pointer is device
// memory; every launch goes on `stream` and is checked with cudaGetLastError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "model/numerics.hpp"

namespace kvo::model::cuda {

// ---- kernels_elementwise.cu ----
// out [n][hidden] f32 = table [vocab][hidden] (type) rows tokens[n].
void embed(const std::int32_t* tokens, int n, const void* table, Elem type, int hidden, float* out,
           cudaStream_t stream);
// out [n][hidden] = x * rsqrt(mean(x^2) + eps) * weight.
void rms_norm(const float* x, int n, int hidden, const void* weight, Elem type, float eps,
              float* out, cudaStream_t stream);
// q [n][heads][head_dim], k [n][kv_heads][head_dim] rotated in place; row i at positions[i], or
// at first_position + i when positions is null. inv_freq [head_dim / 2].
void rope(float* q, float* k, int n, int heads, int kv_heads, int head_dim, const float* inv_freq,
          const std::int32_t* positions, int first_position, cudaStream_t stream);
// out [count] (type) = x [count] f32.
void convert(const float* x, std::int64_t count, void* out, Elem type, cudaStream_t stream);
// y [n][out] += bias [out].
void add_bias(float* y, int n, int out, const void* bias, Elem type, cudaStream_t stream);
// gate [count] = silu(gate) * up.
void swiglu(float* gate, const float* up, std::int64_t count, cudaStream_t stream);

// ---- kernels_attention.cu ----
struct AttentionArgs {
  const float* q = nullptr;  // [n][heads][head_dim]
  float* out = nullptr;      // [n][heads][head_dim]
  int n = 0;
  int heads = 0;
  int kv_heads = 0;
  int head_dim = 0;
  int sliding_window = 0;  // 0: none
  // K and V of one layer: [slot][token][kv_head][head_dim] with these element strides.
  const void* k = nullptr;
  const void* v = nullptr;
  Elem type = Elem::kBF16;
  std::int64_t slot_stride = 0;
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  // Row i: slots[i], positions[i]; or, when those are null, slot `slot` at first_position + i.
  const std::int32_t* slots = nullptr;
  const std::int32_t* positions = nullptr;
  int slot = 0;
  int first_position = 0;
};

// Split-sequence attention: each (row, head) is cut into `splits` key ranges computed in
// parallel, each with its own online softmax, then merged. partials: [n][heads][splits][head_dim
// + 2] f32 (unused when splits == 1).
void attention(const AttentionArgs& args, int splits, float* partials, cudaStream_t stream);

// ---- kernels_synthetic.cu ----
// out [count] (type) = the synthetic weights of seed stream `stream_id` (see weights.hpp).
void fill_synthetic(void* out, std::int64_t count, Elem type, std::uint64_t seed,
                    std::uint64_t stream_id, float scale, bool norm, cudaStream_t stream);

}  // namespace kvo::model::cuda
