// The host side of FlashInfer attention: the paged view of the decoding rows (decode_pages.hpp),
// built on a pinned mirror and copied with one transfer per kind of layer per decode step (every
// layer of that kind in the step reuses it and its schedule), and the dispatch to the
// instantiated kernels.
#include "model/cuda/flashinfer_attention.hpp"

#include <algorithm>
#include <string>
#include <type_traits>

#include "kvoffload/error.hpp"
#include "model/cuda/cuda_check.hpp"

namespace kvo::model::flashinfer_ops {
namespace {

Error internal(const std::string& what) {
  return Error(ErrorCode::kInternal, "FlashInfer attention: " + what);
}

void check_layer(const KvLayer& kv) {
  if (kv.type != DType::kBF16 && kv.type != DType::kF16) {
    throw internal("no instantiation for element type " +
                   std::to_string(static_cast<int>(kv.type)));
  }
  if (kv.head_dim != 64 && kv.head_dim != 128 && kv.head_dim != 256) {
    throw internal("no instantiation for head_dim " + std::to_string(kv.head_dim));
  }
}

// Tokens per slot as the pages see them: a page index s * pages_per_slot + p addresses token
// p * page_size of slot s only if slots are max_seq tokens apart and pages divide them.
void check_pages(const KvLayer& kv) {
  if (kv.page_size < 1 || kv.max_seq % kv.page_size != 0 ||
      kv.slot_stride != static_cast<std::int64_t>(kv.max_seq) * kv.token_stride) {
    throw internal("the view is not slots of whole pages (max_seq " + std::to_string(kv.max_seq) +
                   ", page_size " + std::to_string(kv.page_size) + ", slot_stride " +
                   std::to_string(kv.slot_stride) + ")");
  }
}

// f(std::integral_constant<int, D>) for the instantiated head_dim D = kv.head_dim (check_layer
// ruled out the others).
template <typename F>
cudaError_t by_head_dim(const KvLayer& kv, F&& f) {
  switch (kv.head_dim) {
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return f(std::integral_constant<int, 256>{});
  }
}

}  // namespace

void decode(const KvLayer& kv, const DecodeCall& call, DecodeWorkspace& ws, cudaStream_t stream) {
  if (call.n == 0) return;
  check_layer(kv);
  check_pages(kv);
  const bool bf16 = kv.type == DType::kBF16;
  const PageGeometry geometry{kv.page_size, kv.max_seq / kv.page_size};
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

void prefill(const KvLayer& kv, const PrefillCall& call, cudaStream_t stream) {
  if (call.n == 0) return;
  check_layer(kv);
  PrefillCall c = call;
  // Merging split keys runs one block of head_dim / 8 x heads threads per row; past 1024 threads
  // it cannot launch, so such a model's prefill does not split the keys.
  if (call.heads * (kv.head_dim / 8) > 1024) c.tmp = nullptr;
  const bool bf16 = kv.type == DType::kBF16;
  const cudaError_t status = by_head_dim(kv, [&](auto d) {
    return bf16 ? run_prefill<DType::kBF16, d(), true>(kv, c, stream)
                : run_prefill<DType::kF16, d(), true>(kv, c, stream);
  });
  KVO_MODEL_CUDA_CHECK(status);
  KVO_MODEL_LAUNCH_CHECK();
}

void prefill_unmasked(const KvLayer& kv, const PrefillCall& call, cudaStream_t stream) {
  if (call.n == 0) return;
  check_layer(kv);
  if (kv.type != DType::kBF16 || call.keys < 1 || call.window_left != -1) {
    throw internal("an unmasked prefill takes bf16 tiles of at least one key and no window");
  }
  PrefillCall c = call;
  if (call.heads * (kv.head_dim / 8) > 1024) c.tmp = nullptr;  // as in prefill()
  const cudaError_t status =
      by_head_dim(kv, [&](auto d) { return run_prefill<DType::kBF16, d(), false>(kv, c, stream); });
  KVO_MODEL_CUDA_CHECK(status);
  KVO_MODEL_LAUNCH_CHECK();
}

}  // namespace kvo::model::flashinfer_ops
