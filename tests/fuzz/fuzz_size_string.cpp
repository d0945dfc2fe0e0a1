// libFuzzer target: the size and count strings of the command lines (--vram-budget 24GiB,
// --contexts 128k, --temperature 0.7, --slots 8). Each reader either refuses the text (with
// kvo::Error or false) or returns what the text says: a plain integer of bytes is exact, a size
// or a count never wraps, a real is finite.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvoffload/error.hpp"
#include "kvoffload/types.hpp"
#include "tools/cli/cli.hpp"

namespace {

bool digits_only(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const std::uint64_t bytes = kvo::parse_size(text);
    if (digits_only(text) && text.size() < 20 &&
        bytes != std::strtoull(text.c_str(), nullptr, 10)) {
      std::abort();
    }
  } catch (const kvo::Error&) {
  }
  std::int64_t count = 0;
  if (kvo::cli::read_token_count(text, count) && count < 0) std::abort();
  if (kvo::cli::read_integer(text, count) && count != std::strtoll(text.c_str(), nullptr, 10)) {
    std::abort();
  }
  double real = 0;
  if (kvo::cli::read_real(text, real) && !std::isfinite(real)) std::abort();
  try {
    const std::int64_t tokens = kvo::cli::parse_token_count(text, 1, std::int64_t{1} << 30, "x");
    if (tokens < 1 || tokens > (std::int64_t{1} << 30)) std::abort();
  } catch (const kvo::cli::UsageError&) {
  }
  return 0;
}
