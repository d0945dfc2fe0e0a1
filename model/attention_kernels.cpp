#include "model/attention_kernels.hpp"

#include <algorithm>

namespace kvo::model {

bool flashinfer_built() {
#ifdef KVO_WITH_FLASHINFER
  return true;
#else
  return false;
#endif
}

std::string AttentionKernels::describe(const ModelConfig& config, DType kv_dtype) const {
  if (!flashinfer) return "built-in kernels (" + reason + ")";
  return std::string("FlashInfer (") + dtype_name(kv_dtype) + ", head_dim " +
         std::to_string(config.head_dim) + ", GQA group " +
         std::to_string(config.heads / config.kv_heads) + ")";
}

AttentionKernels choose_attention_kernels(const ModelConfig& c, DType kv_dtype, int slots,
                                          int max_seq, bool builtin_only) {
  AttentionKernels k;
  const int group = c.kv_heads > 0 ? c.heads / c.kv_heads : 0;
  // FlashInfer's kernels index K/V rows with 32-bit offsets: a slot's rows
  // (max_seq x kv_heads x head_dim elements) and the tokens of all slots must stay below 2^32.
  const std::uint64_t slot_elements = static_cast<std::uint64_t>(max_seq) *
                                      static_cast<std::uint64_t>(c.kv_heads) *
                                      static_cast<std::uint64_t>(c.head_dim);
  const std::uint64_t all_tokens =
      static_cast<std::uint64_t>(max_seq) * static_cast<std::uint64_t>(slots);
  if (builtin_only) {
    k.reason = "asked for";
  } else if (!flashinfer_built()) {
    k.reason = "this build has no FlashInfer (KVO_WITH_FLASHINFER=OFF)";
  } else if (kv_dtype != DType::kBF16 && kv_dtype != DType::kF16) {
    k.reason = std::string("FlashInfer's kernels are built for bf16 and f16 K/V, not ") +
               dtype_name(kv_dtype);
  } else if (c.head_dim != 64 && c.head_dim != 128) {
    k.reason =
        "FlashInfer's kernels are built for head_dim 64 and 128, not " + std::to_string(c.head_dim);
  } else if (group != 1 && group != 2 && group != 3 && group != 4 && group != 8) {
    k.reason = "FlashInfer's decode serves GQA groups of 1, 2, 3, 4 and 8 query heads, not " +
               std::to_string(group);
  } else if (slot_elements >= (1ull << 32) || all_tokens >= (1ull << 31)) {
    k.reason = "a slot of " + std::to_string(max_seq) +
               " tokens passes the 32-bit offsets of FlashInfer's kernels";
  } else {
    k.flashinfer = true;
    k.page_size = 64;
    while (max_seq % k.page_size != 0) k.page_size /= 2;
  }
  return k;
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
