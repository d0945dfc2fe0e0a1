// The host side of FlashInfer attention: the paged view of the decoding rows (decode_pages.hpp),
// built on a pinned mirror and copied with one transfer per kind of layer per decode step (every
// layer of that kind in the step reuses it and its schedule), and the dispatch to the
// instantiated kernels.
#include "model/cuda/flashinfer_attention.hpp"

#include <algorithm>
#include <string>
#include <type_traits>

#include "kvoffload/error.hpp"
#include "kvoffload/types.hpp"
#include "model/cuda/cuda_check.hpp"

namespace kvo::model::flashinfer_ops {
namespace {

Error internal(const std::string& what) {
  return Error(ErrorCode::kInternal, "FlashInfer attention: " + what);
}

void check_layer(const LayerView& kv) {
  const KvLayout& layout = kv.layout;
  if (layout.dtype != DType::kBF16 && layout.dtype != DType::kF16) {
    throw internal("no instantiation for element type " + std::string(dtype_name(layout.dtype)));
  }
  if (layout.head_dim != 64 && layout.head_dim != 128 && layout.head_dim != 256) {
    throw internal("no instantiation for head_dim " + std::to_string(layout.head_dim));
  }
  // FlashInfer reads K and V through one set of strides.
  if (layout.v_head_dim != layout.head_dim || kv.v_slot_stride != kv.slot_stride ||
      kv.v_token_stride != kv.token_stride || kv.v_head_stride != kv.head_stride) {
    throw internal("V is laid out unlike K (v_head_dim " + std::to_string(layout.v_head_dim) +
                   ", V token stride " + std::to_string(kv.v_token_stride) + " vs K's " +
                   std::to_string(kv.token_stride) + ")");
  }
}

// Tokens per slot as the pages see them: a page index s * pages_per_slot + p addresses token
// p * page_size of slot s only if slots are max_seq tokens apart and pages divide them.
void check_pages(const LayerView& kv, int page_size) {
  const int max_seq = kv.layout.max_seq;
  if (page_size < 1 || max_seq % page_size != 0 ||
      kv.slot_stride != static_cast<std::int64_t>(max_seq) * kv.token_stride) {
    throw internal("the view is not slots of whole pages (max_seq " + std::to_string(max_seq) +
                   ", page_size " + std::to_string(page_size) + ", slot_stride " +
                   std::to_string(kv.slot_stride) + ")");
  }
}

// f(std::integral_constant<int, D>) for the instantiated head_dim D = kv.layout.head_dim
// (check_layer ruled out the others).
template <typename F>
cudaError_t by_head_dim(const LayerView& kv, F&& f) {
  switch (kv.layout.head_dim) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return f(std::integral_constant<int, 256>{});
  }
}

}  // namespace

void decode(const LayerView& kv, const DecodeCall& call, DecodeWorkspace& ws, cudaStream_t stream) {
  if (call.n == 0) return;
  check_layer(kv);
  check_pages(kv, call.page_size);
  const bool bf16 = kv.layout.dtype == DType::kBF16;
  const PageGeometry geometry{call.page_size, kv.layout.max_seq / call.page_size};
  const PagedRows rows{call.n, call.slots, call.kv_lens, call.window_left};
  const DecodeSchedules::Use use = ws.schedules.use(geometry, rows);
  DecodeSchedule& schedule = ws.schedule[static_cast<std::size_t>(use.schedule)];
  const PageTableView device = page_table_view(schedule.pages, call.n);

  if (use.plan) {
    // A new schedule: its mirrors are rewritten, so its previous plan's copies out of them must
    // be done.
    KVO_MODEL_CUDA_CHECK(cudaEventSynchronize(schedule.mirrors_copied));
    const std::size_t count = ws.schedules.write_table(schedule.pages_host, ws.pages_count);
    // From here copies on `stream` read the mirrors: the event is recorded after them on every
    // path out, so the next plan waits for them even when this one throws.
    struct RecordOnExit {
      cudaEvent_t event;
      cudaStream_t stream;
      ~RecordOnExit() { cudaEventRecord(event, stream); }
    } record{schedule.mirrors_copied, stream};
    KVO_MODEL_CUDA_CHECK(cudaMemcpyAsync(schedule.pages, schedule.pages_host,
                                         count * sizeof(std::int32_t), cudaMemcpyHostToDevice,
                                         stream));
    std::int32_t* indptr = schedule.pages_host;
    const cudaError_t status = by_head_dim(kv, [&](auto d) {
      return bf16 ? plan_decode<DType::kBF16, d()>(kv, call, ws, schedule, indptr, stream)
                  : plan_decode<DType::kF16, d()>(kv, call, ws, schedule, indptr, stream);
    });
    KVO_MODEL_CUDA_CHECK(status);
    ws.schedules.planned();  // only once the schedule is whole
  }

  const cudaError_t status = by_head_dim(kv, [&](auto d) {
    return bf16 ? run_decode<DType::kBF16, d()>(kv, call, ws, schedule, device.indptr,
                                                device.last_page_len, device.indices, stream)
                : run_decode<DType::kF16, d()>(kv, call, ws, schedule, device.indptr,
                                               device.last_page_len, device.indices, stream);
  });
  KVO_MODEL_CUDA_CHECK(status);
  KVO_MODEL_LAUNCH_CHECK();
}

void prefill(const LayerView& kv, const PrefillCall& call, cudaStream_t stream) {
  if (call.n == 0) return;
  check_layer(kv);
  PrefillCall c = call;
  // Merging split keys runs one block of head_dim / 8 x heads threads per row; past 1024 threads
  // it cannot launch, so such a model's prefill does not split the keys.
  if (call.heads * (kv.layout.head_dim / 8) > 1024) c.tmp = nullptr;
  const bool bf16 = kv.layout.dtype == DType::kBF16;
  const cudaError_t status = by_head_dim(kv, [&](auto d) {
    return bf16 ? run_prefill<DType::kBF16, d(), true>(kv, c, stream)
                : run_prefill<DType::kF16, d(), true>(kv, c, stream);
  });
  KVO_MODEL_CUDA_CHECK(status);
  KVO_MODEL_LAUNCH_CHECK();
}

void prefill_unmasked(const LayerView& kv, const PrefillCall& call, cudaStream_t stream) {
  if (call.n == 0) return;
  check_layer(kv);
  if (kv.layout.dtype != DType::kBF16 || call.keys < 1 || call.window_left != -1) {
    throw internal("an unmasked prefill takes bf16 tiles of at least one key and no window");
  }
  PrefillCall c = call;
  if (call.heads * (kv.layout.head_dim / 8) > 1024) c.tmp = nullptr;  // as in prefill()
  const cudaError_t status =
      by_head_dim(kv, [&](auto d) { return run_prefill<DType::kBF16, d(), false>(kv, c, stream); });
  KVO_MODEL_CUDA_CHECK(status);
  KVO_MODEL_LAUNCH_CHECK();
}

}  // namespace kvo::model::flashinfer_ops
