// The FlashInfer kernel calls behind model/cuda/flashinfer_attention.hpp, as templates over the K/V
// element type and head_dim. Included only by the model/flashinfer_{decode,prefill}_*.cu units,
// which instantiate them: these are the only files that see FlashInfer's headers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <flashinfer/exception.h>
#include <flashinfer/attention/decode.cuh>
#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/prefill.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/cuda/flashinfer_attention.hpp"

namespace kvo::model::flashinfer_ops {

template <DType E>
struct ElementType;
template <>
struct ElementType<DType::kBF16> {
  using type = __nv_bfloat16;
};
template <>
struct ElementType<DType::kF16> {
  using type = __half;
};

// One variant for every call: FlashInfer's softmax attention with its sliding-window mask (a
// window_left of -1 admits every key: FlashInfer widens it to the whole sequence) and soft-capping
// chosen at run time, so that one instantiation per (type, head_dim) serves Gemma 2's capped
// scores and everyone else's. With params.logits_soft_cap = c > 0 a score s = q.k * sm_scale
// becomes c * tanh(s / c) before the softmax: the tanh takes q.k * sm_scale / c, and c * log2(e)
// takes the place of sm_scale * log2(e) as the factor into exp2. The cost without a cap is a test
// of a value uniform over the launch per score.
struct Variant : ::flashinfer::AttentionVariantBase {
  static constexpr bool use_softmax = true;
  std::uint32_t qo_len, kv_len, window_left;
  float sm_scale_log2;
  float pre_tanh_scale;  // sm_scale / cap; 0: no cap

  template <typename Params>
  __device__ __host__ Variant(const Params& params, std::uint32_t batch_idx, std::uint8_t*) {
    qo_len = params.get_qo_len(batch_idx);
    kv_len = params.get_kv_len(batch_idx);
    if (params.logits_soft_cap > 0) {
      pre_tanh_scale = params.sm_scale / params.logits_soft_cap;
      sm_scale_log2 = ::flashinfer::math::log2e * params.logits_soft_cap;
    } else {
      pre_tanh_scale = 0;
      sm_scale_log2 = ::flashinfer::math::log2e * params.sm_scale;
    }
    window_left = params.window_left >= 0 ? static_cast<std::uint32_t>(params.window_left) : kv_len;
  }

  REGISTER_LOGITS_TRANSFORM(params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, {
    if (pre_tanh_scale > 0) logits = float(::flashinfer::math::tanh(logits * pre_tanh_scale));
    return logits;
  })

  // Key kv_idx is admitted to query qo_idx (both counted from their own starts, the queries
  // aligned to the last keys) when it lies within window_left keys before the query's own.
  REGISTER_LOGITS_MASK(params, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx,
                       { return kv_idx + qo_len + window_left >= kv_len + qo_idx; })
};

template <DType E, int kHeadDim>
cudaError_t plan_decode(const LayerView& kv, const DecodeCall& call, const DecodeWorkspace& ws,
                        DecodeSchedule& schedule, std::int32_t* host_indptr, cudaStream_t stream) {
  namespace fi = ::flashinfer;
  using T = typename ElementType<E>::type;
  using Params = fi::BatchDecodeParams<T, T, T, std::int32_t>;
  constexpr auto kNoRope = fi::PosEncodingMode::kNone;
  const auto grid = static_cast<std::uint32_t>(ws.grid);
  try {
    fi::DecodePlanInfo plan;
    DISPATCH_GQA_GROUP_SIZE(call.heads / kv.layout.kv_heads, kGroup, {
      // FlashInfer's own estimate of the split, held to the grid the workspace was planned for.
      auto estimate = [grid](bool& split_kv, std::uint32_t& max_grid, std::uint32_t& chunk_pages,
                             std::uint32_t& new_batch, std::uint32_t& gdy, std::uint32_t batch,
                             std::int32_t* pages_indptr, std::uint32_t heads,
                             std::uint32_t page_size, bool graph, cudaStream_t s) {
        cudaError_t status =
            fi::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<kGroup, kHeadDim, kNoRope,
                                                                    Variant, Params>(
                split_kv, max_grid, chunk_pages, new_batch, gdy, batch, pages_indptr, heads,
                page_size, graph, s);
        if (status != cudaSuccess || max_grid <= grid) return status;
        max_grid = grid;
        if (batch * gdy >= max_grid) {
          split_kv = false;
          chunk_pages = 1;
          for (std::uint32_t b = 0; b < batch; ++b) {
            chunk_pages = std::max<std::uint32_t>(
                chunk_pages, static_cast<std::uint32_t>(pages_indptr[b + 1] - pages_indptr[b]));
          }
          new_batch = batch;
          return cudaSuccess;
        }
        std::vector<std::int32_t> pages(batch);
        for (std::uint32_t b = 0; b < batch; ++b) pages[b] = pages_indptr[b + 1] - pages_indptr[b];
        std::tie(chunk_pages, new_batch) = fi::PartitionPagedKVCacheBinarySearchMinNumPagePerBatch(
            max_grid, gdy, pages, std::max(128 / page_size, 1u));
        split_kv = new_batch != batch;
        return cudaSuccess;
      };
      const cudaError_t status = fi::DecodePlan<kHeadDim, kNoRope, Variant, Params>(
          ws.float_buffer, ws.float_bytes, schedule.int_buffer, schedule.int_host, ws.int_bytes,
          plan, host_indptr, static_cast<std::uint32_t>(call.n),
          static_cast<std::uint32_t>(call.heads), static_cast<std::uint32_t>(call.page_size),
          /*enable_cuda_graph=*/false, stream, estimate);
      if (status != cudaSuccess) return status;
    });
    const std::vector<std::int64_t> offsets = plan.ToVector();
    std::copy(offsets.begin(), offsets.end(), schedule.plan.begin());
    return cudaSuccess;
  } catch (const fi::Error& e) {
    throw Error(ErrorCode::kInternal, std::string("FlashInfer decode plan: ") + e.what());
  }
}

template <DType E, int kHeadDim>
cudaError_t run_decode(const LayerView& kv, const DecodeCall& call, const DecodeWorkspace& ws,
                       const DecodeSchedule& schedule, const std::int32_t* indptr,
                       const std::int32_t* last_page_len, const std::int32_t* indices,
                       cudaStream_t stream) {
  namespace fi = ::flashinfer;
  using T = typename ElementType<E>::type;
  using Params = fi::BatchDecodeParams<T, T, T, std::int32_t>;
  constexpr auto kNoRope = fi::PosEncodingMode::kNone;
  try {
    fi::DecodePlanInfo plan;
    plan.FromVector(std::vector<std::int64_t>(schedule.plan.begin(), schedule.plan.end()));
    // Strides in elements: a page is page_size tokens of the slot's [token][kv_head][head_dim].
    const std::int64_t strides[3] = {call.page_size * kv.token_stride, kv.token_stride,
                                     kv.head_stride};
    fi::paged_kv_t<T, std::int32_t> paged(
        static_cast<std::uint32_t>(kv.layout.kv_heads), static_cast<std::uint32_t>(call.page_size),
        kHeadDim, static_cast<std::uint32_t>(call.n), fi::QKVLayout::kNHD,
        static_cast<T*>(const_cast<void*>(kv.k)), static_cast<T*>(const_cast<void*>(kv.v)), strides,
        const_cast<std::int32_t*>(indices), const_cast<std::int32_t*>(indptr),
        const_cast<std::int32_t*>(last_page_len));
    Params params;
    params.q = static_cast<T*>(const_cast<void*>(call.q));
    params.paged_kv = paged;
    params.o = static_cast<T*>(call.out);
    params.num_qo_heads = static_cast<std::uint32_t>(call.heads);
    params.q_stride_n = call.heads * kHeadDim;
    params.q_stride_h = kHeadDim;
    params.window_left = call.window_left;
    params.logits_soft_cap = call.soft_cap;
    params.sm_scale = call.sm_scale;
    params.rope_rcp_scale = 1.0f;
    params.rope_rcp_theta = 1.0f;
    auto* int_base = static_cast<char*>(schedule.int_buffer);
    params.request_indices =
        reinterpret_cast<std::int32_t*>(int_base + plan.request_indices_offset);
    params.kv_tile_indices =
        reinterpret_cast<std::int32_t*>(int_base + plan.kv_tile_indices_offset);
    params.o_indptr = reinterpret_cast<std::int32_t*>(int_base + plan.o_indptr_offset);
    params.kv_chunk_size_ptr =
        reinterpret_cast<std::int32_t*>(int_base + plan.kv_chunk_size_ptr_offset);
    params.padded_batch_size = static_cast<std::uint32_t>(plan.padded_batch_size);
    T* tmp_v = nullptr;
    float* tmp_s = nullptr;
    if (plan.split_kv) {
      auto* float_base = static_cast<char*>(ws.float_buffer);
      tmp_v = reinterpret_cast<T*>(float_base + plan.v_offset);
      tmp_s = reinterpret_cast<float*>(float_base + plan.s_offset);
    }
    return fi::BatchDecodeWithPagedKVCacheDispatched<kHeadDim, kNoRope, Variant>(
        params, tmp_v, tmp_s, /*enable_pdl=*/false, stream);
  } catch (const fi::Error& e) {
    throw Error(ErrorCode::kInternal, std::string("FlashInfer decode: ") + e.what());
  }
}

template <DType E, int kHeadDim, bool kCausal>
cudaError_t run_prefill(const LayerView& kv, const PrefillCall& call, cudaStream_t stream) {
  namespace fi = ::flashinfer;
  using T = typename ElementType<E>::type;
  using Params = fi::SinglePrefillParams<T, T, T>;
  constexpr fi::MaskMode kMask = kCausal ? fi::MaskMode::kCausal : fi::MaskMode::kNone;
  // Causal: with a window, keys before the first row's window are never read: the keys start
  // there, and the causal mask (aligned to the bottom right) and the window (relative to the
  // query) hold for the shorter range as they did for the whole one. Unmasked: keys [0, keys).
  int first_key = 0;
  int kv_len = call.keys;
  if constexpr (kCausal) {
    first_key = call.window_left >= 0 ? std::max(0, call.first_position - call.window_left) : 0;
    kv_len = call.first_position + call.n - first_key;
  }
  const std::int64_t offset = static_cast<std::int64_t>(call.slot) * kv.slot_stride +
                              static_cast<std::int64_t>(first_key) * kv.token_stride;
  try {
    Params params(static_cast<T*>(const_cast<void*>(call.q)),
                  static_cast<T*>(const_cast<void*>(kv.k)) + offset,
                  static_cast<T*>(const_cast<void*>(kv.v)) + offset,
                  /*maybe_custom_mask=*/nullptr, static_cast<T*>(call.out), call.lse,
                  /*maybe_alibi_slopes=*/nullptr, static_cast<std::uint32_t>(call.heads),
                  static_cast<std::uint32_t>(kv.layout.kv_heads),
                  static_cast<std::uint32_t>(call.n), static_cast<std::uint32_t>(kv_len),
                  static_cast<std::uint32_t>(call.heads * kHeadDim), kHeadDim,
                  static_cast<std::uint32_t>(kv.token_stride),
                  static_cast<std::uint32_t>(kv.head_stride), kHeadDim, call.window_left,
                  call.soft_cap, call.sm_scale, /*rope_scale=*/1.0f,
                  /*rope_theta=*/1.0f);
    return fi::SinglePrefillWithKVCacheDispatched<kHeadDim, kHeadDim, fi::PosEncodingMode::kNone,
                                                  /*USE_FP16_QK_REDUCTION=*/false, kMask, Variant>(
        params, static_cast<T*>(call.tmp), stream);
  } catch (const fi::Error& e) {
    throw Error(ErrorCode::kInternal, std::string("FlashInfer prefill: ") + e.what());
  }
}

}  // namespace kvo::model::flashinfer_ops

// Explicit instantiations for one element type, every head size served (inside the namespace).
#define KVO_FLASHINFER_DECODE_FOR(E, D)                                                          \
  template cudaError_t plan_decode<E, D>(const LayerView&, const DecodeCall&,                    \
                                         const DecodeWorkspace&, DecodeSchedule&, std::int32_t*, \
                                         cudaStream_t);                                          \
  template cudaError_t run_decode<E, D>(                                                         \
      const LayerView&, const DecodeCall&, const DecodeWorkspace&, const DecodeSchedule&,        \
      const std::int32_t*, const std::int32_t*, const std::int32_t*, cudaStream_t);
#define KVO_FLASHINFER_DECODE(E)   \
  KVO_FLASHINFER_DECODE_FOR(E, 64) \
  KVO_FLASHINFER_DECODE_FOR(E, 128) KVO_FLASHINFER_DECODE_FOR(E, 256)
#define KVO_FLASHINFER_PREFILL_FOR(E, CAUSAL)                                            \
  template cudaError_t run_prefill<E, 64, CAUSAL>(const LayerView&, const PrefillCall&,  \
                                                  cudaStream_t);                         \
  template cudaError_t run_prefill<E, 128, CAUSAL>(const LayerView&, const PrefillCall&, \
                                                   cudaStream_t);                        \
  template cudaError_t run_prefill<E, 256, CAUSAL>(const LayerView&, const PrefillCall&, \
                                                   cudaStream_t);
#define KVO_FLASHINFER_PREFILL(E) KVO_FLASHINFER_PREFILL_FOR(E, true)
#define KVO_FLASHINFER_PREFILL_UNMASKED(E) KVO_FLASHINFER_PREFILL_FOR(E, false)
