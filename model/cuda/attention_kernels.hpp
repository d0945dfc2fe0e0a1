// Which kernels the CUDA path attends with: FlashInfer's (ahead-of-time instantiated for bf16 and
// f16 K/V, head_dim 64, 128 and 256, GQA groups 1, 2, 3, 4 and 8, NHD layout, sliding windows and
// soft-capped scores chosen at run time) or the built-in ones
// (model/cuda/kernels_attention.cu) for every other shape. A pure function of the shape and of the
// build, so the planner, which sizes each choice's workspace, gives the same answer on a machine
// without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/types.hpp"
#include "model/checkpoint/model_config.hpp"

namespace kvo::model {

// The widest GPU the plan provisions FlashInfer's split-KV scratch for: more SMs than any GPU to
// date (A100 108, RTX 4090 128, H100/H200 132, B200 148). On a wider one, decode splits the
// sequence over at most this many SMs' worth of blocks, and prefill does not split the keys.
inline constexpr int kPlannedSms = 160;
// Blocks of 128 threads that one SM can hold at once (2048 threads): FlashInfer's decode kernel
// runs 128-thread blocks at our head sizes, so a decode grid never usefully exceeds this per SM.
inline constexpr int kDecodeBlocksPerSm = 16;
// Shared memory of one SM on the largest GPUs (228 KiB): bounds how many prefill query tiles an
// SM holds at once, and so FlashInfer's prefill split-KV scratch.
inline constexpr std::uint64_t kMaxSharedMemoryPerSm = 228ull << 10;

// Keys of one bf16 tile of a quantized cache (fp8, int8), which FlashInfer cannot read in place
// (one scale per token and KV head; its quantized kernels take one per tensor): each tile of a
// layer's rows is dequantized into bf16, attended by FlashInfer's prefill kernel with its
// log-sum-exp, and the tiles' outputs are merged exactly (lse_merge, model/decoder/numerics.hpp).
// 4096 keys: 16 MiB of K and V tiles at Llama-3-8B's shape, and tiles long enough that a 2048-row
// chunk's attention runs at FlashInfer's full rate.
inline constexpr int kDequantTileKeys = 4096;

// One tile of keys [begin, end) for a chunk of query rows: `causal` for the tile that holds the
// rows' own keys (FlashInfer's causal mask, aligned to the bottom right), unmasked before it.
struct KeyTile {
  int begin = 0;
  int end = 0;
  bool causal = false;
};

// The tiles of the query rows [first_position, first_position + n) over keys [first_key,
// first_position + n), from the end backwards, each of at most `tile` keys: the first returned
// is the causal one and starts at first_key or at first_position + n - tile, the others lie
// before first_position and are whole tiles except the last one returned.
// REQUIRES: n >= 1, 0 <= first_key <= first_position, tile >= n; with a sliding window,
// tile >= first_position + n - first_key, so that one causal tile carries the window's mask.
std::vector<KeyTile> key_tiles(int first_key, int first_position, int n, int tile);

// Prefill and decode are chosen apart: FlashInfer's prefill serves any GQA group, its decode
// only some (Qwen2.5-7B's group of 7 prefills with FlashInfer and decodes with the built-in
// kernels).
struct AttentionKernels {
  bool flashinfer_prefill = false;
  bool flashinfer_decode = false;
  // fp8/int8 K/V: both phases through FlashInfer's prefill kernel over bf16 tiles of
  // `tile_keys` keys (a decode row is a chunk of one); the K/V tiles are part of the workspace.
  bool dequant_tiles = false;
  int tile_keys = 0;
  // FlashInfer decode reads each slot as pages of `page_size` tokens: the largest power of two
  // up to 64 that divides max_seq, so a slot's pages are whole and in order.
  int page_size = 0;
  std::string prefill_reason;  // why the built-in kernels, when they are chosen
  std::string decode_reason;

  bool any_flashinfer() const { return flashinfer_prefill || flashinfer_decode; }
  // "FlashInfer (bf16, head_dim 128, GQA group 4)", "built-in kernels (<reason>)", or, when the
  // two phases differ, "FlashInfer prefill, built-in decode (<reason>)".
  std::string describe(const ModelConfig& config, DType kv_dtype) const;
};

// Whether this build has FlashInfer's kernels (KVO_WITH_FLASHINFER).
bool flashinfer_built();

// builtin_only: the built-in kernels even where FlashInfer serves the shape (to compare them).
// max_rows: the largest prefill chunk.
AttentionKernels choose_attention_kernels(const ModelConfig& config, DType kv_dtype, int slots,
                                          int max_seq, int max_rows, bool builtin_only = false);

// Query rows one SM of the widest GPU can hold in FlashInfer prefill tiles at head_dim `d` (2-byte
// queries): the bound of its split-KV scratch, which holds at most this many rows per SM of
// [heads][d] outputs and their log-sum-exps.
std::uint64_t flashinfer_prefill_rows_per_sm(int head_dim);

}  // namespace kvo::model
