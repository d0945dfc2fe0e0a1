// The C ABI (include/kvoffload/kvoffload.h) over kvo::OffloadedStaticCache. Each entry point is
// one guarded call: kvo::Error maps to its kvo_status, std::bad_alloc to out-of-memory, anything
// else to internal; the message goes to the cache (or, without one, to a thread-local buffer).
// Messages live in fixed buffers, so reporting an error never allocates and never throws.
#include "kvoffload/kvoffload.h"
#include "kvoffload/quant.hpp"

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "offload/util/element_types.hpp"
#include "prefetch/api/c_api_support.hpp"

namespace {

using namespace kvo::c_api;

// A C caller may store any int in an enum field, and reading a value outside the enum's range
// through the C++ enum type is undefined: the fields are read as the ints they are stored as.
template <typename Enum>
int stored_int(const Enum& field) {
  static_assert(sizeof(Enum) == sizeof(int), "C enums are stored as int");
  int value = 0;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

kvo::DType to_dtype(int dtype) {
  kvo::DType d = kvo::DType::kF32;
  if (kvo::dtype_of_c(dtype, &d)) return d;  // tied to kvo_dtype by element_types.hpp
  throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                   "dtype " + std::to_string(dtype) +
                       " is not a kvo_dtype (KVO_DTYPE_F32, _F16, _BF16, _FP8_E4M3 or _INT8)");
}

kvo_dtype from_dtype(kvo::DType dtype) {
  return static_cast<kvo_dtype>(kvo::traits(dtype).c_dtype);
}

kvo::BackendKind to_backend(int backend) {
  switch (backend) {
    case KVO_BACKEND_AUTO:
      return kvo::BackendKind::kAuto;
    case KVO_BACKEND_CUDA:
      return kvo::BackendKind::kCuda;
    case KVO_BACKEND_HOST:
      return kvo::BackendKind::kHost;
  }
  throw CallError{KVO_ERROR_INVALID_ARGUMENT,
                  "options->backend is not a kvo_backend (KVO_BACKEND_AUTO, _CUDA or _HOST)"};
}

// kvo_begin_step's count, checked before an array is read: it says how many ints may be read.
void check_count(const kvo_cache& c, std::int32_t count, const char* what) {
  if (count != c.cache.config().slots) {
    throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                     std::string("begin_step needs one ") + what + " per slot: count is " +
                         std::to_string(count) + ", the cache has " +
                         std::to_string(c.cache.config().slots) + " slots");
  }
}

// A count of slots for kvo_save_slots and kvo_load_slots, checked before an int is read.
void check_slot_count(const kvo_cache& c, std::int32_t count) {
  if (count < 1 || count > c.cache.config().slots) {
    throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                     "count is " + std::to_string(count) + ", and the cache has " +
                         std::to_string(c.cache.config().slots) + " slots");
  }
}

kvo::SplitMode to_split(int mode) {
  switch (mode) {
    case KVO_SPLIT_OFF:
      return kvo::SplitMode::kOff;
    case KVO_SPLIT_AUTO:
      return kvo::SplitMode::kAuto;
    case KVO_SPLIT_ROWS:
      return kvo::SplitMode::kRows;
  }
  throw CallError{KVO_ERROR_INVALID_ARGUMENT,
                  "options->split_mode is not a kvo_split_mode (KVO_SPLIT_OFF, _AUTO or _ROWS)"};
}

kvo_backend from_backend(kvo::BackendKind kind) {
  switch (kind) {
    case kvo::BackendKind::kAuto:
      return KVO_BACKEND_AUTO;
    case kvo::BackendKind::kCuda:
      return KVO_BACKEND_CUDA;
    case kvo::BackendKind::kHost:
      return KVO_BACKEND_HOST;
  }
  return KVO_BACKEND_AUTO;
}

// The sizes of the first version with struct_size (0.2): what every caller's struct holds at
// least. Fields appended since then are read or written only when they fit.
constexpr std::size_t kOptionsBase = offsetof(kvo_cache_options, v_head_dim);
constexpr std::size_t kViewBase = offsetof(kvo_layer_view, v_slot_stride);
constexpr std::size_t kStatsBase = offsetof(kvo_cache_stats, v_row_bytes);

// REQUIRES of a caller's struct: its struct_size is that of a struct this library can serve.
void check_struct_size(std::uint32_t size, std::size_t base, const char* what) {
  if (size < base) {
    throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                     std::string(what) + "->struct_size is " + std::to_string(size) +
                         ", less than any version of it (" + std::to_string(base) +
                         "); set it to sizeof(" + what + ")");
  }
}

// Copies a struct the library filled to the caller's, no further than the caller's struct_size.
template <typename T>
void write_out(const T& full, T* out) {
  const std::size_t size = std::min<std::size_t>(out->struct_size, sizeof(T));
  const std::uint32_t caller_size = out->struct_size;
  std::memcpy(out, &full, size);
  out->struct_size = caller_size;
}

kvo_cache_options defaults() {
  const kvo::CacheConfig d;
  kvo_cache_options options;
  std::memset(&options, 0, sizeof(options));
  options.struct_size = sizeof(options);
  options.layers = d.layers;
  options.kv_heads = d.kv_heads;
  options.head_dim = d.head_dim;
  options.max_seq = d.max_seq;
  options.slots = d.slots;
  options.dtype = from_dtype(d.dtype);
  options.resident_layers = d.resident_layers;
  options.ring_depth = d.ring_depth;
  options.device_budget = d.device_budget;
  options.backend = from_backend(d.backend);
  options.device = d.device;
  options.host_max_delay_us = d.host.max_delay_us;
  options.host_delay_seed = d.host.delay_seed;
  options.v_head_dim = d.v_head_dim;
  options.split_mode = KVO_SPLIT_OFF;
  options.ranks_per_node = d.shard.ranks_per_node;
  return options;
}

// The caller's options as this library knows them: what fits of its struct over the defaults;
// a newer caller's fields this library does not know must be left at zero (their defaults).
kvo_cache_options read_options(const kvo_cache_options& in) {
  check_struct_size(in.struct_size, kOptionsBase, "options");
  kvo_cache_options options = defaults();
  std::memcpy(&options, &in, std::min<std::size_t>(in.struct_size, sizeof(options)));
  const auto* bytes = reinterpret_cast<const unsigned char*>(&in);
  for (std::size_t i = sizeof(options); i < in.struct_size; ++i) {
    if (bytes[i] != 0) {
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                       "options set a field of a newer kvoffload (byte " + std::to_string(i) +
                           " of " + std::to_string(in.struct_size) + ") that this library (" +
                           kvo::version() + ") does not know");
    }
  }
  return options;
}

kvo::CacheConfig to_config(const kvo_cache_options& options) {
  kvo::CacheConfig config;
  config.v_head_dim = options.v_head_dim;
  config.layers = options.layers;
  config.kv_heads = options.kv_heads;
  config.head_dim = options.head_dim;
  config.max_seq = options.max_seq;
  config.slots = options.slots;
  config.dtype = to_dtype(stored_int(options.dtype));
  config.resident_layers = options.resident_layers;
  config.ring_depth = options.ring_depth;
  config.device_budget = options.device_budget;
  config.backend = to_backend(stored_int(options.backend));
  config.device = options.device;
  config.host.max_delay_us = options.host_max_delay_us;
  config.host.delay_seed = options.host_delay_seed;
  if (options.layer_windows != nullptr && options.layers > 0) {
    // Read as `layers` entries; a count out of range is refused by validate() before any use.
    config.layer_windows.assign(options.layer_windows, options.layer_windows + options.layers);
  }
  config.max_append = options.max_append;
  config.split.mode = to_split(stored_int(options.split_mode));
  config.split.rows = options.split_rows;
  config.split.h2d_bytes_per_s = options.split_h2d_bytes_per_s;
  config.split.host_bytes_per_s = options.split_host_bytes_per_s;
  config.shard.kv_head_begin = options.kv_head_begin;
  config.shard.model_kv_heads = options.model_kv_heads;
  config.shard.ranks_per_node = options.ranks_per_node == 0 ? 1 : options.ranks_per_node;
  config.shard.node_available_bytes = options.node_available_bytes;
  return config;
}

// The plan's fields of a kvo_cache_stats.
void fill_plan(const kvo::CachePlan& plan, kvo_cache_stats* out) {
  out->resident_layers = plan.resident_layers;
  out->streamed_layers = plan.streamed_layers;
  out->ring_depth = plan.ring_depth;
  out->row_bytes = plan.row_bytes;
  out->layer_bytes = plan.layer_bytes;
  out->resident_bytes = plan.resident_bytes;
  out->staging_bytes = plan.staging_bytes;
  out->device_bytes = plan.device_bytes;
  out->host_bytes = plan.host_bytes;
  out->budget = plan.budget;
  out->v_row_bytes = plan.layout.v_row_bytes;
  out->window_layers = plan.window_layers;
  out->window_bytes = plan.window_bytes;
  out->split_h2d_bytes_per_s = plan.split_h2d_bytes_per_s;
  out->split_host_bytes_per_s = plan.split_host_bytes_per_s;
  out->kv_head_begin = plan.kv_head_begin;
  out->model_kv_heads = plan.model_kv_heads;
  out->ranks_per_node = plan.ranks_per_node;
  out->host_share_bytes = plan.host_share_bytes;
  out->layers = plan.layers;
  out->tensor_bytes = plan.tensor_bytes;
  out->reserved_bytes = plan.reserved_bytes;
}

}  // namespace

extern "C" {

const char* kvo_version(void) {
  return kvo::version();
}

const char* kvo_status_name(kvo_status status) {
  switch (status) {
    case KVO_OK:
      return "ok";
    case KVO_ERROR_INVALID_ARGUMENT:
      return kvo::error_code_name(kvo::ErrorCode::kInvalidArgument);
    case KVO_ERROR_PROTOCOL:
      return kvo::error_code_name(kvo::ErrorCode::kProtocol);
    case KVO_ERROR_OUT_OF_MEMORY:
      return kvo::error_code_name(kvo::ErrorCode::kOutOfMemory);
    case KVO_ERROR_DEVICE:
      return kvo::error_code_name(kvo::ErrorCode::kDevice);
    case KVO_ERROR_INTERNAL:
      return kvo::error_code_name(kvo::ErrorCode::kInternal);
  }
  return "unknown status";
}

kvo_status kvo_cuda_device_count(int32_t* out_count) {
  return on_thread("kvo_cuda_device_count", [&] {
    require(out_count, "out_count is NULL");
    *out_count = kvo::cuda_device_count();
  });
}

namespace {

// The shape of a row conversion, checked: a quantized dtype and positive sizes.
kvo::DType quantized_dtype(int dtype, std::int32_t kv_heads, std::int32_t dim, std::int64_t rows) {
  const kvo::DType d = to_dtype(dtype);
  if (!kvo::is_quantized(d)) {
    throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                     std::string("dtype ") + kvo::dtype_name(d) +
                         " is not quantized (KVO_DTYPE_FP8_E4M3 or KVO_DTYPE_INT8)");
  }
  if (kv_heads <= 0 || dim <= 0 || rows < 0) {
    throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                     "kv_heads and dim must be positive and rows not negative; got " +
                         std::to_string(kv_heads) + ", " + std::to_string(dim) + ", " +
                         std::to_string(rows));
  }
  return d;
}

}  // namespace

kvo_status kvo_row_bytes(kvo_dtype dtype, int32_t kv_heads, int32_t dim, uint64_t* out_bytes) {
  return on_thread("kvo_row_bytes", [&] {
    require(out_bytes, "out_bytes is NULL");
    if (kv_heads <= 0 || dim <= 0) {
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument, "kv_heads and dim must be positive; got " +
                                                             std::to_string(kv_heads) + ", " +
                                                             std::to_string(dim));
    }
    *out_bytes = kvo::kv_row_bytes(to_dtype(stored_int(dtype)), kv_heads, dim);
  });
}

kvo_status kvo_quantize_rows(kvo_dtype dtype, int32_t kv_heads, int32_t dim, const float* src,
                             int64_t rows, void* dst) {
  return on_thread("kvo_quantize_rows", [&] {
    const kvo::DType d = quantized_dtype(stored_int(dtype), kv_heads, dim, rows);
    if (rows == 0) return;
    require(src, "src is NULL");
    require(dst, "dst is NULL");
    const std::uint64_t row = kvo::quant_row_bytes(kv_heads, dim);
    const std::int64_t elements = static_cast<std::int64_t>(kv_heads) * dim;
    for (std::int64_t r = 0; r < rows; ++r) {
      kvo::quantize_row(src + r * elements, kv_heads, dim, d,
                        static_cast<std::uint8_t*>(dst) + static_cast<std::uint64_t>(r) * row);
    }
  });
}

kvo_status kvo_dequantize_rows(kvo_dtype dtype, int32_t kv_heads, int32_t dim, const void* src,
                               int64_t rows, float* dst) {
  return on_thread("kvo_dequantize_rows", [&] {
    const kvo::DType d = quantized_dtype(stored_int(dtype), kv_heads, dim, rows);
    if (rows == 0) return;
    require(src, "src is NULL");
    require(dst, "dst is NULL");
    const std::uint64_t row = kvo::quant_row_bytes(kv_heads, dim);
    const std::int64_t elements = static_cast<std::int64_t>(kv_heads) * dim;
    for (std::int64_t r = 0; r < rows; ++r) {
      kvo::dequantize_row(
          static_cast<const std::uint8_t*>(src) + static_cast<std::uint64_t>(r) * row, kv_heads,
          dim, d, dst + r * elements);
    }
  });
}

const char* kvo_last_error(const kvo_cache_t* cache) {
  return cache == nullptr ? thread_message.text : cache->message.text;
}

kvo_status kvo_cache_options_init(kvo_cache_options* options, uint32_t struct_size) {
  return on_thread("kvo_cache_options_init", [&] {
    require(options, "options is NULL");
    check_struct_size(struct_size, kOptionsBase, "options");
    // A larger struct is a newer header's, whose defaults this library cannot know.
    if (struct_size > sizeof(kvo_cache_options)) {
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                       "struct_size is " + std::to_string(struct_size) +
                           ", more than this library's kvo_cache_options (" +
                           std::to_string(sizeof(kvo_cache_options)) +
                           " bytes): the program was built against a newer kvoffload than this "
                           "library (" +
                           kvo::version() + "); nothing was written");
    }
    std::memset(options, 0, struct_size);
    options->struct_size = struct_size;
    write_out(defaults(), options);
  });
}

kvo_status kvo_cache_create(const kvo_cache_options* options, kvo_cache_t** out_cache) {
  return on_thread("kvo_cache_create", [&] {
    require(out_cache, "out_cache is NULL");
    *out_cache = nullptr;
    require(options, "options is NULL");
    *out_cache = new kvo_cache(to_config(read_options(*options)));
  });
}

void kvo_cache_destroy(kvo_cache_t* cache) {
  delete cache;
}

kvo_status kvo_cache_backend(const kvo_cache_t* cache, kvo_backend* out_backend) {
  return on_cache(cache, "kvo_cache_backend", [&](const kvo_cache& c) {
    require(out_backend, "out_backend is NULL");
    *out_backend = from_backend(c.cache.backend());
  });
}

kvo_status kvo_begin_step(kvo_cache_t* cache, const int32_t* new_tokens, int32_t count) {
  return on_cache(cache, "kvo_begin_step", [&](kvo_cache& c) {
    check_count(c, count, "new-token count");
    require(new_tokens, "new_tokens is NULL");
    c.new_tokens.assign(new_tokens, new_tokens + count);
    c.cache.begin_step(c.new_tokens);
  });
}

kvo_status kvo_begin_step_split(kvo_cache_t* cache, const int32_t* new_tokens,
                                const int32_t* split_rows, int32_t count) {
  return on_cache(cache, "kvo_begin_step_split", [&](kvo_cache& c) {
    check_count(c, count, "new-token count and one split row");
    require(new_tokens, "new_tokens is NULL");
    require(split_rows, "split_rows is NULL");
    c.new_tokens.assign(new_tokens, new_tokens + count);
    c.split_rows.assign(split_rows, split_rows + count);
    c.cache.begin_step(c.new_tokens, c.split_rows);
  });
}

kvo_status kvo_acquire(kvo_cache_t* cache, int32_t layer, kvo_layer_view* out_view, void* stream) {
  return on_cache(cache, "kvo_acquire", [&](kvo_cache& c) {
    require(out_view, "out_view is NULL");
    check_struct_size(out_view->struct_size, kViewBase, "out_view");
    const kvo::LayerView view = c.cache.acquire(layer, stream);
    kvo_layer_view full;
    std::memset(&full, 0, sizeof(full));
    full.layer = view.layer;
    full.resident = view.resident ? 1 : 0;
    full.k = view.k;
    full.v = view.v;
    full.slot_stride = view.slot_stride;
    full.token_stride = view.token_stride;
    full.head_stride = view.head_stride;
    full.slots = view.layout.slots;
    full.max_seq = view.layout.max_seq;
    full.kv_heads = view.layout.kv_heads;
    full.head_dim = view.layout.head_dim;
    full.dtype = from_dtype(view.layout.dtype);
    full.lengths = view.lengths;
    full.new_tokens = view.new_tokens;
    full.v_slot_stride = view.v_slot_stride;
    full.v_token_stride = view.v_token_stride;
    full.v_head_stride = view.v_head_stride;
    full.v_head_dim = view.layout.v_head_dim;
    full.k_scale_offset = view.layout.k_scale_offset;
    full.v_scale_offset = view.layout.v_scale_offset;
    full.window = view.window;
    full.first_positions = view.first_positions;
    full.split_rows = view.split_rows;
    full.host_k = view.host_k;
    full.host_v = view.host_v;
    write_out(full, out_view);
  });
}

kvo_status kvo_append(kvo_cache_t* cache, int32_t layer, int32_t slot, const void* k_rows,
                      const void* v_rows, int32_t count, void* stream) {
  return on_cache(cache, "kvo_append", [&](kvo_cache& c) {
    c.cache.append(layer, slot, k_rows, v_rows, count, stream);
  });
}

kvo_status kvo_release(kvo_cache_t* cache, int32_t layer, void* stream) {
  return on_cache(cache, "kvo_release", [&](kvo_cache& c) { c.cache.release(layer, stream); });
}

kvo_status kvo_end_step(kvo_cache_t* cache) {
  return on_cache(cache, "kvo_end_step", [&](kvo_cache& c) { c.cache.end_step(); });
}

kvo_status kvo_abort_step(kvo_cache_t* cache, void* stream) {
  return on_cache(cache, "kvo_abort_step", [&](kvo_cache& c) { c.cache.abort_step(stream); });
}

kvo_status kvo_reset_slot(kvo_cache_t* cache, int32_t slot) {
  return on_cache(cache, "kvo_reset_slot", [&](kvo_cache& c) { c.cache.reset_slot(slot); });
}

kvo_status kvo_truncate_slot(kvo_cache_t* cache, int32_t slot, int32_t length) {
  return on_cache(cache, "kvo_truncate_slot",
                  [&](kvo_cache& c) { c.cache.truncate_slot(slot, length); });
}

kvo_status kvo_reorder_slots(kvo_cache_t* cache, const int32_t* source, int32_t count) {
  return on_cache(cache, "kvo_reorder_slots", [&](kvo_cache& c) {
    require(source, "source is NULL");
    const int slots = c.cache.config().slots;
    if (count != slots) {  // checked before a single int is read
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument, "count is " + std::to_string(count) +
                                                             ", the cache has " +
                                                             std::to_string(slots) + " slots");
    }
    c.cache.reorder_slots(std::vector<int>(source, source + count));
  });
}

kvo_status kvo_length(const kvo_cache_t* cache, int32_t slot, int32_t* out_length) {
  return on_cache(cache, "kvo_length", [&](const kvo_cache& c) {
    require(out_length, "out_length is NULL");
    *out_length = c.cache.length(slot);
  });
}

kvo_status kvo_save_slot(kvo_cache_t* cache, int32_t slot, const char* path, const int32_t* tokens,
                         int32_t token_count, const char* model) {
  return on_cache(cache, "kvo_save_slot", [&](kvo_cache& c) {
    require(path, "path is NULL");
    if (token_count < 0) throw CallError{KVO_ERROR_INVALID_ARGUMENT, "token_count is negative"};
    if (token_count > 0) require(tokens, "tokens is NULL");
    kvo::SlotContext context;
    if (token_count > 0) context.tokens.assign(tokens, tokens + token_count);
    if (model != nullptr) context.model = model;
    c.cache.save_slot(slot, path, context);
  });
}

kvo_status kvo_load_slot(kvo_cache_t* cache, int32_t slot, const char* path, const char* model,
                         int32_t* tokens, int32_t tokens_capacity, int32_t* out_token_count) {
  return on_cache(cache, "kvo_load_slot", [&](kvo_cache& c) {
    require(path, "path is NULL");
    require(out_token_count, "out_token_count is NULL");
    if (tokens_capacity < 0) {
      throw CallError{KVO_ERROR_INVALID_ARGUMENT, "tokens_capacity is negative"};
    }
    if (tokens_capacity > 0) require(tokens, "tokens is NULL");
    const kvo::SlotContext context = c.cache.load_slot(slot, path, model != nullptr ? model : "");
    const std::size_t n =
        std::min(context.tokens.size(), static_cast<std::size_t>(tokens_capacity));
    std::copy(context.tokens.begin(), context.tokens.begin() + static_cast<std::ptrdiff_t>(n),
              tokens);
    *out_token_count = static_cast<int32_t>(context.tokens.size());
  });
}

kvo_status kvo_save_slots(kvo_cache_t* cache, const int32_t* slots, int32_t count, const char* path,
                          const int32_t* tokens, const int32_t* token_counts, const char* model) {
  return on_cache(cache, "kvo_save_slots", [&](kvo_cache& c) {
    require(path, "path is NULL");
    require(slots, "slots is NULL");
    check_slot_count(c, count);
    std::vector<kvo::SlotContext> contexts(static_cast<std::size_t>(count));
    const int32_t* next = tokens;
    for (int32_t i = 0; i < count; ++i) {
      kvo::SlotContext& context = contexts[static_cast<std::size_t>(i)];
      if (model != nullptr) context.model = model;
      const int32_t n = token_counts != nullptr ? token_counts[i] : 0;
      if (n < 0) throw CallError{KVO_ERROR_INVALID_ARGUMENT, "a token count is negative"};
      if (n == 0) continue;
      require(tokens, "tokens is NULL and a token count is not 0");
      context.tokens.assign(next, next + n);
      next += n;
    }
    c.cache.save_slots(std::vector<int>(slots, slots + count), path, contexts);
  });
}

kvo_status kvo_load_slots(kvo_cache_t* cache, const int32_t* slots, int32_t count, const char* path,
                          const char* model, int32_t* tokens, int64_t tokens_capacity,
                          int32_t* out_token_counts) {
  return on_cache(cache, "kvo_load_slots", [&](kvo_cache& c) {
    require(path, "path is NULL");
    require(slots, "slots is NULL");
    require(out_token_counts, "out_token_counts is NULL");
    check_slot_count(c, count);
    if (tokens_capacity < 0) {
      throw CallError{KVO_ERROR_INVALID_ARGUMENT, "tokens_capacity is negative"};
    }
    kvo::SavedContextFile file(path);
    std::int64_t saved = 0;
    for (const kvo::SlotContext& context : file.info().contexts) {
      saved += static_cast<std::int64_t>(context.tokens.size());
    }
    if (saved > tokens_capacity) {
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                       std::string(path) + " holds " + std::to_string(saved) +
                           " token ids, more than tokens_capacity (" +
                           std::to_string(tokens_capacity) + "); nothing was loaded");
    }
    if (saved > 0) require(tokens, "tokens is NULL");
    const std::vector<kvo::SlotContext> contexts =
        c.cache.load_slots(std::vector<int>(slots, slots + count), file, model ? model : "");
    for (std::size_t i = 0; i < contexts.size(); ++i) {
      const std::vector<std::int32_t>& ids = contexts[i].tokens;
      tokens = std::copy(ids.begin(), ids.end(), tokens);
      out_token_counts[i] = static_cast<int32_t>(ids.size());
    }
  });
}

kvo_status kvo_plan(const kvo_cache_options* options, kvo_cache_stats* out_plan) {
  return on_thread("kvo_plan", [&] {
    require(options, "options is NULL");
    require(out_plan, "out_plan is NULL");
    check_struct_size(out_plan->struct_size, kStatsBase, "out_plan");
    const kvo::CacheConfig config = to_config(read_options(*options));
    kvo_cache_stats full;
    std::memset(&full, 0, sizeof(full));
    fill_plan(kvo::plan_cache(config, config.device_budget), &full);
    write_out(full, out_plan);
  });
}

kvo_status kvo_stats(const kvo_cache_t* cache, kvo_cache_stats* out_stats) {
  return on_cache(cache, "kvo_stats", [&](const kvo_cache& c) {
    require(out_stats, "out_stats is NULL");
    check_struct_size(out_stats->struct_size, kStatsBase, "out_stats");
    const kvo::CacheStats stats = c.cache.stats();
    kvo_cache_stats full;
    std::memset(&full, 0, sizeof(full));
    kvo_cache_stats* out = &full;
    out->steps = stats.steps;
    out->h2d_bytes_total = stats.h2d_bytes_total;
    out->d2h_bytes_total = stats.d2h_bytes_total;
    out->h2d_bytes_last_step = stats.h2d_bytes_last_step;
    out->d2h_bytes_last_step = stats.d2h_bytes_last_step;
    out->acquire_wait_s = stats.acquire_wait_s;
    out->prefetch_reissues = stats.prefetch_reissues;
    out->reorder_bytes = stats.reorder_bytes;
    out->device_allocations = stats.device_allocations;
    fill_plan(stats.plan, out);
    write_out(full, out_stats);
  });
}

kvo_status kvo_stream_create(kvo_cache_t* cache, void** out_stream) {
  return on_cache(cache, "kvo_stream_create", [&](kvo_cache& c) {
    require(out_stream, "out_stream is NULL");
    *out_stream = c.cache.create_stream();
  });
}

kvo_status kvo_stream_destroy(kvo_cache_t* cache, void* stream) {
  return on_cache(cache, "kvo_stream_destroy",
                  [&](kvo_cache& c) { c.cache.destroy_stream(stream); });
}

kvo_status kvo_stream_synchronize(kvo_cache_t* cache, void* stream) {
  return on_cache(cache, "kvo_stream_synchronize",
                  [&](kvo_cache& c) { c.cache.synchronize_stream(stream); });
}

kvo_status kvo_copy_to_host(kvo_cache_t* cache, void* host_dst, const void* device_src,
                            size_t bytes) {
  return on_cache(cache, "kvo_copy_to_host", [&](kvo_cache& c) {
    if (bytes == 0) return;
    require(host_dst, "host_dst is NULL");
    require(device_src, "device_src is NULL");
    c.cache.copy_to_host(host_dst, device_src, bytes);
  });
}

kvo_status kvo_copy_to_device(kvo_cache_t* cache, void* device_dst, const void* host_src,
                              size_t bytes) {
  return on_cache(cache, "kvo_copy_to_device", [&](kvo_cache& c) {
    if (bytes == 0) return;
    require(device_dst, "device_dst is NULL");
    require(host_src, "host_src is NULL");
    c.cache.copy_to_device(device_dst, host_src, bytes);
  });
}

}  // extern "C"
