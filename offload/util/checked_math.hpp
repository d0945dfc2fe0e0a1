// Byte arithmetic that refuses to wrap: a shape whose size overflows 64 bits is a user error.
#pragma once

#include <cstdint>
#include <string>

#include "kvoffload/error.hpp"

namespace kvo::offload {

inline constexpr std::uint64_t kDeviceAlignment = 256;  // every device region starts aligned

inline std::uint64_t checked_mul(std::uint64_t a, std::uint64_t b, const char* what) {
  std::uint64_t result = 0;
  if (__builtin_mul_overflow(a, b, &result)) {
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + " overflow 64 bits");
  }
  return result;
}

inline std::uint64_t checked_add(std::uint64_t a, std::uint64_t b, const char* what) {
  std::uint64_t result = 0;
  if (__builtin_add_overflow(a, b, &result)) {
    throw Error(ErrorCode::kInvalidArgument, std::string(what) + " overflow 64 bits");
  }
  return result;
}

inline std::uint64_t align_up(std::uint64_t bytes, std::uint64_t alignment) {
  return checked_mul((bytes + alignment - 1) / alignment, alignment, "aligned size");
}

}  // namespace kvo::offload
