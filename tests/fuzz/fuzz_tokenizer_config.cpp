// libFuzzer target: tokenizer_config.json and the chat format built from it. Either the file is
// refused with kvo::Error, or its settings are what it says (a token is a string or an object's
// "content"); the chat format is then either refused with kvo::Error or ChatML, whose pieces
// hold the template's special tokens and the system message given.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>

#include "kvoffload/error.hpp"
#include "model/text/chat_format.hpp"
#include "model/text/tokenizer_settings.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kvo::model::TokenizerSettings s;
  try {
    s = kvo::model::parse_tokenizer_settings(text, "fuzz/tokenizer_config.json");
  } catch (const kvo::Error&) {
    return 0;
  }
  for (const std::optional<std::string>& system :
       {std::optional<std::string>(), std::optional<std::string>("be brief")}) {
    try {
      const kvo::model::ChatFormat chat = kvo::model::chat_format(s, system);
      if (chat.family != "ChatML") std::abort();
      if (chat.before.find("<|im_start|>user\n") == std::string::npos) std::abort();
      if (chat.after != "<|im_end|>\n<|im_start|>assistant\n") std::abort();
      if (system && chat.before.find(*system) == std::string::npos) std::abort();
    } catch (const kvo::Error&) {
    }
  }
  return 0;
}
