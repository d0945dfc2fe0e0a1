// The operations a decoder layer is made of, behind one interface with two implementations: the
// host path (C++ on the CPU, f32 accumulation) and the CUDA path (cuBLAS and kernels). Every
// pointer is "device" memory of the cache's backend (host memory on the host backend); every
// call is ordered on the stream the implementation was made with.
#pragma once

#include <cstdint>

#include "kvoffload/cache.hpp"
#include "model/model_config.hpp"

namespace kvo::model {

// Row i of a decode batch: which slot it belongs to and its position (= keys before it).
// Both arrays in device memory, and a host copy for the host path.
struct DecodeRows {
  const std::int32_t* slots = nullptr;      // [n] device
  const std::int32_t* positions = nullptr;  // [n] device
  const std::int32_t* host_slots = nullptr;
  const std::int32_t* host_positions = nullptr;
};

class Ops {
 public:
  virtual ~Ops() = default;

  // out [n][hidden] = embed[tokens[i]] (tokens [n] int32, device).
  virtual void embed(const std::int32_t* tokens, int n, const void* table, float* out) = 0;
  // out [n][hidden] = x / sqrt(mean(x^2) + eps) * weight.
  virtual void rms_norm(const float* x, int n, const void* weight, float* out) = 0;
  // y [n][out] = x [n][in] W^T + bias (W [out][in] in the model dtype; bias [out] or null);
  // with `accumulate`, y += instead (the residual add).
  virtual void linear(const float* x, int n, int in, const void* w, const void* bias, int out,
                      float* y, bool accumulate) = 0;
  // Rotates q [n][heads][head_dim] and k [n][kv_heads][head_dim] in place; row i is at
  // positions[i] (device), or at first_position + i when positions is null.
  virtual void rope(float* q, float* k, int n, const std::int32_t* positions,
                    int first_position) = 0;
  // out [count] in the cache dtype = x [count] f32.
  virtual void to_cache_rows(const float* x, std::int64_t count, void* out) = 0;
  // Causal attention of one slot's new rows: q [n][heads][head_dim], row i at position
  // first_position + i, over that slot's keys of `view` up to its own position (the new rows are
  // appended already). out [n][heads][head_dim].
  virtual void attention_prefill(const float* q, int n, int slot, int first_position,
                                 const LayerView& view, float* out) = 0;
  // One query row per decoding slot: row i attends keys [0, positions[i]] of slots[i].
  virtual void attention_decode(const float* q, int n, const DecodeRows& rows,
                                const LayerView& view, float* out) = 0;
  // gate [count] = silu(gate) * up.
  virtual void swiglu(float* gate, const float* up, std::int64_t count) = 0;
};

// Shape facts every implementation needs.
struct OpsShape {
  ModelConfig config;
  DType weight_dtype = DType::kF32;  // also the cache dtype
  int max_rows = 1;                  // rows of the largest chunk or decode batch
  int max_decode_rows = 1;           // slots
  int max_seq = 1;
  int threads = 1;                  // host path: threads of its pool
  const float* inv_freq = nullptr;  // [head_dim / 2], device
};

// Keys a query at `position` attends: [first_key(position), position].
inline int first_key(const ModelConfig& c, int position) {
  return c.sliding_window > 0 && position - c.sliding_window + 1 > 0
             ? position - c.sliding_window + 1
             : 0;
}

}  // namespace kvo::model
