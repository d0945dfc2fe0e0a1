// libFuzzer target: config.json. Either it is refused with kvo::Error, or the config it gives
// passes validate(), is within ModelLimits, what to_config_json writes for it reads back as the
// same shape and rope, and its rope tables are positive and finite.
#include <cmath>
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
      back.qkv_bias != c.qkv_bias || back.sliding_window != c.sliding_window ||
      kvo::model::describe(back.rope_scaling) != kvo::model::describe(c.rope_scaling)) {
    std::abort();
  }
  // Every rope table a forward can use is positive and finite (validate checked three lengths).
  for (const std::int64_t len : {std::int64_t{2}, std::int64_t{c.max_position_embeddings},
                                 std::int64_t{c.max_position_embeddings} * 4}) {
    const kvo::model::RopeTable t = kvo::model::rope_table(c, len);
    if (!(t.scale > 0) || !std::isfinite(t.scale)) std::abort();
    for (const float f : t.inv_freq) {
      if (!(f > 0) || !std::isfinite(f)) std::abort();
    }
  }
  if (kvo::model::parameter_count(c) <= 0) std::abort();
  return 0;
}
