// The decoder's device memory, computed from its shape alone: the one source of truth that the
// Decoder allocates by (through the cache's reserved regions) and that the public planner
// (include/kvoffload/planner.hpp) and kvo-vram report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kvoffload/config.hpp"
#include "kvoffload/planner.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/cuda/attention_kernels.hpp"
#include "model/decoder/decoder.hpp"

namespace kvo::model {

// Fixed sizes of the CUDA path: the built-in decode attention's largest split count and prefill
// key block (used where FlashInfer does not serve the shape), and cuBLAS's workspace.
inline constexpr int kMaxAttentionSplits = 32;
// Each key block costs two GEMM launches per KV head: at 256 keys a 128K prompt would be launch
// bound (about 8K launches per chunk and layer); 1024 keys cost 64 MiB of scores at the
// Llama-3-8B shape (32 heads x 512 rows) and cut the launches fourfold.
inline constexpr int kPrefillKeyBlock = 1024;
inline constexpr std::uint64_t kCublasWorkspaceBytes = 32ull << 20;
// Weights kept in GGUF blocks multiply a prefill chunk (more than cuda::kBlockDecodeRowsMax rows)
// through a tile of their rows dequantized into the model dtype: at most this many bytes (and at
// least kBlockTileMinRows rows).
inline constexpr std::uint64_t kBlockTileBytes = 64ull << 20;
inline constexpr int kBlockTileMinRows = 256;
// Up to this many rows (a decode step's) multiply a matrix in blocks with the kernel that reads
// them once (cuda::linear_blocks, whose kBlockDecodeRowsMax it is); more go through the tile.
inline constexpr int kBlockDecodeRows = 8;

// The CUDA path's workspace. R = rows of the largest chunk or decode batch, S = decode rows
// (slots), B = kPrefillKeyBlock, d = head_dim, type = the weights' dtype, kv = the K/V's:
//   cuBLAS workspace
//   GEMM input       [R][widest] (type; none in f32)
//   sampling         [3][S] int32: slot and draw of each row, then the sampled ids
// With weights in GGUF blocks (weight_blocks) and more than kBlockDecodeRows rows:
//   block_tile       [rows][widest] (type): rows of a matrix in blocks dequantized for a GEMM,
//                    rows = max(kBlockTileMinRows, kBlockTileBytes / (widest x type)) in 128s,
//                    no more than the tallest matrix's rows (rounded up to 128)
// With FlashInfer's kernels (attention_kernels.hpp), for either phase:
//   attn_q           [R][heads][d] (kv): the queries, as FlashInfer reads them
//   attn_out         [R][heads][d] (kv): its output
// and for its decode:
//   decode_float     split-KV partial outputs and log-sum-exps: [heads][P][d] + [heads][P] f32,
//                    P = max(S, kPlannedSms * kDecodeBlocksPerSm / kv_heads) partial rows
//   decode_int       per schedule (decode_schedules: 2 when window and full layers are both
//                    there, whose pages differ, else 1; each 256-aligned): the schedule
//                    (request, tile and output indices, chunk size, valid mask), copied from a
//                    pinned host mirror when a step's first layer of its kind plans
//   decode_pages     per schedule: the paged view of the decoding slots: indptr [S + 1],
//                    last_page_len [S], page indices [S][max_seq / page_size] int32
// for its prefill:
//   prefill_tmp      split-KV partials of prefill: kPlannedSms x rows-per-SM x (d x 2 + 4) bytes
// With a quantized cache's bf16 tiles (kernels.dequant_tiles: both phases through FlashInfer's
// prefill kernel, attn_q and attn_out in bf16), T = kernels.tile_keys:
//   tile_lse         [R][heads] f32: the log-sum-exp of each row over one tile
//   run_lse          [R][heads] f32: over the tiles merged so far
//   kv_tile          [2][T][kv_heads][d] bf16: one tile of K, then of V, dequantized
// With split attention (OpsShape::split): the device part through the built-in kernels, so
//   partials         as the built-in decode's (below), when FlashInfer decodes otherwise
//   split_first      [S] int32: each slot's split row, its device part's first key
//   split_out        [S][heads][d] f32: the host part's output, copied in
//   split_lse        [2][S][heads] f32: the device part's log-sum-exp, then the host part's
// With the built-in kernels, for decode:
//   partials         [S][heads][kMaxAttentionSplits][d + 2] f32
// and for prefill:
//   prefill_scores   [heads][R][B] f32: scores, then probabilities, of one key block
//   prefill_stats    [2][heads][R] f32: running max, running sum of each (head, row)
//   prefill_kv       [2][B][kv_heads][d] f32: a K and a V block converted, or dequantized (none
//                    when the K/V are f32)
struct WorkspaceLayout {
  AttentionKernels kernels;
  std::uint64_t gemm_input = 0;  // offsets in bytes
  std::uint64_t sampling = 0;
  std::uint64_t block_tile = 0;
  int block_tile_rows = 0;  // 0: no weights in blocks
  std::uint64_t attn_q = 0;
  std::uint64_t attn_out = 0;
  std::uint64_t decode_float = 0, decode_float_bytes = 0;
  std::uint64_t decode_int = 0, decode_int_bytes = 0;
  std::uint64_t decode_pages = 0, decode_pages_count = 0;  // int32s
  std::uint64_t prefill_tmp = 0, prefill_tmp_bytes = 0;
  std::uint64_t tile_lse = 0, run_lse = 0, kv_tile = 0;
  std::uint64_t partials = 0;
  std::uint64_t split_first = 0, split_out = 0, split_lse = 0;  // 0: no split
  std::uint64_t prefill_scores = 0;
  std::uint64_t prefill_stats = 0;
  std::uint64_t prefill_kv = 0;
  std::uint64_t bytes = 0;
  int decode_grid = 0;       // the most decode blocks FlashInfer's schedule may use
  int decode_schedules = 0;  // FlashInfer decode schedules (one per kind of layer)
  // Where schedule k's int buffer and page table start.
  std::uint64_t decode_int_at(int k) const {
    return decode_int + static_cast<std::uint64_t>(k) * ((decode_int_bytes + 255) / 256 * 256);
  }
  std::uint64_t decode_pages_at(int k) const {
    return decode_pages +
           static_cast<std::uint64_t>(k) * ((decode_pages_count * 4 + 255) / 256 * 256);
  }

  // kernels: choose_attention_kernels for the same shape (the plan's choice). weight_blocks:
  // some matrices are kept in GGUF blocks.
  WorkspaceLayout(const ModelConfig& config, DType weight_dtype, DType kv_dtype, int max_rows,
                  int max_decode_rows, int max_seq, const AttentionKernels& kernels,
                  bool weight_blocks = false, bool split = false);
};

// The activations region, carved into buffers. R = rows of the largest chunk or decode batch,
// P = longest prompt (the residual stream of a layer-major prefill holds all of it).
struct ActivationLayout {
  float* residual = nullptr;        // [P][hidden]
  float* xnorm = nullptr;           // [R][hidden]
  float* q = nullptr;               // [R][heads][head_dim]
  float* k = nullptr;               // [R][kv_heads][head_dim]
  float* v = nullptr;               // [R][kv_heads][head_dim]
  float* attn = nullptr;            // [R][heads][head_dim]
  float* gate = nullptr;            // [R][intermediate]
  float* up = nullptr;              // [R][intermediate]
  void* k_rows = nullptr;           // [R] rows in the cache's format (kv_row_bytes)
  void* v_rows = nullptr;           // same
  float* logits = nullptr;          // [max(slots, logit rows)][vocab]
  std::int32_t* tokens = nullptr;   // [P]
  std::int32_t* rows = nullptr;     // [3][slots]: tokens, slots, positions of a decode step
  float* inv_freq = nullptr;        // [head_dim / 2]
  float* inv_freq_local = nullptr;  // [head_dim / 2]: the window layers' (Gemma 3), or none
  // [layers][slots]: a decode step's positions in each window layer's rows (windowed models)
  std::int32_t* window_positions = nullptr;

  // Lays the buffers out from `base` (nullptr: only counts). Returns the bytes used.
  std::uint64_t carve(std::byte* base, const ModelConfig& c, DType kv_dtype, int R, int P,
                      int slots, int logit_rows);
};

// Everything the decoder puts on the device besides its K/V, and the cache config that holds it.
struct DecoderMemory {
  DType dtype = DType::kBF16;     // weights
  DType kv_dtype = DType::kBF16;  // K/V
  int max_rows = 1;               // R
  int max_prompt = 1;             // longest prompt prefilled at once
  int prompt_rows = 1;            // P: max(max_prompt, slots), rows of the residual stream
  int logit_rows = 1;             // rows of logits computed at once: max(slots, options.logit_rows)
  std::uint64_t weights = 0;
  std::uint64_t activations = 0;
  std::uint64_t workspace = 0;  // CUDA: WorkspaceLayout; host: HostWorkspaceLayout
  AttentionKernels kernels;     // CUDA: what attends, chosen once (choose_attention_kernels)
  CacheConfig cache;            // shape, budget, and the three regions above as reserved ones
};

// The host path's shape for a plan (the decoder makes its HostOps with it, so the workspace the
// plan reserves is the one HostOps carves): threads 0 resolves to available_cores().
OpsShape host_ops_shape(const ModelConfig& config, const DecoderOptions& options,
                        const DecoderMemory& memory);

// REQUIRES: validate(config) passes; `backend` is resolved (kCuda or kHost).
// Throws kvo::Error(kInvalidArgument) for bad options.
DecoderMemory plan_decoder_memory(const ModelConfig& config, const DecoderOptions& options,
                                  BackendKind backend);

// Throws kvo::Error(kOutOfMemory) giving both sizes when the weights alone exceed `budget`
// (0: none): no plan of the cache can help then.
void require_weights_fit(const DecoderMemory& memory, std::uint64_t budget);

// The model a MemoryQuery names: a preset, a directory holding a config.json, or its path.
// Throws kvo::Error(kInvalidArgument) naming the presets when it is none of them.
ModelConfig resolve_model(const std::string& name);

// The decoder options a MemoryQuery describes (backend left as the query's).
DecoderOptions decoder_options(const MemoryQuery& query);

// Throws kvo::Error(kInvalidArgument) where q8 activations are asked for and there is nothing they
// could multiply: they multiply matrices kept in GGUF blocks (`blocks`: a GGUF file's, or
// quantized at load) on the host backend. The decoder and the planner refuse alike.
void check_q8_activations(bool q8_activations, BackendKind backend, bool blocks);

}  // namespace kvo::model
