// Attention on the host path, reading the cache's K/V rows in place (f32, f16 or bf16, through
// the view's strides) with an online softmax, all query heads of a GQA group per K/V pass.
// Quantized rows (fp8, int8) are dequantized block by block into f32 scratch first.
//
// Prefill is blocked over queries and keys: a task is (kv head, block of kQueryBlock tokens);
// it packs the block's queries of the group as [tokens x group][head_dim], and for each block of
// kPrefillKeyBlock keys computes the scores and the weighted values with OpenBLAS's sgemm
// (single-threaded, inside the pool). f16/bf16 keys are converted block by block.
//
// Decode is offload/attend/decode_attention.hpp's, the code split attention's host part runs
// through the C ABI too.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/cache.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/common/numerics.hpp"
#include "model/host/host_workspace.hpp"
#include "model/host/thread_pool.hpp"
#include "offload/attend/decode_attention.hpp"

namespace kvo::model {

class HostAttention {
 public:
  static constexpr int kQueryBlock = 64;
  static constexpr int kPrefillKeyBlock = 128;
  static constexpr int kMinPartKeys = attend::DecodeAttention::kMinPartKeys;  // decode's parts
  static constexpr int kMaxParts = attend::DecodeAttention::kMaxParts;

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
  // Where decode rows' keys are cut, for split attention (attend::KeyRange).
  using KeyRange = attend::KeyRange;
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

  // The kernel decode takes here, in words.
  std::string decode_kernel() const { return decode_->kernel(); }

  // How decode splits `keys` keys (attend::DecodeAttention::split).
  using Split = attend::DecodeAttention::Split;
  static Split split(int keys) { return attend::DecodeAttention::split(keys); }

 private:
  void make_decode();
  using PrefillScratch = HostAttentionScratch::Prefill;

  void prefill_block(const float* q, int n, int slot, int first_position, int window,
                     const LayerView& view, int kv_head, int block, PrefillScratch& s, float* out);

  ModelConfig config_;
  DType type_;
  ThreadPool& pool_;
  int group_;
  float scale_;
  float softcap_;                    // 0: none
  std::unique_ptr<HostRegion> own_;  // the region without a given scratch
  HostAttentionScratch scratch_;
  std::unique_ptr<attend::DecodeAttention> decode_;  // over scratch_.decode
};

}  // namespace kvo::model
