// The host side of FlashInfer attention: the paged view of the decoding slots, built on a pinned
// mirror and copied with one transfer per step, and the dispatch to the instantiated kernels.
#include "model/flashinfer_attention.hpp"

#include <string>

#include "kvoffload/error.hpp"
#include "model/cuda_check.hpp"

namespace kvo::model::flashinfer_ops {
namespace {

Error unsupported(const char* what, Elem type, int head_dim) {
  return Error(ErrorCode::kInternal, std::string("FlashInfer ") + what +
                                         " has no instantiation for element type " +
                                         std::to_string(static_cast<int>(type)) + ", head_dim " +
                                         std::to_string(head_dim));
}

}  // namespace

void decode(const KvLayer& kv, const DecodeCall& call, DecodeWorkspace& ws, cudaStream_t stream) {
  if (call.n == 0) return;
  const int pages_per_slot = kv.max_seq / kv.page_size;
  // The mirrors are rewritten below: the previous step's copies out of them must be done.
  KVO_MODEL_CUDA_CHECK(cudaEventSynchronize(ws.mirrors_copied));

  // pages_host: indptr [n + 1] | last_page_len [n] | indices [sum of pages], row i's pages being
  // those of its slot in order: s * pages_per_slot + [0, ceil(kv_len / page_size)).
  std::int32_t* indptr = ws.pages_host;
  std::int32_t* last_page_len = indptr + call.n + 1;
  std::int32_t* indices = last_page_len + call.n;
  const std::size_t capacity = ws.pages_count - static_cast<std::size_t>(2 * call.n + 1);
  indptr[0] = 0;
  for (int i = 0; i < call.n; ++i) {
    const int len = call.kv_lens[i];
    if (len < 1 || len > kv.max_seq) {
      throw Error(ErrorCode::kInternal, "FlashInfer decode: row " + std::to_string(i) + " has " +
                                            std::to_string(len) + " keys");
    }
    const int pages = (len + kv.page_size - 1) / kv.page_size;
    if (static_cast<std::size_t>(indptr[i]) + static_cast<std::size_t>(pages) > capacity) {
      throw Error(ErrorCode::kInternal, "FlashInfer decode: page indices exceed the workspace");
    }
    for (int p = 0; p < pages; ++p) indices[indptr[i] + p] = call.slots[i] * pages_per_slot + p;
    indptr[i + 1] = indptr[i] + pages;
    last_page_len[i] = len - (pages - 1) * kv.page_size;
  }
  const std::size_t count = static_cast<std::size_t>(2 * call.n + 1 + indptr[call.n]);
  // From here the mirrors are read by copies on `stream`: the event is recorded after them on
  // every path out, so the next call waits for them even when this one throws.
  struct RecordOnExit {
    cudaEvent_t event;
    cudaStream_t stream;
    ~RecordOnExit() { cudaEventRecord(event, stream); }
  } record{ws.mirrors_copied, stream};
  KVO_MODEL_CUDA_CHECK(cudaMemcpyAsync(ws.pages, ws.pages_host, count * sizeof(std::int32_t),
                                       cudaMemcpyHostToDevice, stream));
  const std::int32_t* d_indptr = ws.pages;
  const std::int32_t* d_last = d_indptr + call.n + 1;
  const std::int32_t* d_indices = d_last + call.n;

  cudaError_t status = cudaSuccess;
  const bool bf16 = kv.type == Elem::kBF16;
  if (kv.type != Elem::kBF16 && kv.type != Elem::kF16) throw unsupported("decode", kv.type, 0);
  switch (kv.head_dim) {
    case 64:
      status = bf16 ? run_decode<Elem::kBF16, 64>(kv, call, ws, d_indptr, d_last, d_indices, indptr,
                                                  stream)
                    : run_decode<Elem::kF16, 64>(kv, call, ws, d_indptr, d_last, d_indices, indptr,
                                                 stream);
      break;
    case 128:
      status = bf16 ? run_decode<Elem::kBF16, 128>(kv, call, ws, d_indptr, d_last, d_indices,
                                                   indptr, stream)
                    : run_decode<Elem::kF16, 128>(kv, call, ws, d_indptr, d_last, d_indices, indptr,
                                                  stream);
      break;
    default:
      throw unsupported("decode", kv.type, kv.head_dim);
  }
  KVO_MODEL_CUDA_CHECK(status);
  KVO_MODEL_LAUNCH_CHECK();
}

void prefill(const KvLayer& kv, const PrefillCall& call, cudaStream_t stream) {
  if (call.n == 0) return;
  cudaError_t status = cudaSuccess;
  const bool bf16 = kv.type == Elem::kBF16;
  if (kv.type != Elem::kBF16 && kv.type != Elem::kF16) throw unsupported("prefill", kv.type, 0);
  switch (kv.head_dim) {
    case 64:
      status = bf16 ? run_prefill<Elem::kBF16, 64>(kv, call, stream)
                    : run_prefill<Elem::kF16, 64>(kv, call, stream);
      break;
    case 128:
      status = bf16 ? run_prefill<Elem::kBF16, 128>(kv, call, stream)
                    : run_prefill<Elem::kF16, 128>(kv, call, stream);
      break;
    default:
      throw unsupported("prefill", kv.type, kv.head_dim);
  }
  KVO_MODEL_CUDA_CHECK(status);
  KVO_MODEL_LAUNCH_CHECK();
}

}  // namespace kvo::model::flashinfer_ops
