#include "model/checkpoint/model_config.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kvoffload/error.hpp"
#include "kvoffload/quant.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "model/families/family.hpp"
#include "model/text/tokenizer_bpe.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

void parse_rope(const JsonField& f, ModelConfig& c) {
  c.rope_theta = static_cast<float>(f.real_or("rope_theta", 10000.0));
  // Older configs: rope_theta + rope_scaling; newer ones: rope_parameters holding both.
  std::optional<JsonField> scaling = f.find("rope_parameters");
  if (!scaling) scaling = f.find("rope_scaling");
  if (!scaling) return;
  const JsonField& s = *scaling;
  s.require_object();
  c.rope_theta = static_cast<float>(s.real_or("rope_theta", c.rope_theta));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) type = s.text_or(key, type);
  if (type == "default") return;
  if (type != "llama3") {
    throw s.error("rope scaling type \"" + printable(type) +
                  "\" is not supported (supported: default, llama3)");
  }
  c.rope_scaling.factor = static_cast<float>(s.real_or("factor", 0));
  c.rope_scaling.low_freq_factor = static_cast<float>(s.real_or("low_freq_factor", 1));
  c.rope_scaling.high_freq_factor = static_cast<float>(s.real_or("high_freq_factor", 4));
  c.rope_scaling.original_max_position =
      static_cast<float>(s.real_or("original_max_position_embeddings", 8192));
  if (!(c.rope_scaling.factor > 0) ||
      !(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor) ||
      !(c.rope_scaling.low_freq_factor > 0) || !(c.rope_scaling.original_max_position > 0) ||
      !std::isfinite(c.rope_scaling.factor) || !std::isfinite(c.rope_scaling.high_freq_factor) ||
      !std::isfinite(c.rope_scaling.original_max_position)) {
    throw s.error(
        "llama3 rope scaling needs finite factor > 0, high_freq_factor > low_freq_factor > 0 "
        "and original_max_position_embeddings > 0");
  }
}

// The shortest decimal that reads back as `value`, so that 1e-5f is written "1e-05" and not
// "9.99999975e-06".
double shortest(float value) {
  char text[32];
  for (int digits = 1; digits <= 9; ++digits) {
    std::snprintf(text, sizeof text, "%.*g", digits, static_cast<double>(value));
    if (std::strtof(text, nullptr) == value) break;
  }
  return std::strtod(text, nullptr);
}

}  // namespace

std::string model_file_bounds() {
  const auto size = [](std::uint64_t bytes) {
    return bytes >= (std::uint64_t{1} << 40) ? std::to_string(bytes >> 40) + " TiB"
                                             : std::to_string(bytes >> 20) + " MiB";
  };
  return "config.json " + size(kMaxConfigBytes) + ", generation_config.json " +
         size(kMaxGenerationConfigBytes) + ", chat_template.jinja " + size(kMaxChatTemplateBytes) +
         ", tokenizer_config.json " + size(kMaxTokenizerConfigBytes) +
         ", model.safetensors.index.json " + size(kMaxSafetensorsIndexBytes) +
         ", tokenizer.model " + size(kMaxTokenizerModelBytes) + ", tokenizer.json " +
         size(kMaxTokenizerJsonBytes) + ", each .safetensors file " +
         size(kMaxSafetensorsFileBytes);
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  Json document;
  const JsonField f = parse_json_object(json_text, source, document);
  using L = ModelLimits;
  ModelConfig c;
  // The family (model/families/) serves the architecture, or the model_type without one.
  const Family* family = nullptr;
  if (const std::optional<JsonField> archs = f.find("architectures")) {
    const std::vector<JsonField> names = archs->elements();
    if (names.empty()) throw archs->error("must be a list of names, got []");
    family = &family_of_architecture(names[0].text(), source);
    c.architecture = names[0].text();
  } else {
    family = &family_of_model_type(f.text_or("model_type", ""), source);
    c.architecture = family->architectures.front();
  }
  c.model_type = family->model_type;
  const std::string act = f.text_or("hidden_act", "silu");
  if (act != "silu") {
    throw f.at("hidden_act").error("\"" + printable(act) + "\" is not supported (supported: silu)");
  }
  if (f.boolean_or("mlp_bias", false)) throw f.at("mlp_bias").error("true is not supported");
  const auto required = [&](const char* key, int min, int max) {
    return static_cast<int>(f.at(key).integer(min, max));
  };
  const auto optional = [&](const char* key, int min, int max, int fallback) {
    return static_cast<int>(f.integer_or(key, fallback, min, max));
  };
  c.vocab_size = required("vocab_size", 1, L::kVocab);
  c.hidden_size = required("hidden_size", 1, L::kHidden);
  c.intermediate_size = required("intermediate_size", 1, L::kIntermediate);
  c.layers = required("num_hidden_layers", 1, L::kLayers);
  c.heads = required("num_attention_heads", 1, L::kHeads);
  c.kv_heads = optional("num_key_value_heads", 1, L::kHeads, c.heads);
  c.head_dim = optional("head_dim", 2, L::kHeadDim, c.hidden_size / c.heads);
  c.rms_norm_eps = static_cast<float>(f.real_or("rms_norm_eps", 1e-6));
  c.max_position_embeddings = optional("max_position_embeddings", 1, L::kPositions, 4096);
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);
  parse_rope(f, c);
  family->read_config(f, c);
  std::string dtype = f.text_or("torch_dtype", f.text_or("dtype", "bfloat16"));
  try {
    c.dtype = parse_dtype(dtype);
    if (is_quantized(c.dtype)) throw invalid("quantized");
  } catch (const Error&) {
    throw invalid(source + ": dtype \"" + printable(dtype) +
                  "\" is not supported (float32, float16, bfloat16)");
  }
  try {
    validate(c);
  } catch (const Error& e) {
    throw invalid(source + ": " + e.what());
  }
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  return parse_model_config(read_regular_file(path, kMaxConfigBytes), path);
}

void validate(const ModelConfig& c) {
  using L = ModelLimits;
  const struct {
    const char* name;
    int value, min, max;
  } dims[] = {{"vocab_size", c.vocab_size, 1, L::kVocab},
              {"hidden_size", c.hidden_size, 1, L::kHidden},
              {"intermediate_size", c.intermediate_size, 1, L::kIntermediate},
              {"num_hidden_layers", c.layers, 1, L::kLayers},
              {"num_attention_heads", c.heads, 1, L::kHeads},
              {"num_key_value_heads", c.kv_heads, 1, L::kHeads},
              {"head_dim", c.head_dim, 2, L::kHeadDim},
              {"max_position_embeddings", c.max_position_embeddings, 1, L::kPositions},
              {"sliding_window", c.sliding_window, 0, L::kPositions}};
  for (const auto& d : dims) {
    if (d.value < d.min || d.value > d.max) {
      throw invalid(std::string(d.name) + " must be from " + std::to_string(d.min) + " to " +
                    std::to_string(d.max) + ", got " + std::to_string(d.value));
    }
  }
  if (c.heads % c.kv_heads != 0) {
    throw invalid("num_attention_heads (" + std::to_string(c.heads) +
                  ") is not a multiple of num_key_value_heads (" + std::to_string(c.kv_heads) +
                  ")");
  }
  if (c.head_dim % 2 != 0)
    throw invalid("head_dim must be even, got " + std::to_string(c.head_dim));
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0) || !std::isfinite(c.rms_norm_eps) ||
      !std::isfinite(c.rope_theta)) {
    throw invalid("rms_norm_eps and rope_theta must be positive and finite");
  }
  if (is_quantized(c.dtype)) {
    throw invalid(std::string("the weights' dtype must be f32, f16 or bf16, not ") +
                  dtype_name(c.dtype));
  }
}

ModelConfig preset(const std::string& name) {
  ModelConfig c;
  if (name == "tiny") {
    // A few layers of a Llama-3-like shape: fast enough for tests and the default demo.
    c.vocab_size = 4096;
    c.hidden_size = 256;
    c.intermediate_size = 688;
    c.layers = 4;
    c.heads = 4;
    c.kv_heads = 2;
    c.head_dim = 64;  // a head size FlashInfer's kernels serve, so the demo uses them on a GPU
    c.rope_theta = 500000.0f;
    c.rope_scaling = RopeScaling{8.0f, 1.0f, 4.0f, 8192.0f};
    c.max_position_embeddings = 131072;
    c.tie_word_embeddings = true;
    c.dtype = DType::kF32;
  } else if (name == "llama3-8b") {
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.layers = 32;
    c.heads = 32;
    c.kv_heads = 8;
    c.head_dim = 128;
    c.rope_theta = 500000.0f;
    c.rope_scaling = RopeScaling{8.0f, 1.0f, 4.0f, 8192.0f};
    c.max_position_embeddings = 131072;
  } else if (name == "mistral-7b") {
    c.architecture = "MistralForCausalLM";
    c.model_type = "mistral";
    c.vocab_size = 32768;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.layers = 32;
    c.heads = 32;
    c.kv_heads = 8;
    c.head_dim = 128;
    c.rope_theta = 1000000.0f;
    c.max_position_embeddings = 32768;
  } else if (name == "qwen2.5-7b") {
    c.architecture = "Qwen2ForCausalLM";
    c.model_type = "qwen2";
    c.vocab_size = 152064;
    c.hidden_size = 3584;
    c.intermediate_size = 18944;
    c.layers = 28;
    c.heads = 28;
    c.kv_heads = 4;
    c.head_dim = 128;
    c.rms_norm_eps = 1e-6f;
    c.rope_theta = 1000000.0f;
    c.max_position_embeddings = 32768;
    c.qkv_bias = true;
  } else {
    std::string known;
    for (const auto& n : preset_names()) known += (known.empty() ? "" : ", ") + n;
    throw invalid("unknown preset \"" + name + "\" (known: " + known + ")");
  }
  return c;
}

std::vector<std::string> preset_names() {
  return {"tiny", "llama3-8b", "mistral-7b", "qwen2.5-7b"};
}

std::string to_config_json(const ModelConfig& c) {
  nlohmann::ordered_json o;
  o["architectures"] = {c.architecture};
  o["model_type"] = c.model_type;
  o["vocab_size"] = c.vocab_size;
  o["hidden_size"] = c.hidden_size;
  o["intermediate_size"] = c.intermediate_size;
  o["num_hidden_layers"] = c.layers;
  o["num_attention_heads"] = c.heads;
  o["num_key_value_heads"] = c.kv_heads;
  o["head_dim"] = c.head_dim;
  o["hidden_act"] = "silu";
  o["rms_norm_eps"] = shortest(c.rms_norm_eps);
  o["rope_theta"] = shortest(c.rope_theta);
  o["max_position_embeddings"] = c.max_position_embeddings;
  o["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.rope_scaling.factor > 0) {
    o["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", shortest(c.rope_scaling.factor)},
                         {"low_freq_factor", shortest(c.rope_scaling.low_freq_factor)},
                         {"high_freq_factor", shortest(c.rope_scaling.high_freq_factor)},
                         {"original_max_position_embeddings",
                          static_cast<std::int64_t>(c.rope_scaling.original_max_position)}};
  }
  family_of_architecture(c.architecture, "to_config_json").write_config(c, o);
  o["torch_dtype"] = c.dtype == DType::kF32   ? "float32"
                     : c.dtype == DType::kF16 ? "float16"
                                              : "bfloat16";
  return o.dump(2) + "\n";
}

std::int64_t parameter_count(const ModelConfig& c) {
  const std::int64_t h = c.hidden_size;
  std::int64_t per_layer = 2 * h + h * c.q_dim() + 2 * h * c.kv_dim() + c.q_dim() * h +
                           3 * h * static_cast<std::int64_t>(c.intermediate_size);
  if (c.qkv_bias) per_layer += c.q_dim() + 2 * c.kv_dim();
  if (c.o_bias) per_layer += h;
  const std::int64_t embed = static_cast<std::int64_t>(c.vocab_size) * h;
  return per_layer * c.layers + embed * (c.tie_word_embeddings ? 1 : 2) + h;
}

}  // namespace kvo::model
