// The small vocabulary of the public API: dtypes, backends, byte sizes, error names. The floor
// of everything: the store, the backends and the model all name dtypes and sizes.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "kvoffload/quant.hpp"
#include "kvoffload/types.hpp"
#include "offload/util/element_types.hpp"
#include "offload/util/printable.hpp"

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

namespace {

// Every dtype once with the other names it is read by; its name and size are the element
// types' table's (offload/util/element_types.hpp). The quantized ones (kvoffload/quant.hpp) are
// one-byte elements whose rows also hold scales.
struct DTypeAliases {
  DType dtype;
  const char* aliases[2];
};
constexpr DTypeAliases kDTypes[] = {{DType::kF32, {"float32", "fp32"}},
                                    {DType::kF16, {"float16", "fp16"}},
                                    {DType::kBF16, {"bfloat16", nullptr}},
                                    {DType::kFP8E4M3, {"fp8_e4m3", "e4m3"}},
                                    {DType::kInt8, {nullptr, nullptr}}};

bool known(DType dtype) {
  return static_cast<unsigned>(dtype) <= static_cast<unsigned>(DType::kInt8);
}

}  // namespace

std::size_t dtype_size(DType dtype) {
  return known(dtype) ? element_bytes(dtype) : 0;
}

const char* dtype_name(DType dtype) {
  return known(dtype) ? traits(dtype).name : "?";
}

std::vector<std::string> dtype_names(bool quantized) {
  std::vector<std::string> names;
  for (const DTypeAliases& e : kDTypes) {
    if (quantized || !is_quantized(e.dtype)) names.emplace_back(traits(e.dtype).name);
  }
  return names;
}

DType parse_dtype(const std::string& name) {
  std::string expected;
  for (const DTypeAliases& e : kDTypes) {
    const char* own = traits(e.dtype).name;
    if (name == own) return e.dtype;
    for (const char* alias : e.aliases) {
      if (alias != nullptr && name == alias) return e.dtype;
    }
    expected += (expected.empty() ? "" : ", ") + std::string(own);
  }
  throw Error(ErrorCode::kInvalidArgument,
              "unknown dtype '" + printable(name) + "' (expected " + expected + ")");
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
    return Error(ErrorCode::kInvalidArgument, "cannot read the size '" + printable(text) + "': " +
                                                  why + " (examples: 24GiB, 512MiB, 1.5GB, 4096)");
  };
  // [digits][.digits] [spaces] [unit], read exactly: the whole part as an integer (a plain
  // number of bytes is never rounded through a double), the fraction scaled by the unit.
  std::size_t pos = 0;
  std::uint64_t whole = 0;
  bool digits = false;
  for (; pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])); ++pos) {
    digits = true;
    if (__builtin_mul_overflow(whole, 10u, &whole) ||
        __builtin_add_overflow(whole, static_cast<std::uint64_t>(text[pos] - '0'), &whole)) {
      throw fail("too large");
    }
  }
  std::string fraction;
  if (pos < text.size() && text[pos] == '.') {
    for (++pos; pos < text.size() && std::isdigit(static_cast<unsigned char>(text[pos])); ++pos) {
      fraction += text[pos];
    }
    digits = digits || !fraction.empty();
  }
  if (!digits) {
    throw fail(!text.empty() && text[0] == '-' ? "sizes cannot be negative" : "no number");
  }
  if (pos < text.size() && text[pos] == '.') throw fail("more than one decimal point");
  std::string unit = text.substr(pos);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  std::uint64_t scale = 0;
  if (unit.empty() || unit == "B") {
    scale = 1;
  } else if (unit == "KiB" || unit == "K" || unit == "k") {
    scale = 1ull << 10;
  } else if (unit == "MiB" || unit == "M") {
    scale = 1ull << 20;
  } else if (unit == "GiB" || unit == "G") {
    scale = 1ull << 30;
  } else if (unit == "TiB" || unit == "T") {
    scale = 1ull << 40;
  } else if (unit == "KB" || unit == "kB") {
    scale = 1000;
  } else if (unit == "MB") {
    scale = 1000 * 1000;
  } else if (unit == "GB") {
    scale = 1000ull * 1000 * 1000;
  } else if (unit == "TB") {
    scale = 1000ull * 1000 * 1000 * 1000;
  } else {
    throw fail("unknown unit (use B, KiB, MiB, GiB, TiB, KB, MB, GB or TB)");
  }
  std::uint64_t bytes = 0;
  if (__builtin_mul_overflow(whole, scale, &bytes)) throw fail("too large");
  if (fraction.find_first_not_of('0') != std::string::npos) {
    if (scale == 1) throw fail("a number of bytes has no fraction");
    // At most 1 TiB of fraction: a long double holds it to the byte.
    const long double part = std::strtold(("0." + fraction).c_str(), nullptr) * scale;
    if (__builtin_add_overflow(bytes, static_cast<std::uint64_t>(std::llroundl(part)), &bytes)) {
      throw fail("too large");
    }
  }
  return bytes;
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
