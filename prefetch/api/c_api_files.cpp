// The C ABI's calls that need no cache (include/kvoffload/kvoffload.h, since 0.4): byte sizes and
// memory, a saved-context file's headers, and the fingerprint a saved context is checked by, with
// the digests it is made of. Each is one guarded call over the C++ API; failures are reported
// through kvo_last_error(NULL).
#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/fingerprint.hpp"
#include "kvoffload/kvoffload.h"
#include "kvoffload/kvoffload.hpp"
#include "kvoffload/plan.hpp"
#include "offload/util/element_types.hpp"
#include "prefetch/api/c_api_support.hpp"

struct kvo_bytes_digest {
  kvo::WeightsDigest::TensorBytes digest;
};
struct kvo_weights_digest {
  kvo::WeightsDigest digest;
};

namespace {

using namespace kvo::c_api;

constexpr std::size_t kInfoBase = sizeof(kvo_saved_context_info);  // its first version: 0.4

}  // namespace

extern "C" {

kvo_status kvo_parse_size(const char* text, uint64_t* out_bytes) {
  return on_thread("kvo_parse_size", [&] {
    require(text, "text is NULL");
    require(out_bytes, "out_bytes is NULL");
    *out_bytes = kvo::parse_size(text);
  });
}

kvo_status kvo_format_bytes(uint64_t bytes, char* buffer, size_t capacity, size_t* out_length) {
  return on_thread("kvo_format_bytes",
                   [&] { write_text(kvo::format_bytes(bytes), buffer, capacity, out_length); });
}

kvo_status kvo_host_available_bytes(uint64_t* out_bytes) {
  return on_thread("kvo_host_available_bytes", [&] {
    require(out_bytes, "out_bytes is NULL");
    *out_bytes = kvo::host_available_bytes();
  });
}

kvo_status kvo_default_device_budget(uint64_t free_bytes, uint64_t total_bytes,
                                     uint64_t* out_budget) {
  return on_thread("kvo_default_device_budget", [&] {
    require(out_budget, "out_budget is NULL");
    *out_budget = kvo::default_device_budget(free_bytes, total_bytes);
  });
}

kvo_status kvo_inspect_saved_context(const char* path, kvo_saved_context_info* out_info,
                                     int32_t* lengths, int32_t lengths_capacity) {
  return on_thread("kvo_inspect_saved_context", [&] {
    require(path, "path is NULL");
    require(out_info, "out_info is NULL");
    if (out_info->struct_size < kInfoBase) {
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument,
                       "out_info->struct_size is " + std::to_string(out_info->struct_size) +
                           "; set it to sizeof(kvo_saved_context_info)");
    }
    if (lengths_capacity < 0) {
      throw CallError{KVO_ERROR_INVALID_ARGUMENT, "lengths_capacity is negative"};
    }
    if (lengths_capacity > 0) require(lengths, "lengths is NULL");
    const kvo::SavedContextInfo info = kvo::inspect_saved_context(path);
    out_info->layers = info.layers;
    out_info->kv_heads = info.kv_heads;
    out_info->head_dim = info.head_dim;
    out_info->v_head_dim = info.v_head_dim > 0 ? info.v_head_dim : info.head_dim;
    out_info->max_seq = info.max_seq;
    out_info->dtype = static_cast<kvo_dtype>(kvo::traits(info.dtype).c_dtype);
    out_info->records = static_cast<int32_t>(info.lengths.size());
    for (std::size_t i = 0;
         i < info.lengths.size() && i < static_cast<std::size_t>(lengths_capacity); ++i) {
      lengths[i] = info.lengths[i];
    }
  });
}

kvo_status kvo_saved_context_model(const char* path, int32_t record, char* buffer, size_t capacity,
                                   size_t* out_length) {
  return on_thread("kvo_saved_context_model", [&] {
    require(path, "path is NULL");
    const kvo::SavedContextInfo info = kvo::inspect_saved_context(path);
    if (record < 0 || static_cast<std::size_t>(record) >= info.contexts.size()) {
      throw kvo::Error(kvo::ErrorCode::kInvalidArgument, "record " + std::to_string(record) +
                                                             " of " + path + ", which holds " +
                                                             std::to_string(info.contexts.size()));
    }
    write_text(info.contexts[static_cast<std::size_t>(record)].model, buffer, capacity, out_length);
  });
}

kvo_status kvo_fingerprint_number(double value, char* buffer, size_t capacity, size_t* out_length) {
  return on_thread("kvo_fingerprint_number", [&] {
    write_text(kvo::fingerprint_number(value), buffer, capacity, out_length);
  });
}

kvo_status kvo_fingerprint_text(const char* const* keys, const char* const* values, int32_t count,
                                char* buffer, size_t capacity, size_t* out_length) {
  return on_thread("kvo_fingerprint_text", [&] {
    if (count < 0) throw CallError{KVO_ERROR_INVALID_ARGUMENT, "count is negative"};
    if (count > 0) {
      require(keys, "keys is NULL");
      require(values, "values is NULL");
    }
    kvo::Fingerprint fingerprint;
    for (int32_t i = 0; i < count; ++i) {
      require(keys[i], "a key is NULL");
      require(values[i], "a value is NULL");
      fingerprint.set(keys[i], values[i]);
    }
    write_text(fingerprint.text(), buffer, capacity, out_length);
  });
}

kvo_status kvo_digest_bytes(const void* data, uint64_t bytes, char* buffer, size_t capacity,
                            size_t* out_length) {
  return on_thread("kvo_digest_bytes", [&] {
    if (bytes > 0) require(data, "data is NULL");
    write_text(kvo::WeightsDigest::bytes_digest(data, bytes), buffer, capacity, out_length);
  });
}

kvo_status kvo_bytes_digest_create(kvo_bytes_digest_t** out_digest) {
  return on_thread("kvo_bytes_digest_create", [&] {
    require(out_digest, "out_digest is NULL");
    *out_digest = nullptr;
    *out_digest = new kvo_bytes_digest();
  });
}

kvo_status kvo_bytes_digest_update(kvo_bytes_digest_t* digest, const void* data, uint64_t bytes) {
  return on_thread("kvo_bytes_digest_update", [&] {
    require(digest, "digest is NULL");
    if (bytes > 0) require(data, "data is NULL");
    digest->digest.update(data, bytes);
  });
}

kvo_status kvo_bytes_digest_hex(const kvo_bytes_digest_t* digest, char* buffer, size_t capacity,
                                size_t* out_length) {
  return on_thread("kvo_bytes_digest_hex", [&] {
    require(digest, "digest is NULL");
    write_text(digest->digest.digest(), buffer, capacity, out_length);
  });
}

void kvo_bytes_digest_destroy(kvo_bytes_digest_t* digest) {
  delete digest;
}

kvo_status kvo_weights_digest_create(kvo_weights_digest_t** out_digest) {
  return on_thread("kvo_weights_digest_create", [&] {
    require(out_digest, "out_digest is NULL");
    *out_digest = nullptr;
    *out_digest = new kvo_weights_digest();
  });
}

kvo_status kvo_weights_digest_add(kvo_weights_digest_t* digest, const char* name, const char* dtype,
                                  const int64_t* shape, int32_t ndim, const char* bytes_digest) {
  return on_thread("kvo_weights_digest_add", [&] {
    require(digest, "digest is NULL");
    require(name, "name is NULL");
    require(dtype, "dtype is NULL");
    require(bytes_digest, "bytes_digest is NULL");
    if (ndim < 0) throw CallError{KVO_ERROR_INVALID_ARGUMENT, "ndim is negative"};
    if (ndim > 0) require(shape, "shape is NULL");
    digest->digest.add_digest(name, dtype, std::vector<std::int64_t>(shape, shape + ndim),
                              bytes_digest);
  });
}

kvo_status kvo_weights_digest_hex(const kvo_weights_digest_t* digest, char* buffer, size_t capacity,
                                  size_t* out_length) {
  return on_thread("kvo_weights_digest_hex", [&] {
    require(digest, "digest is NULL");
    write_text(digest->digest.hex(), buffer, capacity, out_length);
  });
}

void kvo_weights_digest_destroy(kvo_weights_digest_t* digest) {
  delete digest;
}

kvo_status kvo_tokenizer_digest(const char* dir, char* buffer, size_t capacity,
                                size_t* out_length) {
  return on_thread("kvo_tokenizer_digest", [&] {
    require(dir, "dir is NULL");
    const std::vector<std::string> names(std::begin(kvo::kTokenizerFiles),
                                         std::end(kvo::kTokenizerFiles));
    write_text(kvo::files_digest(dir, names), buffer, capacity, out_length);
  });
}

}  // extern "C"
