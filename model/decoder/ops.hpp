// The operations a decoder layer is made of, behind one interface with two implementations: the
// host path (C++ on the CPU, f32 accumulation) and the CUDA path (cuBLAS and kernels). Every
// pointer is "device" memory of the cache's backend (host memory on the host backend); every
// call is ordered on the stream the implementation was made with.
#pragma once

#include <cstdint>

#include "kvoffload/cache.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/checkpoint/weights.hpp"
#include "model/cuda/attention_kernels.hpp"
#include "model/decoder/sampler.hpp"

namespace kvo::model {

// Row i of a decode batch: which slot it belongs to and its position (= keys before it).
// Both arrays in device memory, and a host copy for the host path.
struct DecodeRows {
  const std::int32_t* slots = nullptr;      // [n] device
  const std::int32_t* positions = nullptr;  // [n] device
  const std::int32_t* host_slots = nullptr;
  const std::int32_t* host_positions = nullptr;
};

// Row i of a batch to sample: drawn for slot slots[i] as that slot's draw number draws[i]. Host.
struct SampleRows {
  const std::int32_t* slots = nullptr;  // [n]
  const std::int32_t* draws = nullptr;  // [n]
};

class Ops {
 public:
  virtual ~Ops() = default;

  // Waits until everything enqueued so far has run (CUDA: the stream; the host path runs each
  // call to its end, so nothing). Before the host rewrites what a kernel may still read.
  virtual void synchronize() = 0;
  // Writes the synthetic values of weight `entry` (model/checkpoint/weights.hpp) to dst (device
  // memory).
  virtual void fill_synthetic(const WeightLayout& layout, const WeightEntry& entry,
                              std::uint64_t seed, void* dst) = 0;
  // tokens[i] (host) = the token row i of logits [n][vocab] (device) draws, by sample_token's
  // rule with sampling_uniform(seed, rows.slots[i], rows.draws[i]). On CUDA the draw runs on the
  // device and only the ids come back; returns once they are on the host.
  virtual void sample(const float* logits, int n, const SampleRows& rows,
                      const SamplingParams& params, std::uint64_t seed, std::int32_t* tokens) = 0;

  // out [n][hidden] = embed[tokens[i]] * OpsShape::embed_scale (tokens [n] int32, device).
  virtual void embed(const std::int32_t* tokens, int n, WeightRef table, float* out) = 0;
  // out [n][width] = x / sqrt(mean(x^2) + eps) * (norm_offset + weight), row by row, norm_offset
  // the family's (ModelConfig::norm_offset()): x [n][width], weight [width] (hidden for the
  // model's norms, head_dim for the per-head ones of Qwen3 and Gemma 3). out may be x.
  virtual void rms_norm(const float* x, int n, int width, const void* weight, float* out) = 0;
  // y [n][out] = x [n][in] W^T + bias (W [out][in] in the model dtype or in GGUF blocks, which
  // only the host path multiplies; bias [out] or null); with `accumulate`, y += instead (the
  // residual add).
  virtual void linear(const float* x, int n, int in, WeightRef w, const void* bias, int out,
                      float* y, bool accumulate) = 0;
  // One of several projections of the same input: y [n][out] = x W^T + bias (or y += ...).
  struct Projection {
    WeightRef w;
    const void* bias = nullptr;
    int out = 0;
    float* y = nullptr;
    bool accumulate = false;
  };
  // The projections of one input x [n][in] (q, k and v of a normed row; gate and up): as many
  // linear() calls, but a path that converts its input for the GEMMs does it once for all.
  virtual void linear_many(const float* x, int n, int in, const Projection* projections,
                           int count) {
    for (int i = 0; i < count; ++i) {
      const Projection& p = projections[i];
      linear(x, n, in, p.w, p.bias, p.out, p.y, p.accumulate);
    }
  }
  // Rotates q [n][heads][head_dim] and k [n][kv_heads][head_dim] in place; row i is at
  // positions[i] (device), or at first_position + i when positions is null. `local`: with the
  // window layers' table (OpsShape::inv_freq_local), else the model's.
  virtual void rope(float* q, float* k, int n, const std::int32_t* positions, int first_position,
                    bool local) = 0;
  // out = n rows in the cache's format (kv_row_bytes(kv_dtype, kv_heads, head_dim) each) of
  // x [n][kv_heads][head_dim] f32: converted, or quantized (kvoffload/quant.hpp).
  virtual void to_cache_rows(const float* x, int n, void* out) = 0;
  // Causal attention of one slot's new rows: q [n][heads][head_dim], row i at position
  // first_position + i, over that slot's keys of `view` from first_key(window, position) up to
  // its own position (the new rows are appended already). out [n][heads][head_dim]. The scores
  // are scaled by the config's attention_scale() and soft-capped by its attn_softcap.
  virtual void attention_prefill(const float* q, int n, int slot, int first_position, int window,
                                 const LayerView& view, float* out) = 0;
  // One query row per decoding slot: row i attends keys [first_key(window, positions[i]),
  // positions[i]] of slots[i].
  virtual void attention_decode(const float* q, int n, const DecodeRows& rows, int window,
                                const LayerView& view, float* out) = 0;
  // Split attention (LayerView::split_rows, non-null): as attention_decode, each row's keys
  // before its slot's split row read from the host store (view.host_k, host_v) and the others
  // from the view, the two parts merged by their log-sum-exps. The host path runs both parts;
  // the CUDA path (made with OpsShape::split) copies the queries to the host, attends the tails
  // on the device meanwhile, the host parts on a host thread pool, and merges on the device.
  virtual void attention_decode_split(const float* q, int n, const DecodeRows& rows, int window,
                                      const LayerView& view, float* out) = 0;
  // gate [count] = act(gate) * up, act the config's hidden_act (silu or GeLU-tanh).
  virtual void gated_activation(float* gate, const float* up, std::int64_t count) = 0;
  // x [count] += y * scale (the product rounded to float, then added): a residual joined by a
  // branch (Granite scales its branches by residual_multiplier).
  virtual void add(float* x, const float* y, std::int64_t count, float scale) = 0;
  // x [count] *= factor (Granite's logits, divided by logits_scaling).
  virtual void scale(float* x, std::int64_t count, float factor) = 0;
  // x [count] = cap * tanh(x / cap): Gemma 2's final logits.
  virtual void soft_cap(float* x, std::int64_t count, float cap) = 0;
};

// Shape facts every implementation needs.
struct OpsShape {
  ModelConfig config;
  DType weight_dtype = DType::kF32;
  DType kv_dtype = DType::kF32;  // the cache's rows (quantized for fp8 and int8)
  int max_rows = 1;              // rows of the largest chunk or decode batch
  int max_decode_rows = 1;       // slots
  int max_seq = 1;
  int threads = 1;                  // host path: threads of its pool
  const float* inv_freq = nullptr;  // [head_dim / 2], device; the decoder updates it (rope.hpp)
  float rope_scale = 1;             // on cos and sin (yarn's and longrope's attention factor)
  const float* inv_freq_local = nullptr;  // [head_dim / 2], device: the window layers' (Gemma 3)
  float embed_scale = 1;                  // on the embeddings (Gemma: sqrt(hidden))
  // CUDA: the attention kernels, chosen once with the plan (plan_decoder_memory) and sized in
  // its workspace; the ops run what it says.
  AttentionKernels kernels;
  bool f32_gemm = false;        // host: bf16 weights multiplied in f32 (DecoderOptions)
  bool weight_blocks = false;   // some matrices are in GGUF blocks (host: or kept f16/bf16)
  bool q8_activations = false;  // host: decode rows of blocks multiply 8-bit activations
  // Split attention may run (DecoderOptions::split): CUDA sizes its workspace and host buffers
  // for attention_decode_split.
  bool split = false;
};

// A split layer's view of the rows before each split (LayerView::split_rows): the host store,
// laid out as the staged view.
inline LayerView host_part(const LayerView& view) {
  LayerView host = view;
  host.k = const_cast<void*>(view.host_k);
  host.v = const_cast<void*>(view.host_v);
  return host;
}

// Keys a query at `position` attends through a window of `window` keys (0: none):
// [first_key(window, position), position].
inline int first_key(int window, int position) {
  return window > 0 && position - window + 1 > 0 ? position - window + 1 : 0;
}

}  // namespace kvo::model
