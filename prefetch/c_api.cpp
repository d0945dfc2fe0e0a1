// The C ABI (include/kvoffload/kvoffload.h) over kvo::OffloadedStaticCache. Each entry point is
// one guarded call: kvo::Error maps to its kvo_status, std::bad_alloc to out-of-memory, anything
// else to internal; the message goes to the cache (or, without one, to a thread-local buffer).
// Messages live in fixed buffers, so reporting an error never allocates and never throws.
#include "kvoffload/kvoffload.h"

#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"

namespace {

constexpr std::size_t kMessageBytes = 1024;

struct Message {
  char text[kMessageBytes] = {0};
  void set(const char* call, const char* what) noexcept {
    std::snprintf(text, sizeof(text), "%s: %s", call, what);
  }
};

// Where a failed call without a cache leaves its message.
thread_local Message thread_message;

}  // namespace

struct kvo_cache {
  explicit kvo_cache(const kvo::CacheConfig& config) : cache(config) {}
  kvo::OffloadedStaticCache cache;
  std::vector<std::int32_t> new_tokens;  // [slots], reused by every begin_step
  mutable Message message;
};

namespace {

kvo_status to_status(kvo::ErrorCode code) {
  switch (code) {
    case kvo::ErrorCode::kInvalidArgument:
      return KVO_ERROR_INVALID_ARGUMENT;
    case kvo::ErrorCode::kProtocol:
      return KVO_ERROR_PROTOCOL;
    case kvo::ErrorCode::kOutOfMemory:
      return KVO_ERROR_OUT_OF_MEMORY;
    case kvo::ErrorCode::kDevice:
      return KVO_ERROR_DEVICE;
    case kvo::ErrorCode::kInternal:
      return KVO_ERROR_INTERNAL;
  }
  return KVO_ERROR_INTERNAL;
}

// A failure the C layer itself detects (a NULL pointer, an enum out of range).
struct CallError {
  kvo_status status;
  const char* what;
};

// Runs `body` and turns whatever it throws into a status and a message in `sink`.
template <typename Body>
kvo_status guarded(Message& sink, const char* call, Body&& body) noexcept {
  try {
    body();
    return KVO_OK;
  } catch (const CallError& e) {
    sink.set(call, e.what);
    return e.status;
  } catch (const kvo::Error& e) {
    sink.set(call, e.what());
    return to_status(e.code());
  } catch (const std::bad_alloc&) {
    sink.set(call, "out of host memory");
    return KVO_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    sink.set(call, e.what());
    return KVO_ERROR_INTERNAL;
  } catch (...) {
    sink.set(call, "unknown exception");
    return KVO_ERROR_INTERNAL;
  }
}

// As guarded(), for calls on a cache: a NULL cache is an invalid argument reported per thread.
template <typename Cache, typename Body>
kvo_status on_cache(Cache* cache, const char* call, Body&& body) noexcept {
  if (cache == nullptr) {
    thread_message.set(call, "the cache is NULL");
    return KVO_ERROR_INVALID_ARGUMENT;
  }
  return guarded(cache->message, call, [&] { body(*cache); });
}

void require(const void* pointer, const char* what) {
  if (pointer == nullptr) throw CallError{KVO_ERROR_INVALID_ARGUMENT, what};
}

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
  switch (dtype) {
    case KVO_DTYPE_F32:
      return kvo::DType::kF32;
    case KVO_DTYPE_F16:
      return kvo::DType::kF16;
    case KVO_DTYPE_BF16:
      return kvo::DType::kBF16;
  }
  throw CallError{KVO_ERROR_INVALID_ARGUMENT,
                  "options->dtype is not a kvo_dtype (KVO_DTYPE_F32, _F16 or _BF16)"};
}

kvo_dtype from_dtype(kvo::DType dtype) {
  switch (dtype) {
    case kvo::DType::kF32:
      return KVO_DTYPE_F32;
    case kvo::DType::kF16:
      return KVO_DTYPE_F16;
    case kvo::DType::kBF16:
      return KVO_DTYPE_BF16;
  }
  return KVO_DTYPE_BF16;
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

kvo::CacheConfig to_config(const kvo_cache_options& options) {
  kvo::CacheConfig config;
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
  return config;
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
  return guarded(thread_message, "kvo_cuda_device_count", [&] {
    require(out_count, "out_count is NULL");
    *out_count = kvo::cuda_device_count();
  });
}

const char* kvo_last_error(const kvo_cache_t* cache) {
  return cache == nullptr ? thread_message.text : cache->message.text;
}

kvo_cache_options kvo_cache_options_default(void) {
  const kvo::CacheConfig defaults;
  kvo_cache_options options;
  std::memset(&options, 0, sizeof(options));
  options.layers = defaults.layers;
  options.kv_heads = defaults.kv_heads;
  options.head_dim = defaults.head_dim;
  options.max_seq = defaults.max_seq;
  options.slots = defaults.slots;
  options.dtype = from_dtype(defaults.dtype);
  options.resident_layers = defaults.resident_layers;
  options.ring_depth = defaults.ring_depth;
  options.device_budget = defaults.device_budget;
  options.backend = from_backend(defaults.backend);
  options.device = defaults.device;
  options.host_max_delay_us = defaults.host.max_delay_us;
  options.host_delay_seed = defaults.host.delay_seed;
  return options;
}

kvo_status kvo_cache_create(const kvo_cache_options* options, kvo_cache_t** out_cache) {
  return guarded(thread_message, "kvo_cache_create", [&] {
    require(out_cache, "out_cache is NULL");
    *out_cache = nullptr;
    require(options, "options is NULL");
    *out_cache = new kvo_cache(to_config(*options));
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
    if (count < 0) throw CallError{KVO_ERROR_INVALID_ARGUMENT, "count is negative"};
    if (count > 0) require(new_tokens, "new_tokens is NULL");
    c.new_tokens.assign(new_tokens, new_tokens + count);
    c.cache.begin_step(c.new_tokens);
  });
}

kvo_status kvo_acquire(kvo_cache_t* cache, int32_t layer, kvo_layer_view* out_view, void* stream) {
  return on_cache(cache, "kvo_acquire", [&](kvo_cache& c) {
    require(out_view, "out_view is NULL");
    const kvo::LayerView view = c.cache.acquire(layer, stream);
    out_view->layer = view.layer;
    out_view->resident = view.resident ? 1 : 0;
    out_view->k = view.k;
    out_view->v = view.v;
    out_view->slot_stride = view.slot_stride;
    out_view->token_stride = view.token_stride;
    out_view->head_stride = view.head_stride;
    out_view->slots = view.slots;
    out_view->max_seq = view.max_seq;
    out_view->kv_heads = view.kv_heads;
    out_view->head_dim = view.head_dim;
    out_view->dtype = from_dtype(view.dtype);
    out_view->lengths = view.lengths;
    out_view->new_tokens = view.new_tokens;
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

kvo_status kvo_length(const kvo_cache_t* cache, int32_t slot, int32_t* out_length) {
  return on_cache(cache, "kvo_length", [&](const kvo_cache& c) {
    require(out_length, "out_length is NULL");
    *out_length = c.cache.length(slot);
  });
}

kvo_status kvo_stats(const kvo_cache_t* cache, kvo_cache_stats* out_stats) {
  return on_cache(cache, "kvo_stats", [&](const kvo_cache& c) {
    require(out_stats, "out_stats is NULL");
    const kvo::CacheStats stats = c.cache.stats();
    std::memset(out_stats, 0, sizeof(*out_stats));
    out_stats->steps = stats.steps;
    out_stats->h2d_bytes_total = stats.h2d_bytes_total;
    out_stats->d2h_bytes_total = stats.d2h_bytes_total;
    out_stats->h2d_bytes_last_step = stats.h2d_bytes_last_step;
    out_stats->d2h_bytes_last_step = stats.d2h_bytes_last_step;
    out_stats->acquire_wait_s = stats.acquire_wait_s;
    out_stats->prefetch_reissues = stats.prefetch_reissues;
    out_stats->device_allocations = stats.device_allocations;
    out_stats->resident_layers = stats.plan.resident_layers;
    out_stats->streamed_layers = stats.plan.streamed_layers;
    out_stats->ring_depth = stats.plan.ring_depth;
    out_stats->row_bytes = stats.plan.row_bytes;
    out_stats->layer_bytes = stats.plan.layer_bytes;
    out_stats->resident_bytes = stats.plan.resident_bytes;
    out_stats->staging_bytes = stats.plan.staging_bytes;
    out_stats->device_bytes = stats.plan.device_bytes;
    out_stats->host_bytes = stats.plan.host_bytes;
    out_stats->budget = stats.plan.budget;
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
