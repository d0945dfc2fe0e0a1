// libFuzzer target: kvo-generate's token files. Either the text is refused with a UsageError
// whose message is printable ASCII (a binary file is never echoed), or every prompt it gives is
// non-empty and holds ids in [0, 2^31).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tools/cli/cli.hpp"
#include "tools/cli/token_file.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    for (const auto& prompt : kvo::cli::parse_token_ids(text, "fuzz.txt")) {
      if (prompt.empty()) std::abort();
      for (const std::int32_t id : prompt) {
        if (id < 0) std::abort();
      }
    }
  } catch (const kvo::cli::UsageError& e) {
    for (const char* c = e.what(); *c != '\0'; ++c) {
      if (*c < 0x20 || *c > 0x7e) std::abort();
    }
  }
  return 0;
}
