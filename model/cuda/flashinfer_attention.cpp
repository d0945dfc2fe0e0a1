// The host side of FlashInfer attention: the paged view of the decoding rows, built on a pinned
// mirror and copied with one transfer per decode step (every layer of a step reuses it and its
// schedule), and the dispatch to the instantiated kernels.
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
  const int pages_per_slot = kv.max_seq / kv.page_size;
  const bool bf16 = kv.type == DType::kBF16;

  // Row i reads pages [first, last) of its slot: from the page that holds the first key of its
  // window (0 without one) to the one that holds its own key. A window shortens the row's keys
  // from the left; the mask is relative to the last key, so it holds as before.
  std::vector<std::int32_t>& rows = ws.rows;
  rows.resize(3 * static_cast<std::size_t>(call.n));
  for (int i = 0; i < call.n; ++i) {
    const int len = call.kv_lens[i];
    if (len < 1 || len > kv.max_seq || call.slots[i] < 0) {
      throw internal("row " + std::to_string(i) + " has " + std::to_string(len) + " keys in slot " +
                     std::to_string(call.slots[i]));
    }
    const int first_key = call.window_left >= 0 ? std::max(0, len - 1 - call.window_left) : 0;
    rows[3 * static_cast<std::size_t>(i)] = call.slots[i];
    rows[3 * static_cast<std::size_t>(i) + 1] = first_key / kv.page_size;
    rows[3 * static_cast<std::size_t>(i) + 2] = len;
  }
  const std::int32_t* d_indptr = ws.pages;
  const std::int32_t* d_last = d_indptr + call.n + 1;
  const std::int32_t* d_indices = d_last + call.n;

  if (rows != ws.planned_rows) {
    // A new schedule: the mirrors are rewritten, so the previous plan's copies out of them must
    // be done.
    KVO_MODEL_CUDA_CHECK(cudaEventSynchronize(ws.mirrors_copied));
    ws.planned_rows.clear();
    // pages_host: indptr [n + 1] | last_page_len [n] | indices [sum of pages].
    std::int32_t* indptr = ws.pages_host;
    std::int32_t* last_page_len = indptr + call.n + 1;
    std::int32_t* indices = last_page_len + call.n;
    const std::size_t capacity = ws.pages_count - static_cast<std::size_t>(2 * call.n + 1);
    indptr[0] = 0;
    for (int i = 0; i < call.n; ++i) {
      const int slot = rows[3 * static_cast<std::size_t>(i)];
      const int first = rows[3 * static_cast<std::size_t>(i) + 1];
      const int len = rows[3 * static_cast<std::size_t>(i) + 2];
      const int end = (len + kv.page_size - 1) / kv.page_size;
      if (static_cast<std::size_t>(indptr[i]) + static_cast<std::size_t>(end - first) > capacity) {
        throw internal("the page indices of " + std::to_string(call.n) +
                       " rows exceed the planned workspace");
      }
      for (int p = first; p < end; ++p) indices[indptr[i] + p - first] = slot * pages_per_slot + p;
      indptr[i + 1] = indptr[i] + end - first;
      last_page_len[i] = len - (end - 1) * kv.page_size;
    }
    const std::size_t count = static_cast<std::size_t>(2 * call.n + 1 + indptr[call.n]);
    // From here copies on `stream` read the mirrors: the event is recorded after them on every
    // path out, so the next plan waits for them even when this one throws.
    struct RecordOnExit {
      cudaEvent_t event;
      cudaStream_t stream;
      ~RecordOnExit() { cudaEventRecord(event, stream); }
    } record{ws.mirrors_copied, stream};
    KVO_MODEL_CUDA_CHECK(cudaMemcpyAsync(ws.pages, ws.pages_host, count * sizeof(std::int32_t),
                                         cudaMemcpyHostToDevice, stream));
    const cudaError_t status = by_head_dim(kv, [&](auto d) {
      return bf16 ? plan_decode<DType::kBF16, d()>(kv, call, ws, indptr, stream)
                  : plan_decode<DType::kF16, d()>(kv, call, ws, indptr, stream);
    });
    KVO_MODEL_CUDA_CHECK(status);
    ws.planned_rows = rows;  // only once the schedule is whole
  }

  const cudaError_t status = by_head_dim(kv, [&](auto d) {
    return bf16 ? run_decode<DType::kBF16, d()>(kv, call, ws, d_indptr, d_last, d_indices, stream)
                : run_decode<DType::kF16, d()>(kv, call, ws, d_indptr, d_last, d_indices, stream);
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
