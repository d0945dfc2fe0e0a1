#include "model/cuda/attention_kernels.hpp"

#include <algorithm>

#include "kvoffload/quant.hpp"

namespace kvo::model {

bool flashinfer_built() {
#ifdef KVO_WITH_FLASHINFER
  return true;
#else
  return false;
#endif
}

std::string AttentionKernels::describe(const ModelConfig& config, DType kv_dtype) const {
  const std::string shape = "head_dim " + std::to_string(config.head_dim) + ", GQA group " +
                            std::to_string(config.heads / config.kv_heads);
  if (dequant_tiles) {
    return std::string("FlashInfer over bf16 tiles of ") + std::to_string(tile_keys) + " keys (" +
           dtype_name(kv_dtype) + " rows dequantized, " + shape + ")";
  }
  const std::string what = std::string("FlashInfer (") + dtype_name(kv_dtype) + ", " + shape + ")";
  if (flashinfer_prefill && flashinfer_decode) return what;
  if (flashinfer_prefill) return what + " prefill, built-in decode (" + decode_reason + ")";
  return "built-in kernels (" + prefill_reason + ")";
}

AttentionKernels choose_attention_kernels(const ModelConfig& c, DType kv_dtype, int slots,
                                          int max_seq, int max_rows, bool builtin_only) {
  AttentionKernels k;
  const int group = c.kv_heads > 0 ? c.heads / c.kv_heads : 0;
  // FlashInfer's kernels index with 32-bit offsets: a slot's K/V rows (max_seq x kv_heads x
  // head_dim elements), a chunk's queries (rows x heads x head_dim), and, in decode, the tokens
  // of all slots must stay below 2^32 (2^31 for the last, held in int32 page indices).
  const auto u64 = [](int x) { return static_cast<std::uint64_t>(x); };
  const std::uint64_t slot_elements = u64(max_seq) * u64(c.kv_heads) * u64(c.head_dim);
  const std::uint64_t chunk_elements = u64(max_rows) * u64(c.heads) * u64(c.head_dim);
  const std::uint64_t all_tokens = u64(max_seq) * u64(slots);
  if (builtin_only) {
    k.prefill_reason = "asked for";
  } else if (!flashinfer_built()) {
    k.prefill_reason = "this build has no FlashInfer (KVO_WITH_FLASHINFER=OFF)";
  } else if (kv_dtype == DType::kF32) {
    // FlashInfer computes in bf16 or f16: an f32 cache asks for f32 attention.
    k.prefill_reason = "f32 K/V attend in f32; FlashInfer's kernels compute in bf16 and f16";
  } else if (c.head_dim != 64 && c.head_dim != 128 && c.head_dim != 256) {
    k.prefill_reason = "FlashInfer's kernels are built for head_dim 64, 128 and 256, not " +
                       std::to_string(c.head_dim);
  } else if (slot_elements >= (1ull << 32) || chunk_elements >= (1ull << 32)) {
    k.prefill_reason = "a slot of " + std::to_string(max_seq) + " tokens or a chunk of " +
                       std::to_string(max_rows) +
                       " rows passes the 32-bit offsets of FlashInfer's kernels";
  } else {
    k.flashinfer_prefill = true;
  }
  k.decode_reason = k.prefill_reason;
  if (k.flashinfer_prefill && is_quantized(kv_dtype)) {
    // Rows with a scale per token and KV head: dequantized into bf16 tiles, both phases through
    // the prefill kernel (any GQA group), one tile long enough for a chunk and, with a sliding
    // window, for the window before it too.
    k.flashinfer_decode = true;
    k.dequant_tiles = true;
    const int window = c.sliding_window > 0 ? c.sliding_window - 1 : 0;
    k.tile_keys = std::max(kDequantTileKeys, max_rows + window);
    return k;
  }
  if (k.flashinfer_prefill) {
    if (group != 1 && group != 2 && group != 3 && group != 4 && group != 8) {
      k.decode_reason =
          "FlashInfer's decode serves GQA groups of 1, 2, 3, 4 and 8 query heads, "
          "not " +
          std::to_string(group);
    } else if (all_tokens >= (1ull << 31)) {
      k.decode_reason = std::to_string(slots) + " slots of " + std::to_string(max_seq) +
                        " tokens pass the 32-bit page indices of FlashInfer's decode";
    } else {
      k.flashinfer_decode = true;
      k.page_size = 64;
      while (max_seq % k.page_size != 0) k.page_size /= 2;
    }
  }
  return k;
}

std::vector<KeyTile> key_tiles(int first_key, int first_position, int n, int tile) {
  std::vector<KeyTile> tiles;
  for (int e = first_position + n; e > first_key;) {
    const int b = std::max(first_key, e - tile);
    tiles.push_back({b, e, tiles.empty()});
    e = b;  // the next tile ends where this one begins
  }
  return tiles;
}

std::uint64_t flashinfer_prefill_rows_per_sm(int head_dim) {
  // FlashInfer's prefill runs 128-thread blocks (at most 16 per SM) over query tiles of 16, 64
  // or 128 rows; each block holds at least its query tile and two 16-key K/V tiles in shared
  // memory, 2 * head_dim * (tile + 32) bytes.
  std::uint64_t rows = 0;
  for (const std::uint64_t tile : {16ull, 64ull, 128ull}) {
    const std::uint64_t smem = 2ull * static_cast<std::uint64_t>(head_dim) * (tile + 32);
    rows = std::max(rows, tile * std::min<std::uint64_t>(16, kMaxSharedMemoryPerSm / smem));
  }
  return rows;
}

}  // namespace kvo::model
