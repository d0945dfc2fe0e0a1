// The C ABI's host attention (include/kvoffload/kvoffload.h, since 0.5): split attention's host
// part over a view's host rows, through offload/attend/decode_attention.hpp, the code the host
// path decodes with.
#include <cmath>
#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/quant.hpp"
#include "offload/attend/decode_attention.hpp"
#include "offload/attend/thread_pool.hpp"
#include "prefetch/api/c_api_support.hpp"

using kvo::c_api::CallError;
using kvo::c_api::on_thread;
using kvo::c_api::require;

struct kvo_host_attention {
  kvo::attend::DecodeShape shape;
  int max_rows = 0;
  std::unique_ptr<kvo::attend::ThreadPool> pool;
  std::vector<float> floats;                      // every float buffer of the scratch
  std::vector<kvo::attend::SoftmaxState> states;  // the parts' states
  std::vector<int> tasks;                         // first_task
  std::unique_ptr<kvo::attend::DecodeAttention> decode;
  std::vector<std::int32_t> positions, begin, end;  // per row; per slot of the view
};

namespace {

[[noreturn]] void refuse(const std::string& what) {
  throw kvo::Error(kvo::ErrorCode::kInvalidArgument, what);
}

}  // namespace

kvo_status kvo_host_attention_create(int32_t heads, int32_t kv_heads, int32_t head_dim,
                                     kvo_dtype dtype, int32_t max_rows, int32_t threads,
                                     float scale, float softcap,
                                     kvo_host_attention_t** out_attention) {
  return on_thread("kvo_host_attention_create", [&] {
    require(out_attention, "out_attention is NULL");
    *out_attention = nullptr;
    if (heads < 1 || kv_heads < 1 || head_dim < 1 || max_rows < 1) {
      refuse("heads (" + std::to_string(heads) + "), kv_heads (" + std::to_string(kv_heads) +
             "), head_dim (" + std::to_string(head_dim) + ") and max_rows (" +
             std::to_string(max_rows) + ") must each be at least 1");
    }
    if (heads % kv_heads != 0) {
      refuse("heads (" + std::to_string(heads) + ") is not a multiple of kv_heads (" +
             std::to_string(kv_heads) + ")");
    }
    if (threads < 0) refuse("threads is " + std::to_string(threads) + " (0: every core)");
    if (!std::isfinite(scale) || !std::isfinite(softcap) || softcap < 0) {
      refuse("scale and softcap must be finite and softcap >= 0");
    }
    kvo::DType type = kvo::DType::kF32;
    int code = 0;
    static_assert(sizeof(dtype) == sizeof(int), "C enums are stored as int");
    std::memcpy(&code, &dtype, sizeof code);
    if (!kvo::dtype_of_c(code, &type)) {
      refuse("dtype " + std::to_string(code) +
             " is not a kvo_dtype (KVO_DTYPE_F32, _F16, _BF16, _FP8_E4M3 or _INT8)");
    }
    auto a = std::make_unique<kvo_host_attention>();
    a->shape.heads = heads;
    a->shape.kv_heads = kv_heads;
    a->shape.head_dim = head_dim;
    a->shape.type = type;
    a->shape.scale = scale != 0 ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
    a->shape.softcap = softcap;
    a->max_rows = max_rows;
    a->pool = std::make_unique<kvo::attend::ThreadPool>(
        threads > 0 ? threads : kvo::attend::available_cores());
    const int pool_threads = a->pool->threads();
    const auto sizes = kvo::attend::DecodeAttention::sizes(a->shape, max_rows);
    const std::size_t per_thread = sizes.q + sizes.kv + sizes.scores + 2 * sizes.dequant;
    a->floats.assign(per_thread * static_cast<std::size_t>(pool_threads) + sizes.part_values, 0.0f);
    a->states.resize(sizes.part_states);
    a->tasks.resize(sizes.first_task);
    kvo::attend::DecodeScratch scratch;
    float* next = a->floats.data();
    const auto take = [&](std::size_t n) {
      float* p = n > 0 ? next : nullptr;
      next += n;
      return p;
    };
    for (int t = 0; t < pool_threads; ++t) {
      kvo::attend::DecodeScratch::Thread th;
      th.q = take(sizes.q);
      th.kv = take(sizes.kv);
      th.scores = take(sizes.scores);
      th.k = take(sizes.dequant);
      th.v = take(sizes.dequant);
      scratch.threads.push_back(th);
    }
    scratch.part_values = take(sizes.part_values);
    scratch.part_state = a->states.data();
    scratch.first_task = a->tasks.data();
    a->decode = std::make_unique<kvo::attend::DecodeAttention>(a->shape, *a->pool, scratch);
    a->positions.resize(static_cast<std::size_t>(max_rows));
    *out_attention = a.release();
  });
}

void kvo_host_attention_destroy(kvo_host_attention_t* attention) {
  delete attention;
}

kvo_status kvo_host_attention_run(kvo_host_attention_t* attention, const kvo_layer_view* view,
                                  const float* q, int32_t rows, const int32_t* slots,
                                  const int32_t* key_begin, const int32_t* key_end, float* out,
                                  float* lse) {
  return on_thread("kvo_host_attention_run", [&] {
    require(attention, "attention is NULL");
    kvo_host_attention& a = *attention;
    require(view, "view is NULL");
    if (view->struct_size < offsetof(kvo_layer_view, host_v) + sizeof(view->host_v)) {
      refuse("view's struct_size (" + std::to_string(view->struct_size) +
             ") is older than 0.3's, which has the host rows");
    }
    require(q, "q is NULL");
    require(slots, "slots is NULL");
    require(key_begin, "key_begin is NULL");
    require(key_end, "key_end is NULL");
    require(out, "out is NULL");
    if (view->host_k == nullptr || view->host_v == nullptr) {
      refuse("the view of layer " + std::to_string(view->layer) +
             " has no host rows (host_k, host_v): only a streamed layer of a step that splits "
             "has them");
    }
    if (rows < 1 || rows > a.max_rows) {
      refuse("rows is " + std::to_string(rows) + ", and this attention takes 1 to " +
             std::to_string(a.max_rows));
    }
    int code = 0;
    std::memcpy(&code, &view->dtype, sizeof code);
    kvo::DType type = kvo::DType::kF32;
    if (!kvo::dtype_of_c(code, &type) || type != a.shape.type ||
        view->kv_heads != a.shape.kv_heads || view->head_dim != a.shape.head_dim ||
        view->v_head_dim != view->head_dim) {
      refuse("the view holds rows of " + std::to_string(view->kv_heads) + " kv heads of " +
             std::to_string(view->head_dim) + " (V: " + std::to_string(view->v_head_dim) +
             ") elements of dtype " + std::to_string(code) + "; this attention reads " +
             std::to_string(a.shape.kv_heads) + " heads of " + std::to_string(a.shape.head_dim) +
             ", K and V alike, of " + kvo::dtype_name(a.shape.type));
    }
    require(view->lengths, "view->lengths is NULL");
    if (view->slots < 1) refuse("view->slots is " + std::to_string(view->slots));
    if (kvo::is_quantized(type)) {  // the scales where the rows keep them
      const auto at =
          static_cast<std::int64_t>(kvo::quant_scale_offset(view->kv_heads, view->head_dim));
      if (view->k_scale_offset != at || view->v_scale_offset != at) {
        refuse("the view's scale offsets (" + std::to_string(view->k_scale_offset) + ", " +
               std::to_string(view->v_scale_offset) +
               ") are not where its rows keep their scales (" + std::to_string(at) + ")");
      }
    }
    const auto slot_count = static_cast<std::size_t>(view->slots);
    a.begin.assign(slot_count, -1);
    a.end.assign(slot_count, 0);
    for (int32_t i = 0; i < rows; ++i) {
      const int32_t s = slots[i];
      if (s < 0 || s >= view->slots) {
        refuse("slots[" + std::to_string(i) + "] is " + std::to_string(s) + ", and the view has " +
               std::to_string(view->slots));
      }
      if (a.begin[static_cast<std::size_t>(s)] >= 0) {
        refuse("slot " + std::to_string(s) + " is given twice (slots must be distinct)");
      }
      const int32_t length = view->lengths[s];
      if (key_begin[i] < 0 || key_begin[i] > key_end[i] || key_end[i] > length) {
        refuse("row " + std::to_string(i) + " asks for keys [" + std::to_string(key_begin[i]) +
               ", " + std::to_string(key_end[i]) + ") of slot " + std::to_string(s) +
               ", which holds " + std::to_string(length) + " committed rows in host memory");
      }
      a.begin[static_cast<std::size_t>(s)] = key_begin[i];
      a.end[static_cast<std::size_t>(s)] = key_end[i];
      a.positions[static_cast<std::size_t>(i)] = key_end[i] - 1;
    }
    kvo::LayerView rows_view;
    rows_view.k = const_cast<void*>(view->host_k);
    rows_view.v = const_cast<void*>(view->host_v);
    rows_view.slot_stride = view->slot_stride;
    rows_view.token_stride = view->token_stride;
    rows_view.head_stride = view->head_stride;
    rows_view.v_slot_stride = view->v_slot_stride;
    rows_view.v_token_stride = view->v_token_stride;
    rows_view.v_head_stride = view->v_head_stride;
    rows_view.layout.k_scale_offset = static_cast<std::uint64_t>(view->k_scale_offset);
    rows_view.layout.v_scale_offset = static_cast<std::uint64_t>(view->v_scale_offset);
    kvo::attend::KeyRange range;
    range.begin = a.begin.data();
    range.end = a.end.data();
    range.lse = lse;
    a.decode->run(q, rows, slots, a.positions.data(), 0, rows_view, out, range);
  });
}
