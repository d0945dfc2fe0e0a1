// libFuzzer target: a whole GGUF file through the config mapping
// (model/checkpoint/gguf_config.hpp). Either it is refused with kvo::Error, or the config it gives
// passes validate(), its reals are finite, what to_config_json writes for it reads back as the same
// config (every field of its fingerprint), and its fingerprint is written.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvoffload/error.hpp"
#include "kvoffload/fingerprint.hpp"
#include "model/checkpoint/fingerprint.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/gguf_config.hpp"
#include "model/checkpoint/model_config.hpp"

namespace {

std::string config_text(const kvo::model::ModelConfig& c) {
  kvo::Fingerprint f;
  kvo::model::add_config(c, f);  // throws (and so crashes the target) on a non-finite real
  return f.text();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  kvo::model::ModelConfig c;
  try {
    const kvo::model::GgufFile file(reinterpret_cast<const std::byte*>(data), size, "fuzz.gguf");
    c = kvo::model::gguf_model_config(file);
  } catch (const kvo::Error&) {
    return 0;
  }
  kvo::model::validate(c);
  for (const double r :
       {c.rms_norm_eps, c.rope_theta, c.attn_softcap, c.final_softcap, c.rope_local_theta,
        c.rope_scaling.factor, c.rope_scaling.attention_factor}) {
    if (!std::isfinite(r)) std::abort();
  }
  const kvo::model::ModelConfig back =
      kvo::model::parse_model_config(kvo::model::to_config_json(c), "round trip");
  if (config_text(back) != config_text(c) || back.dtype != c.dtype) std::abort();
  return 0;
}
