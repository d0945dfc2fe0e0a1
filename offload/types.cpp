// The small vocabulary of the public API: dtypes, backends, byte sizes, error names.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <string>

#include "kvoffload/error.hpp"
#include "kvoffload/kvoffload.hpp"
#include "kvoffload/types.hpp"

namespace kvo {

const char* version() {
  return KVO_VERSION_STRING;  // the project version, from CMake
}

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid argument";
    case ErrorCode::kProtocol:
      return "protocol misuse";
    case ErrorCode::kOutOfMemory:
      return "out of memory";
    case ErrorCode::kDevice:
      return "device error";
    case ErrorCode::kInternal:
      return "internal error";
  }
  return "unknown error";
}

std::size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "?";
}

DType parse_dtype(const std::string& name) {
  if (name == "f32" || name == "float32" || name == "fp32") return DType::kF32;
  if (name == "f16" || name == "float16" || name == "fp16") return DType::kF16;
  if (name == "bf16" || name == "bfloat16") return DType::kBF16;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown dtype '" + name + "' (expected f32, f16 or bf16)");
}

const char* backend_name(BackendKind kind) {
  switch (kind) {
    case BackendKind::kAuto:
      return "auto";
    case BackendKind::kCuda:
      return "cuda";
    case BackendKind::kHost:
      return "host";
  }
  return "?";
}

BackendKind parse_backend(const std::string& name) {
  if (name == "auto") return BackendKind::kAuto;
  if (name == "cuda") return BackendKind::kCuda;
  if (name == "host") return BackendKind::kHost;
  throw Error(ErrorCode::kInvalidArgument,
              "unknown backend '" + name + "' (expected auto, cuda or host)");
}

std::uint64_t parse_size(const std::string& text) {
  const auto fail = [&](const char* why) {
    return Error(ErrorCode::kInvalidArgument, "cannot read the size '" + text + "': " + why +
                                                  " (examples: 24GiB, 512MiB, 1.5GB, 4096)");
  };
  std::size_t pos = 0;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.')) {
    ++pos;
  }
  if (pos == 0) {
    throw fail(!text.empty() && text[0] == '-' ? "sizes cannot be negative" : "no number");
  }
  const std::string number = text.substr(0, pos);
  if (number.find('.') != number.rfind('.')) throw fail("more than one decimal point");
  std::string unit = text.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double scale = 0;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "KiB" || unit == "K" || unit == "k") {
    scale = 1024.0;
  } else if (unit == "MiB" || unit == "M") {
    scale = 1024.0 * 1024;
  } else if (unit == "GiB" || unit == "G") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "TiB" || unit == "T") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else if (unit == "KB" || unit == "kB") {
    scale = 1e3;
  } else if (unit == "MB") {
    scale = 1e6;
  } else if (unit == "GB") {
    scale = 1e9;
  } else if (unit == "TB") {
    scale = 1e12;
  } else {
    throw fail("unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  }
  const double value = std::stod(number) * scale;
  if (!(value < 1.8e19)) throw fail("too large");
  return static_cast<std::uint64_t>(std::llround(value));
}

std::string format_bytes(std::uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  char buffer[64];
  if (unit == 0) {
    std::snprintf(buffer, sizeof(buffer), "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%.2f %s (%llu bytes)", value, kUnits[unit],
                  static_cast<unsigned long long>(bytes));
  }
  return buffer;
}

}  // namespace kvo
