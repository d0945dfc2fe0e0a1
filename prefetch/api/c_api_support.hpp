// What every entry point of the C ABI (prefetch/api/c_api*.cpp) shares: the message buffers, the
// cache's handle, and guarded(), which turns whatever a call throws into its kvo_status and a
// message. Messages live in fixed buffers, so reporting an error never allocates and never throws.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.h"
#include "kvoffload/kvoffload.hpp"

namespace kvo::c_api {

constexpr std::size_t kMessageBytes = 1024;

struct Message {
  char text[kMessageBytes] = {0};
  void set(const char* call, const char* what) noexcept {
    std::snprintf(text, sizeof(text), "%s: %s", call, what);
  }
};

// Where a failed call without a cache leaves its message.
inline thread_local Message thread_message;

}  // namespace kvo::c_api

struct kvo_cache {
  explicit kvo_cache(const kvo::CacheConfig& config) : cache(config) {}
  kvo::OffloadedStaticCache cache;
  std::vector<std::int32_t> new_tokens;  // [slots], reused by every begin_step
  std::vector<std::int32_t> split_rows;  // [slots], reused by every kvo_begin_step_split
  mutable kvo::c_api::Message message;
};

namespace kvo::c_api {

inline kvo_status to_status(kvo::ErrorCode code) {
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

// As guarded(), for calls without a cache: the message goes to this thread's buffer.
template <typename Body>
kvo_status on_thread(const char* call, Body&& body) noexcept {
  return guarded(thread_message, call, body);
}

inline void require(const void* pointer, const char* what) {
  if (pointer == nullptr) throw CallError{KVO_ERROR_INVALID_ARGUMENT, what};
}

// A text result as the header says: cut to `capacity` bytes with its NUL, its whole length in
// *out_length.
inline void write_text(const std::string& text, char* buffer, std::size_t capacity,
                       std::size_t* out_length) {
  require(out_length, "out_length is NULL");
  if (capacity > 0) {
    require(buffer, "buffer is NULL and capacity is not 0");
    const std::size_t n = std::min(text.size(), capacity - 1);
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  *out_length = text.size();
}

}  // namespace kvo::c_api
