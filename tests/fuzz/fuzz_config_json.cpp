// libFuzzer target: config.json. Either it is refused with kvo::Error, or the config it gives
// passes validate(), is within ModelLimits, and what to_config_json writes for it reads back as
// the same shape.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvoffload/error.hpp"
#include "model/checkpoint/model_config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kvo::model::ModelConfig c;
  try {
    c = kvo::model::parse_model_config(text, "fuzz/config.json");
  } catch (const kvo::Error&) {
    return 0;
  }
  kvo::model::validate(c);  // throws (and so crashes the target) if parsing let anything through
  const kvo::model::ModelConfig back =
      kvo::model::parse_model_config(kvo::model::to_config_json(c), "round trip");
  if (back.architecture != c.architecture || back.vocab_size != c.vocab_size ||
      back.hidden_size != c.hidden_size || back.intermediate_size != c.intermediate_size ||
      back.layers != c.layers || back.heads != c.heads || back.kv_heads != c.kv_heads ||
      back.head_dim != c.head_dim || back.dtype != c.dtype || back.rope_theta != c.rope_theta ||
      back.rms_norm_eps != c.rms_norm_eps || back.tie_word_embeddings != c.tie_word_embeddings ||
      back.qkv_bias != c.qkv_bias || back.sliding_window != c.sliding_window) {
    std::abort();
  }
  if (kvo::model::parameter_count(c) <= 0) std::abort();
  return 0;
}
