// kvo::Error: the one exception type the C++ API throws.
#pragma once

#include <stdexcept>
#include <string>
#include "kvoffload/api.h"

namespace kvo {

// What went wrong, coarsely, so that a caller (and the C ABI) can react without parsing text.
enum class ErrorCode {
  kInvalidArgument,  // a bad shape, dtype, size, slot, layer or position
  kProtocol,         // a call out of the per-step order (append without acquire, ...)
  kOutOfMemory,      // a plan that does not fit its budget, or an allocation that failed
  kDevice,           // a CUDA runtime call failed
  kInternal,         // a broken invariant inside the library
};

KVO_API const char* error_code_name(ErrorCode code);

class KVO_API Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const noexcept { return code_; }

 private:
  ErrorCode code_;
};

}  // namespace kvo
