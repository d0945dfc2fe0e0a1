#include "model/checkpoint/model_config.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "kvoffload/error.hpp"
#include "kvoffload/quant.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "model/common/numerics.hpp"
#include "model/families/family.hpp"
#include "model/text/tokenizer_bpe.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

// A positive, finite real of the scaling block.
double positive(const JsonField& s, const char* key, double fallback) {
  const double value = s.real_or(key, fallback);
  if (value > 0) return value;
  if (!s.find(key)) throw s.error(std::string("needs a positive \"") + key + "\"");
  throw s.at(key).error("must be positive");
}

// longrope's short_factor or long_factor: head_dim / 2 positive reals.
std::vector<double> rope_factors(const JsonField& s, const char* key, int head_dim) {
  const JsonField list = s.at(key);
  list.require_array();
  std::vector<double> factors;
  for (const JsonField& e : list.elements()) {
    factors.push_back(e.real());
    if (!(factors.back() > 0)) throw e.error("must be positive");
  }
  if (static_cast<int>(factors.size()) != head_dim / 2) {
    throw list.error("has " + std::to_string(factors.size()) + " factors; head_dim " +
                     std::to_string(head_dim) + " needs " + std::to_string(head_dim / 2));
  }
  return factors;
}

// rope_theta and the scaling block (rope_scaling in older configs, rope_parameters in newer ones
// holding rope_theta too; where both are there, transformers takes rope_scaling), read with
// transformers' defaults: the pretraining length from a top-level
// original_max_position_embeddings first (Phi-3 keeps it there, and its class defaults it to
// 4096), else the block's, else max_position_embeddings; yarn's and longrope's factor and
// attention factor derived where the block gives none. A partial rotation (partial_rotary_factor
// below 1, in the block or at the top level) is refused. Needs max_position_embeddings and
// head_dim read.
void parse_rope(const JsonField& f, ModelConfig& c, const Family& family) {
  c.rope_theta = f.real_or("rope_theta", 10000.0);
  std::optional<JsonField> scaling = f.find("rope_scaling");
  if (!scaling) scaling = f.find("rope_parameters");
  for (const JsonField& where : {f, scaling ? *scaling : f}) {
    if (where.real_or("partial_rotary_factor", 1.0) != 1.0) {
      throw where.at("partial_rotary_factor")
          .error("only 1 (every dimension rotated) is supported");
    }
  }
  if (scaling) read_rope_scaling(f, *scaling, c, family);
}

}  // namespace

void read_rope_scaling(const JsonField& f, const JsonField& s, ModelConfig& c,
                       const Family& family) {
  s.require_object();
  c.rope_theta = s.real_or("rope_theta", c.rope_theta);
  std::string type = "default";
  for (const char* key : {"type", "rope_type"}) type = s.text_or(key, type);
  for (const auto& [name, meaning] : family.rope_aliases) {
    if (type == name) type = meaning;
  }
  RopeScaling& r = c.rope_scaling;
  r = RopeScaling{};
  if (type == "default") return;
  const double max_pos = c.max_position_embeddings;
  const auto top = f.find("original_max_position_embeddings");
  r.original_max_position = top ? static_cast<double>(top->integer(1, ModelLimits::kPositions))
                            : family.original_max_position > 0
                                ? family.original_max_position
                                : static_cast<double>(s.integer_or(
                                      "original_max_position_embeddings", c.max_position_embeddings,
                                      1, ModelLimits::kPositions));
  if (type == "linear" || type == "dynamic") {
    r.type = type == "linear" ? RopeType::kLinear : RopeType::kDynamic;
    r.factor = positive(s, "factor", 0);
    if (r.type == RopeType::kDynamic && !(r.factor >= 1)) {
      throw s.at("factor").error("must be at least 1 for dynamic rope scaling");
    }
  } else if (type == "llama3") {
    r.type = RopeType::kLlama3;
    r.factor = positive(s, "factor", 0);
    r.low_freq_factor = positive(s, "low_freq_factor", 1);
    r.high_freq_factor = positive(s, "high_freq_factor", 4);
    if (!(r.high_freq_factor > r.low_freq_factor)) {
      throw s.error("llama3 rope scaling needs high_freq_factor > low_freq_factor");
    }
  } else if (type == "yarn") {
    r.type = RopeType::kYarn;
    r.factor = positive(s, "factor", max_pos / r.original_max_position);
    // Zero or absent: the defaults, as transformers reads them.
    r.beta_fast = s.real_or("beta_fast", 0) != 0 ? positive(s, "beta_fast", 32) : 32;
    r.beta_slow = s.real_or("beta_slow", 0) != 0 ? positive(s, "beta_slow", 1) : 1;
    r.truncate = s.boolean_or("truncate", true);
    const auto mscale = [](double scale, double m) {
      return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
    };
    const double m = s.real_or("mscale", 0);
    const double m_all = s.real_or("mscale_all_dim", 0);
    r.attention_factor = s.find("attention_factor") && !s.at("attention_factor").is_null()
                             ? positive(s, "attention_factor", 1)
                         : (m != 0 && m_all != 0) ? mscale(r.factor, m) / mscale(r.factor, m_all)
                                                  : mscale(r.factor, 1);
  } else if (type == "longrope") {
    r.type = RopeType::kLongRope;
    r.short_factor = rope_factors(s, "short_factor", c.head_dim);
    r.long_factor = rope_factors(s, "long_factor", c.head_dim);
    r.factor = positive(s, "factor", max_pos / r.original_max_position);
    r.attention_factor =
        s.find("attention_factor") && !s.at("attention_factor").is_null()
            ? positive(s, "attention_factor", 1)
        : r.factor <= 1 ? 1.0
                        : std::sqrt(1 + std::log(r.factor) / std::log(r.original_max_position));
  } else {
    throw s.error("rope scaling type \"" + printable(type) +
                  "\" is not supported (supported: " + rope_type_names() + ")");
  }
}

namespace {}  // namespace

Activation parse_activation(const JsonField& f, const char* key) {
  const std::string act = f.text_or(key, "silu");
  if (act == "silu") return Activation::kSilu;
  if (act == "gelu_pytorch_tanh") return Activation::kGeluTanh;
  throw f.at(key).error("\"" + printable(act) +
                        "\" is not supported (supported: silu, gelu_pytorch_tanh)");
}

const char* activation_name(Activation act) {
  return act == Activation::kGeluTanh ? "gelu_pytorch_tanh" : "silu";
}

float embedding_scale(const ModelConfig& config, DType weights) {
  const Family& family = family_of_architecture(config.architecture, "the model");
  return family.embedding_scale != nullptr ? family.embedding_scale(config, weights) : 1.0f;
}

double ModelConfig::attention_scale() const {
  const Family& family = family_of_architecture(architecture, "the model");
  if (family.attention_scale != nullptr) return family.attention_scale(*this);
  return 1.0 / std::sqrt(static_cast<double>(head_dim));
}

float ModelConfig::norm_offset() const {
  return family_of_architecture(architecture, "the model").norm_offset;
}

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
  c.hidden_act = parse_activation(f, "hidden_act");
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
  c.rms_norm_eps = f.real_or("rms_norm_eps", 1e-6);
  c.max_position_embeddings = optional("max_position_embeddings", 1, L::kPositions, 4096);
  c.tie_word_embeddings = f.boolean_or("tie_word_embeddings", false);
  parse_rope(f, c, *family);
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
  if (!c.sliding_layers.empty() && static_cast<int>(c.sliding_layers.size()) != c.layers) {
    throw invalid("layer_types has " + std::to_string(c.sliding_layers.size()) + " entries for " +
                  std::to_string(c.layers) + " layers");
  }
  if (!c.sliding_layers.empty() && c.sliding_window == 0) {
    for (const std::uint8_t sliding : c.sliding_layers) {
      if (sliding != 0) throw invalid("layer_types names sliding layers without a sliding_window");
    }
  }
  const struct {
    const char* name;
    double value;
  } reals[] = {{"attn_logit_softcapping", c.attn_softcap},
               {"final_logit_softcapping", c.final_softcap},
               {"query_pre_attn_scalar", c.query_pre_attn_scalar},
               {"rope_local_base_freq", c.rope_local_theta}};
  for (const auto& r : reals) {
    if (!(r.value >= 0) || !std::isfinite(r.value)) {
      throw invalid(std::string(r.name) + " must be positive and finite, got " +
                    std::to_string(r.value));
    }
  }
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0) || !std::isfinite(c.rms_norm_eps) ||
      !std::isfinite(c.rope_theta)) {
    throw invalid("rms_norm_eps and rope_theta must be positive and finite");
  }
  const RopeScaling& r = c.rope_scaling;
  if (r.type != RopeType::kDefault && !(r.factor > 0 && std::isfinite(r.factor))) {
    throw invalid(std::string(rope_type_name(r.type)) + " rope scaling needs a factor > 0");
  }
  if (r.type == RopeType::kLongRope && (static_cast<int>(r.short_factor.size()) != c.head_dim / 2 ||
                                        static_cast<int>(r.long_factor.size()) != c.head_dim / 2)) {
    throw invalid("longrope needs head_dim / 2 (" + std::to_string(c.head_dim / 2) +
                  ") short and long factors");
  }
  // Whatever the parameters, the tables a forward can use must be positive and finite (a base
  // of 1 under yarn, say, divides by log(1)): short, past the pretraining length, and far past.
  for (const std::int64_t len :
       {std::int64_t{1}, static_cast<std::int64_t>(c.max_position_embeddings) + 1,
        std::int64_t{1} << 31}) {
    const RopeTable t = rope_table(c, len);
    bool finite = std::isfinite(t.scale) && t.scale > 0;
    for (const float f : t.inv_freq) finite = finite && std::isfinite(f) && f > 0;
    if (!finite) {
      throw invalid(std::string("the ") + rope_type_name(r.type) + " rope with rope_theta " +
                    std::to_string(c.rope_theta) +
                    " gives frequencies that are not positive and finite (" + describe(r) + ")");
    }
  }
  if (is_quantized(c.dtype)) {
    throw invalid(std::string("the weights' dtype must be f32, f16 or bf16, not ") +
                  dtype_name(c.dtype));
  }
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
  o["hidden_act"] = activation_name(c.hidden_act);
  o["rms_norm_eps"] = c.rms_norm_eps;
  o["max_position_embeddings"] = c.max_position_embeddings;
  o["tie_word_embeddings"] = c.tie_word_embeddings;
  // The rotation as transformers 5 states it: rope_parameters, its base inside.
  nlohmann::ordered_json& j = o["rope_parameters"];
  const RopeScaling& r = c.rope_scaling;
  j["rope_type"] = rope_type_name(r.type);
  j["rope_theta"] = c.rope_theta;
  if (r.type != RopeType::kDefault) {
    j["factor"] = r.factor;
    if (r.type != RopeType::kLinear && r.type != RopeType::kDynamic) {
      j["original_max_position_embeddings"] = static_cast<std::int64_t>(r.original_max_position);
    }
    if (r.type == RopeType::kLlama3) {
      j["low_freq_factor"] = r.low_freq_factor;
      j["high_freq_factor"] = r.high_freq_factor;
    }
    if (r.type == RopeType::kYarn) {
      j["beta_fast"] = r.beta_fast;
      j["beta_slow"] = r.beta_slow;
      j["truncate"] = r.truncate;
    }
    if (r.type == RopeType::kYarn || r.type == RopeType::kLongRope) {
      j["attention_factor"] = r.attention_factor;
    }
    if (r.type == RopeType::kLongRope) {
      j["short_factor"] = r.short_factor;
      j["long_factor"] = r.long_factor;
    }
  }
  family_of_architecture(c.architecture, "to_config_json").write_config(c, o);
  o["torch_dtype"] = c.dtype == DType::kF32   ? "float32"
                     : c.dtype == DType::kF16 ? "float16"
                                              : "bfloat16";
  return o.dump(2) + "\n";
}

RopeTable rope_table(const ModelConfig& c, std::int64_t seq_len) {
  return rope_table(c.rope_scaling, static_cast<float>(c.rope_theta), c.head_dim,
                    c.max_position_embeddings, seq_len);
}

RopeSchedule rope_schedule(const ModelConfig& c) {
  return RopeSchedule(c.rope_scaling, static_cast<float>(c.rope_theta), c.head_dim,
                      c.max_position_embeddings);
}

std::int64_t parameter_count(const ModelConfig& c) {
  // A layer's tensors as its family lays them out (norms, biases and Qwen3's and Gemma 3's q/k
  // head norms included), the embeddings, the head unless tied, the final norm.
  std::int64_t per_layer = 0;
  for (const LayerTensor& t :
       family_of_architecture(c.architecture, "parameter_count").layer_tensors(c)) {
    std::int64_t n = 1;
    for (const std::int64_t d : t.shape) n *= d;
    per_layer += n;
  }
  const std::int64_t h = c.hidden_size;
  const std::int64_t embed = static_cast<std::int64_t>(c.vocab_size) * h;
  return per_layer * c.layers + embed * (c.tie_word_embeddings ? 1 : 2) + h;
}

}  // namespace kvo::model
