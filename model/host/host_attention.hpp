// Attention on the host path, reading the cache's K/V rows in place (f32, f16 or bf16, through
// the view's strides) with an online softmax, all query heads of a GQA group per K/V pass.
// Quantized rows (fp8, int8) are dequantized block by block into f32 scratch first.
//
// Prefill is blocked over queries and keys: a task is (kv head, block of kQueryBlock tokens);
// it packs the block's queries of the group as [tokens x group][head_dim], and for each block of
// kPrefillKeyBlock keys computes the scores and the weighted values with OpenBLAS's sgemm
// (single-threaded, inside the pool). f16/bf16 keys are converted block by block.
//
// Decode splits each row over parts of the keys, as a GPU split-K decode does: a task is
// (row, part), which walks its keys front to back, every kv head of a block of keys at once (the
// rows are token-major, so a task reads one contiguous range; a task per kv head would read a
// 1/kv_heads slice of every page, which measured 10x slower). Each leaves a partial softmax state
// and weighted sum per kv head, and a second pass, (row, kv head) per task, merges the parts in
// order. How the keys are split depends on the key count only, so the result is the same for any
// thread count, and a row's result does not depend on the other rows.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "kvoffload/cache.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/common/numerics.hpp"
#include "model/host/host_workspace.hpp"
#include "model/host/thread_pool.hpp"

namespace kvo::model {

class HostAttention {
 public:
  static constexpr int kQueryBlock = 64;
  static constexpr int kPrefillKeyBlock = 128;
  static constexpr int kMinPartKeys = 256;  // decode: keys per part, at least...
  static constexpr int kMaxParts = 64;      // ...and at most this many parts per (row, kv head)

  // Decode over quantized rows: keys dequantized (every head) per block of this many.
  static constexpr int kDequantKeys = 64;

  // scratch: carved for the same shape and the pool's threads (HostAttentionScratch::carve);
  // without it, the object carves a region of its own.
  HostAttention(const ModelConfig& config, DType type, int max_decode_rows, ThreadPool& pool);
  HostAttention(const ModelConfig& config, DType type, ThreadPool& pool,
                HostAttentionScratch scratch);

  // q [n][heads][head_dim], row i at position first_position + i, over the keys of `slot` up to
  // its own position, the last `window` of them (0: all). out [n][heads][head_dim]. Scores are
  // scaled by the config's attention_scale() and soft-capped by its attn_softcap.
  void prefill(const float* q, int n, int slot, int first_position, int window,
               const LayerView& view, float* out);
  // Where decode rows' keys are cut, for split attention (the rows before a split row attended
  // here over the host store, the others elsewhere): row i attends only keys [begin[s], end[s])
  // of its own, s its slot slots[i] (0 and positions[i] + 1 where null: LayerView::split_rows
  // serves as either), and writes its log-sum-exp per head to lse [n][heads] where not null:
  // log2 of the sum of exp of its scaled, capped scores, as FlashInfer's, so that lse_merge
  // (numerics.hpp) joins the parts exactly. A row left with no keys gives out 0 and lse -inf,
  // which lse_merge drops.
  struct KeyRange {
    const std::int32_t* begin = nullptr;  // [slots], host
    const std::int32_t* end = nullptr;    // [slots], host
    float* lse = nullptr;                 // [n][heads]
  };
  // Row i: q [heads][head_dim] of slots[i] at positions[i] (host arrays), over keys
  // [first_key(window, positions[i]), positions[i]] (cut by `range`). out [n][heads][head_dim].
  void decode(const float* q, int n, const std::int32_t* slots, const std::int32_t* positions,
              int window, const LayerView& view, float* out, const KeyRange& range);
  void decode(const float* q, int n, const std::int32_t* slots, const std::int32_t* positions,
              int window, const LayerView& view, float* out);

  // Bytes of K and V per second decode reads on `pool`: one query row over a slot of about
  // `bytes` of rows of `type`, the best of 3 after one untimed (split attention's host rate,
  // CacheConfig::split kAuto, for the decoder). About 3 passes over `bytes`.
  static double measure_rate(const ModelConfig& config, DType type, ThreadPool& pool,
                             std::uint64_t bytes = 64ull << 20);

  // How decode splits `keys` keys: parts of part_keys keys (the last may be shorter).
  struct Split {
    int parts = 1;
    int part_keys = 0;
  };
  static Split split(int keys);

 private:
  using PrefillScratch = HostAttentionScratch::Prefill;
  using DecodeScratch = HostAttentionScratch::Decode;

  void prefill_block(const float* q, int n, int slot, int first_position, int window,
                     const LayerView& view, int kv_head, int block, PrefillScratch& s, float* out);

  ModelConfig config_;
  DType type_;
  ThreadPool& pool_;
  int group_;
  float scale_;
  float softcap_;                    // 0: none
  bool avx512_;                      // decode through kernels::attend_keys_avx512
  std::unique_ptr<HostRegion> own_;  // the region without a given scratch
  HostAttentionScratch scratch_;
};

}  // namespace kvo::model
