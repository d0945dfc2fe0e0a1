#include "model/model_config.hpp"

#include <cmath>
#include <fstream>
#include <sstream>

#include "kvoffload/error.hpp"
#include "model/json.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

const char* const kArchitectures[] = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM"};

class Fields {
 public:
  Fields(const Json& root, const std::string& source) : root_(root), source_(source) {}

  const Json* get(const char* key) const {
    const Json* v = root_.find(key);
    return v != nullptr && !v->is_null() ? v : nullptr;
  }
  int integer(const char* key, int min, int fallback, bool required) const {
    const Json* v = get(key);
    if (v == nullptr) {
      if (required) throw invalid(source_ + ": missing field \"" + key + "\"");
      return fallback;
    }
    if (!v->is_number() || v->number() != std::floor(v->number()) || v->number() < min ||
        v->number() > 2147483647.0) {
      throw invalid(source_ + ": field \"" + key +
                    "\" must be an integer >= " + std::to_string(min));
    }
    return static_cast<int>(v->number());
  }
  double real(const Json& obj, const char* key, double fallback) const {
    const Json* v = obj.find(key);
    if (v == nullptr || v->is_null()) return fallback;
    if (!v->is_number() || !std::isfinite(v->number())) {
      throw invalid(source_ + ": field \"" + key + "\" must be a number");
    }
    return v->number();
  }
  double real(const char* key, double fallback) const { return real(root_, key, fallback); }
  bool boolean(const char* key, bool fallback) const {
    const Json* v = get(key);
    if (v == nullptr) return fallback;
    if (v->kind() != Json::Kind::kBool) {
      throw invalid(source_ + ": field \"" + key + "\" must be true or false");
    }
    return v->boolean();
  }
  std::string text(const char* key, const std::string& fallback) const {
    const Json* v = get(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) throw invalid(source_ + ": field \"" + key + "\" must be a string");
    return v->string();
  }

 private:
  const Json& root_;
  const std::string& source_;
};

void parse_rope(const Fields& f, const std::string& source, ModelConfig& c) {
  c.rope_theta = static_cast<float>(f.real("rope_theta", 10000.0));
  // Older configs: rope_theta + rope_scaling; newer ones: rope_parameters holding both.
  const Json* scaling = f.get("rope_parameters");
  if (scaling == nullptr) scaling = f.get("rope_scaling");
  if (scaling == nullptr) return;
  if (!scaling->is_object()) throw invalid(source + ": rope scaling must be an object");
  c.rope_theta = static_cast<float>(f.real(*scaling, "rope_theta", c.rope_theta));
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    const Json* t = scaling->find(key);
    if (t != nullptr && t->is_string()) type = t->string();
  }
  if (type == "default") return;
  if (type != "llama3") {
    throw invalid(source + ": rope scaling type \"" + type +
                  "\" is not supported (supported: default, llama3)");
  }
  c.rope_scaling.factor = static_cast<float>(f.real(*scaling, "factor", 0));
  c.rope_scaling.low_freq_factor = static_cast<float>(f.real(*scaling, "low_freq_factor", 1));
  c.rope_scaling.high_freq_factor = static_cast<float>(f.real(*scaling, "high_freq_factor", 4));
  c.rope_scaling.original_max_position =
      static_cast<float>(f.real(*scaling, "original_max_position_embeddings", 8192));
  if (!(c.rope_scaling.factor > 0) ||
      !(c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor) ||
      !(c.rope_scaling.low_freq_factor > 0)) {
    throw invalid(source +
                  ": llama3 rope scaling needs factor > 0 and high_freq_factor > "
                  "low_freq_factor > 0");
  }
}

}  // namespace

ModelConfig parse_model_config(const std::string& json_text, const std::string& source) {
  const Json root = Json::parse(json_text, source);
  if (!root.is_object()) throw invalid(source + ": expected a JSON object");
  const Fields f(root, source);
  ModelConfig c;
  const Json* archs = f.get("architectures");
  if (archs != nullptr && archs->is_array() && !archs->array().empty() &&
      archs->array()[0].is_string()) {
    c.architecture = archs->array()[0].string();
  } else {
    const std::string type = f.text("model_type", "");
    if (type == "llama")
      c.architecture = "LlamaForCausalLM";
    else if (type == "mistral")
      c.architecture = "MistralForCausalLM";
    else if (type == "qwen2")
      c.architecture = "Qwen2ForCausalLM";
    else
      throw invalid(source + ": no \"architectures\" and no known \"model_type\"" +
                    (type.empty() ? "" : " (\"" + type + "\")"));
  }
  bool known = false;
  for (const char* a : kArchitectures) known = known || c.architecture == a;
  if (!known) {
    throw invalid(source + ": architecture \"" + c.architecture +
                  "\" is not supported (supported: LlamaForCausalLM, MistralForCausalLM, "
                  "Qwen2ForCausalLM)");
  }
  c.model_type = c.architecture == "LlamaForCausalLM"     ? "llama"
                 : c.architecture == "MistralForCausalLM" ? "mistral"
                                                          : "qwen2";
  const std::string act = f.text("hidden_act", "silu");
  if (act != "silu") {
    throw invalid(source + ": hidden_act \"" + act + "\" is not supported (supported: silu)");
  }
  if (f.boolean("mlp_bias", false)) throw invalid(source + ": mlp_bias is not supported");
  c.vocab_size = f.integer("vocab_size", 1, 0, true);
  c.hidden_size = f.integer("hidden_size", 1, 0, true);
  c.intermediate_size = f.integer("intermediate_size", 1, 0, true);
  c.layers = f.integer("num_hidden_layers", 1, 0, true);
  c.heads = f.integer("num_attention_heads", 1, 0, true);
  c.kv_heads = f.integer("num_key_value_heads", 1, c.heads, false);
  c.head_dim = f.integer("head_dim", 1, c.hidden_size / c.heads, false);
  c.rms_norm_eps = static_cast<float>(f.real("rms_norm_eps", 1e-6));
  c.max_position_embeddings = f.integer("max_position_embeddings", 1, 4096, false);
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  parse_rope(f, source, c);
  if (c.model_type == "qwen2") {
    c.qkv_bias = true;
    if (f.boolean("use_sliding_window", false)) {
      throw invalid(source + ": Qwen2 use_sliding_window is not supported");
    }
  } else {
    c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
  }
  if (c.model_type == "mistral") c.sliding_window = f.integer("sliding_window", 1, 0, false);
  std::string dtype = f.text("torch_dtype", f.text("dtype", "bfloat16"));
  try {
    c.dtype = parse_dtype(dtype);
  } catch (const Error&) {
    throw invalid(source + ": dtype \"" + dtype +
                  "\" is not supported (float32, float16, "
                  "bfloat16)");
  }
  try {
    validate(c);
  } catch (const Error& e) {
    throw invalid(source + ": " + e.what());
  }
  return c;
}

ModelConfig load_model_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw invalid("cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_model_config(text.str(), path);
}

void validate(const ModelConfig& c) {
  if (c.vocab_size < 1 || c.hidden_size < 1 || c.intermediate_size < 1 || c.layers < 1 ||
      c.heads < 1 || c.kv_heads < 1 || c.head_dim < 2) {
    throw invalid("every dimension must be positive (head_dim at least 2)");
  }
  if (c.heads % c.kv_heads != 0) {
    throw invalid("num_attention_heads (" + std::to_string(c.heads) +
                  ") is not a multiple of num_key_value_heads (" + std::to_string(c.kv_heads) +
                  ")");
  }
  if (c.head_dim % 2 != 0)
    throw invalid("head_dim must be even, got " + std::to_string(c.head_dim));
  if (c.head_dim > 1024) throw invalid("head_dim above 1024 is not supported");
  if (!(c.rms_norm_eps > 0) || !(c.rope_theta > 0)) {
    throw invalid("rms_norm_eps and rope_theta must be positive");
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
  std::ostringstream o;
  o.precision(9);
  const char* dtype = c.dtype == DType::kF32   ? "float32"
                      : c.dtype == DType::kF16 ? "float16"
                                               : "bfloat16";
  o << "{\n  \"architectures\": [" << json_quote(c.architecture) << "],\n"
    << "  \"model_type\": " << json_quote(c.model_type) << ",\n"
    << "  \"vocab_size\": " << c.vocab_size << ",\n"
    << "  \"hidden_size\": " << c.hidden_size << ",\n"
    << "  \"intermediate_size\": " << c.intermediate_size << ",\n"
    << "  \"num_hidden_layers\": " << c.layers << ",\n"
    << "  \"num_attention_heads\": " << c.heads << ",\n"
    << "  \"num_key_value_heads\": " << c.kv_heads << ",\n"
    << "  \"head_dim\": " << c.head_dim << ",\n"
    << "  \"hidden_act\": \"silu\",\n"
    << "  \"rms_norm_eps\": " << c.rms_norm_eps << ",\n"
    << "  \"rope_theta\": " << c.rope_theta << ",\n"
    << "  \"max_position_embeddings\": " << c.max_position_embeddings << ",\n"
    << "  \"tie_word_embeddings\": " << (c.tie_word_embeddings ? "true" : "false") << ",\n";
  if (c.rope_scaling.factor > 0) {
    o << "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": " << c.rope_scaling.factor
      << ", \"low_freq_factor\": " << c.rope_scaling.low_freq_factor
      << ", \"high_freq_factor\": " << c.rope_scaling.high_freq_factor
      << ", \"original_max_position_embeddings\": " << c.rope_scaling.original_max_position
      << "},\n";
  }
  if (c.model_type == "llama") {
    o << "  \"attention_bias\": " << (c.qkv_bias ? "true" : "false") << ",\n";
  }
  if (c.model_type == "mistral") {
    o << "  \"sliding_window\": ";
    if (c.sliding_window > 0)
      o << c.sliding_window;
    else
      o << "null";
    o << ",\n";
  }
  o << "  \"torch_dtype\": \"" << dtype << "\"\n}\n";
  return o.str();
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
