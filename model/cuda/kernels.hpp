// Launchers of the model's CUDA kernels (defined in kernels_*.cu). Every pointer is device
// memory; every launch goes on `stream` and is checked with cudaGetLastError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kvoffload/cache.hpp"
#include "model/common/numerics.hpp"

namespace kvo::model::cuda {

// ---- kernels_elementwise.cu ----
// out [n][hidden] f32 = table [vocab][hidden] (type) rows tokens[n].
void embed(const std::int32_t* tokens, int n, const void* table, DType type, int hidden, float* out,
           cudaStream_t stream);
// out [n][hidden] = x * rsqrt(mean(x^2) + eps) * (offset + weight).
void rms_norm(const float* x, int n, int hidden, const void* weight, DType type, float eps,
              float offset, float* out, cudaStream_t stream);
// q [n][heads][head_dim], k [n][kv_heads][head_dim] rotated in place; row i at positions[i], or
// at first_position + i when positions is null. inv_freq [head_dim / 2].
void rope(float* q, float* k, int n, int heads, int kv_heads, int head_dim, const float* inv_freq,
          float scale, const std::int32_t* positions, int first_position, cudaStream_t stream);
// out [count] (type) = x [count] f32.
void convert(const float* x, std::int64_t count, void* out, DType type, cudaStream_t stream);
// out: n quantized rows (kvoffload/quant.hpp) of `row_bytes` bytes each, row i = x [i][kv_heads]
// [dim] f32, bit for bit what kvo::quantize_row writes on the host. type: kFP8E4M3 or kInt8.
void quantize_rows(const float* x, int n, int kv_heads, int dim, DType type, std::int64_t row_bytes,
                   void* out, cudaStream_t stream);
// out [count] f32 = x [count] (type).
void widen(const void* x, std::int64_t count, DType type, float* out, cudaStream_t stream);
// y [n][out] += bias [out].
void add_bias(float* y, int n, int out, const void* bias, DType type, cudaStream_t stream);
// gate [count] = act(gate) * up: silu, or with `gelu` gelu_tanh (numerics.hpp).
void gated_activation(float* gate, const float* up, std::int64_t count, bool gelu,
                      cudaStream_t stream);
// x [count] += y * scale (the product rounded first).
void add(float* x, const float* y, std::int64_t count, float scale, cudaStream_t stream);
// x [count] = soft_cap_value(x, cap).
void soft_cap(float* x, std::int64_t count, float cap, cudaStream_t stream);
// x [count] *= factor.
void scale(float* x, std::int64_t count, float factor, cudaStream_t stream);

// ---- kernels_blocks.cu: matrices in GGUF blocks (model/checkpoint/ggml_blocks.hpp) ----
// Rows of a decode step up to this many go through linear_blocks; more through a tile. Why 8,
// by a model of an H100 (not yet measured; bench/attention_bench.cpp's BM_GgufDecodeQ4K measures
// one row): every warp of linear_blocks reads all n rows of x for its output row, from L1 (8 rows
// of 4096 floats are 128 KiB, within an SM's 256 KiB), so a 14336 x 4096 Q4_K matrix costs its
// 33 MB of blocks from HBM (11 us at 3 TB/s) plus n x 16 KiB x 14336 = n x 235 MB from L1 (about
// 29 TB/s over 132 SMs): 8 us a row, 76 us in all at 8 rows. Through the tile the blocks are read,
// 117 MB of bf16 written and read again by one GEMM: about 90 us whatever n. The two meet near 8
// rows, and past them x no longer stays in L1. A device run should place the crossover.
inline constexpr int kBlockDecodeRowsMax = 8;
// y [n][out] = x [n][in] W^T (y += with `accumulate`), W [out][in] in blocks of ggml type `type`
// (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K), reading W once. REQUIRES: n <= kBlockDecodeRowsMax, in a
// multiple of the type's block.
void linear_blocks(const float* x, int n, int in, const void* w, std::uint32_t type, int out,
                   float* y, bool accumulate, cudaStream_t stream);
// out [rows][in] (out_type: f32, f16, bf16) = rows of a matrix in blocks of `type`, the first at w.
void dequantize_blocks(const void* w, std::uint32_t type, std::int64_t rows, int in, void* out,
                       DType out_type, cudaStream_t stream);
// out [n][hidden] f32 = rows tokens[n] of a table in blocks of `type`.
void embed_blocks(const std::int32_t* tokens, int n, const void* table, std::uint32_t type,
                  int hidden, float* out, cudaStream_t stream);

// ---- kernels_attention.cu ----
struct AttentionArgs {
  const float* q = nullptr;  // [n][heads][head_dim]
  float* out = nullptr;      // [n][heads][head_dim]
  int n = 0;
  int heads = 0;
  int sliding_window = 0;  // 0: none
  float scale = 0;         // on q . k
  float softcap = 0;       // 0: none; else the scores become soft_cap_value(score, softcap)
  // The layer's K and V as the cache hands them (kv_heads, head_dim, dtype, scale offsets), each
  // read through its own strides. Its host arrays are not read. REQUIRES: v_head_dim ==
  // head_dim.
  LayerView kv;
  // Row i: slot slots[i] at position positions[i].
  const std::int32_t* slots = nullptr;
  const std::int32_t* positions = nullptr;
  // Split attention (device part): row i attends only keys from first_keys[slots[i]] on (device
  // [slots]); null: from its window's first key. lse (device [n][heads], f32): where not null, each
  // row's log-sum-exp in FlashInfer's convention (log2 of the sum of 2^(score log2 e)), for
  // merge_attention_tile.
  const std::int32_t* first_keys = nullptr;
  float* lse = nullptr;
};

// Decode attention, split-sequence: each (row, head) is cut into `splits` key ranges computed in
// parallel, each with its own online softmax, then merged. partials: [n][heads][splits][head_dim
// + 2] f32 (unused when splits == 1).
void attention(const AttentionArgs& args, int splits, float* partials, cudaStream_t stream);

// Prefill attention runs over key blocks: cuBLAS computes the scores S = scale Q K^T of a block
// and adds P V to the output; these kernels convert the block and do the online softmax between.
struct PrefillBlock {
  int n = 0;  // query rows, row i at position first_position + i
  int heads = 0;
  int head_dim = 0;
  int first_position = 0;
  int sliding_window = 0;  // 0: none
  float softcap = 0;       // 0: none; else the scores are soft-capped first
  int key_begin = 0;       // the block's keys: [key_begin, key_begin + keys)
  int keys = 0;
  int key_stride = 0;  // B: row stride of the scores
  bool first_block = false;
};

// k_out, v_out [keys][kv_heads][head_dim] (out_type: f32, or bf16 rounded to nearest even) =
// keys [first_key, first_key + keys) of `slot` in `view` (K and V each through its own strides);
// quantized rows are scaled by their heads' scales. REQUIRES: v_head_dim == head_dim.
void gather_kv_block(const LayerView& view, int slot, int first_key, int keys, void* k_out,
                     void* v_out, DType out_type, cudaStream_t stream);
// out [n][heads][head_dim] f32 and lse [n][heads] (log2 domain) merged with one tile's output
// tile_out [n][heads][head_dim] (tile_type) and tile_lse [n][heads] (lse_merge,
// model/decoder/numerics.hpp); `first`: out and lse take the tile's.
void merge_attention_tile(const void* tile_out, DType tile_type, const float* tile_lse, int n,
                          int heads, int head_dim, bool first, float* out, float* lse,
                          cudaStream_t stream);
// scores [heads][n][key_stride]: the block's scaled scores, replaced by exp(score - running max)
// (0 where masked: causal, and sliding_window); stats [2][heads][n] (running max, running sum)
// updated, out [n][heads][head_dim] rescaled to the new max (zeroed on the first keys seen).
void prefill_softmax_block(const PrefillBlock& block, float* scores, float* stats, float* out,
                           cudaStream_t stream);
// out [n][heads][head_dim] /= the running sum in stats.
void prefill_normalize(int n, int heads, int head_dim, const float* stats, float* out,
                       cudaStream_t stream);

// ---- kernels_sampling.cu ----
// tokens[i] = the token sampled from logits [n][vocab] row i, for slot rows[i] and draw
// rows[n + i] (rows [2][n] int32), by the rule of sample_token (model/decoder/sampler.hpp).
void sample(const float* logits, int n, int vocab, float temperature, int top_k, float top_p,
            std::uint64_t seed, const std::int32_t* rows, std::int32_t* tokens,
            cudaStream_t stream);

// ---- kernels_synthetic.cu ----
// out [count] (type) = the synthetic weights of seed stream `stream_id` (see weights.hpp).
void fill_synthetic(void* out, std::int64_t count, DType type, std::uint64_t seed,
                    std::uint64_t stream_id, float scale, bool norm, cudaStream_t stream);

}  // namespace kvo::model::cuda
