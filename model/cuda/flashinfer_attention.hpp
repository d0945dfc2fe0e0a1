// Attention through FlashInfer's kernels, instantiated ahead of time in model/flashinfer_*.cu for
// the configurations attention_kernels.hpp lists. This header is plain C++: the FlashInfer and
// CUDA templates stay in those few translation units.
//
// K and V are the cache's views: [slot][token][kv_head][head_dim] (NHD) with explicit element
// strides. Decode reads every slot as a run of pages of page_size tokens (slot s, token t is page
// s * (max_seq / page_size) + t / page_size), so all decoding slots go in one launch, each with
// its own length, and the keys are split over the GPU when the slots alone do not fill it.
// Prefill reads one slot's keys in place with a causal mask aligned to the bottom right.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kvoffload/cache.hpp"
#include "model/common/numerics.hpp"
#include "model/cuda/decode_pages.hpp"

namespace kvo::model::flashinfer_ops {

// One decode schedule: FlashInfer's plan in int_buffer and the page table it reads in pages,
// each written through a pinned mirror and copied on the stream.
struct DecodeSchedule {
  void* int_buffer = nullptr;          // the plan (device), DecodeWorkspace::int_bytes
  void* int_host = nullptr;            // its pinned mirror
  std::int32_t* pages = nullptr;       // indptr, last_page_len, indices (device)
  std::int32_t* pages_host = nullptr;  // their pinned mirror, DecodeWorkspace::pages_count
  // Recorded after the mirrors' copies; waited before they are written again.
  cudaEvent_t mirrors_copied = nullptr;
  std::array<std::int64_t, 10> plan{};  // FlashInfer's plan, as offsets into the buffers
};

// The decode schedules' buffers: one schedule per kind of layer (full, window: their pages
// differ, model/cuda/decode_pages.hpp), sharing the split-KV partials, which a layer's kernel
// finishes with before the next starts on the stream.
struct DecodeWorkspace {
  void* float_buffer = nullptr;  // split-KV partials (device)
  std::size_t float_bytes = 0;
  std::size_t int_bytes = 0;
  std::size_t pages_count = 0;  // int32s of each page table
  int grid = 0;                 // the most blocks a schedule may use (it sized float_buffer)
  std::array<DecodeSchedule, DecodeSchedules::kMaxKinds> schedule{};  // [schedules.kinds()]
  // Which schedule a call reads and when it is planned anew: each kind once per step.
  DecodeSchedules schedules{1};
};

// n query rows, row i for slot slots[i] with keys [0, kv_lens[i]) (its own key included).
struct DecodeCall {
  const void* q = nullptr;  // [n][heads][head_dim] (type), device
  void* out = nullptr;      // [n][heads][head_dim] (type), device
  int n = 0;
  int heads = 0;
  const std::int32_t* slots = nullptr;    // [n], host
  const std::int32_t* kv_lens = nullptr;  // [n], host
  // Keys before position - window_left are masked (and, whole pages of them, not read).
  int window_left = -1;
  float sm_scale = 1;
  float soft_cap = 0;  // > 0: scores s = q.k * sm_scale become soft_cap * tanh(s / soft_cap)
  int page_size = 0;   // tokens per page; divides the view's max_seq
};

// The query rows [first_position, first_position + n) of one slot over its keys
// [0, first_position + n), causal (prefill); or, unmasked (prefill_unmasked), over keys
// [0, keys) of the slot, every row seeing every key.
struct PrefillCall {
  const void* q = nullptr;  // [n][heads][head_dim] (type), device
  void* out = nullptr;      // [n][heads][head_dim] (type), device
  int n = 0;
  int heads = 0;
  int slot = 0;
  int first_position = 0;
  int window_left = -1;
  float sm_scale = 1;
  float soft_cap = 0;   // as DecodeCall's
  void* tmp = nullptr;  // split-KV partials, tmp_bytes; nullptr: never split the keys
  std::size_t tmp_bytes = 0;
  int keys = 0;          // prefill_unmasked: the keys
  float* lse = nullptr;  // [n][heads] f32, FlashInfer's log-sum-exp (log2 domain); may be null
};

// Both throw kvo::Error(kDevice) for a CUDA failure and kInternal for a shape FlashInfer does not
// serve or a layout it cannot read (choose_attention_kernels rules those out first). Everything
// is ordered on `stream`; a decode that plans anew first waits, on the host, for its schedule's
// previous copies out of the pinned mirrors (a step's first layer of each kind).
void decode(const LayerView& kv, const DecodeCall& call, DecodeWorkspace& workspace,
            cudaStream_t stream);
void prefill(const LayerView& kv, const PrefillCall& call, cudaStream_t stream);
// Over keys [0, call.keys) of the slot with no mask (bf16 only: the tiles of a quantized cache
// before the queries' own keys). REQUIRES: call.keys >= 1, call.window_left == -1.
void prefill_unmasked(const LayerView& kv, const PrefillCall& call, cudaStream_t stream);

// The instantiations behind them, one translation unit per (kernel, dtype) for a parallel build.
// plan_decode: FlashInfer's schedule for rows whose page ranges are `host_indptr` [n + 1], written
// to the schedule's pinned mirror and copied on `stream`; its offsets go to schedule.plan.
// run_decode: the kernel over the device page arrays, by schedule.plan.
template <DType E, int kHeadDim>
cudaError_t plan_decode(const LayerView& kv, const DecodeCall& call,
                        const DecodeWorkspace& workspace, DecodeSchedule& schedule,
                        std::int32_t* host_indptr, cudaStream_t stream);
template <DType E, int kHeadDim>
cudaError_t run_decode(const LayerView& kv, const DecodeCall& call,
                       const DecodeWorkspace& workspace, const DecodeSchedule& schedule,
                       const std::int32_t* indptr, const std::int32_t* last_page_len,
                       const std::int32_t* indices, cudaStream_t stream);
template <DType E, int kHeadDim, bool kCausal>
cudaError_t run_prefill(const LayerView& kv, const PrefillCall& call, cudaStream_t stream);

}  // namespace kvo::model::flashinfer_ops
