// libFuzzer target: generation_config.json's end-of-sequence ids. Either refused with kvo::Error,
// or every id is one a model can have (0 to ModelLimits::kVocab - 1).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvoffload/error.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/text/tokenizer_settings.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    for (const std::int32_t id : kvo::model::parse_generation_eos(text, "fuzz/generation.json")) {
      if (id < 0 || id >= kvo::model::ModelLimits::kVocab) std::abort();
    }
  } catch (const kvo::Error&) {
  }
  return 0;
}
