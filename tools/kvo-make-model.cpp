// kvo-make-model: writes a deterministic random model in Hugging Face's layout (config.json +
// model.safetensors, or shards + model.safetensors.index.json) for a preset or explicit
// dimensions. The values are the decoder's synthetic weights for the same seed, so a model
// written here and the same shape drawn on the device give the same tokens.
#include <sys/stat.h>

#include <fstream>
#include <iostream>

#include "kvoffload/kvoffload.hpp"
#include "model/json.hpp"
#include "model/model_config.hpp"
#include "model/safetensors.hpp"
#include "model/weights.hpp"
#include "tools/cli.hpp"

namespace {

constexpr const char* kUsage = R"(usage: kvo-make-model --out DIR [options]

  --out DIR            directory to write (created if missing)
  --preset NAME        tiny, llama3-8b, mistral-7b, qwen2.5-7b (tiny)
  --arch A             llama, mistral or qwen2 (the preset's)
  --layers N  --hidden N  --intermediate N  --heads N  --kv-heads N  --head-dim N  --vocab N
  --rope-theta X       --tie 0|1 (tied embeddings)
  --dtype T            f32, f16 or bf16 (the preset's)
  --seed N             seed of the values (1)
  --shards N           write N shards and an index instead of one file (1)
)";

using kvo::model::ModelConfig;

ModelConfig parse(const kvo::cli::Args& args) {
  ModelConfig c = kvo::model::preset(args.get("preset", "tiny"));
  if (args.has("arch")) {
    const std::string a = args.get("arch", "");
    if (a == "llama") {
      c.architecture = "LlamaForCausalLM", c.model_type = "llama", c.qkv_bias = false;
    } else if (a == "mistral") {
      c.architecture = "MistralForCausalLM", c.model_type = "mistral", c.qkv_bias = false;
    } else if (a == "qwen2") {
      c.architecture = "Qwen2ForCausalLM", c.model_type = "qwen2", c.qkv_bias = true;
    } else {
      throw kvo::cli::UsageError("--arch must be llama, mistral or qwen2, got '" + a + "'");
    }
    if (a != "llama") c.rope_scaling = {};
    c.o_bias = false;
  }
  constexpr std::int64_t kMax = 1 << 30;
  c.layers = static_cast<int>(args.get_int("layers", c.layers, 1, 4096));
  c.hidden_size = static_cast<int>(args.get_int("hidden", c.hidden_size, 1, kMax));
  c.intermediate_size =
      static_cast<int>(args.get_int("intermediate", c.intermediate_size, 1, kMax));
  c.heads = static_cast<int>(args.get_int("heads", c.heads, 1, 4096));
  c.kv_heads = static_cast<int>(args.get_int("kv-heads", c.kv_heads, 1, 4096));
  c.head_dim = static_cast<int>(args.get_int("head-dim", c.head_dim, 2, 1024));
  c.vocab_size = static_cast<int>(args.get_int("vocab", c.vocab_size, 1, kMax));
  c.tie_word_embeddings = args.get_int("tie", c.tie_word_embeddings ? 1 : 0, 0, 1) != 0;
  if (args.has("rope-theta")) c.rope_theta = std::stof(args.get("rope-theta", ""));
  if (args.has("dtype")) c.dtype = kvo::parse_dtype(args.get("dtype", ""));
  kvo::model::validate(c);
  return c;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  if (!out) throw kvo::Error(kvo::ErrorCode::kInvalidArgument, "cannot write " + path);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const kvo::cli::Args args(
        argc, argv,
        {"out", "preset", "arch", "layers", "hidden", "intermediate", "heads", "kv-heads",
         "head-dim", "vocab", "rope-theta", "tie", "dtype", "seed", "shards"},
        {"help"});
    if (args.has("help")) {
      std::cout << kUsage;
      return 0;
    }
    if (!args.has("out")) throw kvo::cli::UsageError("--out DIR is required");
    const std::string out = args.get("out", "");
    const ModelConfig config = parse(args);
    const auto seed = static_cast<std::uint64_t>(args.get_int("seed", 1, 0, INT64_MAX));
    const int shards = static_cast<int>(args.get_int("shards", 1, 1, 1000));
    ::mkdir(out.c_str(), 0755);
    write_text(out + "/config.json", kvo::model::to_config_json(config));

    const kvo::model::WeightLayout layout(config, config.dtype);
    const auto& entries = layout.entries();
    const std::size_t per_shard =
        (entries.size() + static_cast<std::size_t>(shards) - 1) / static_cast<std::size_t>(shards);
    std::string index = "{\n  \"metadata\": {\"total_size\": " + std::to_string(layout.bytes()) +
                        "},\n  \"weight_map\": {";
    for (int s = 0; s < shards; ++s) {
      const std::string file = shards == 1 ? "model.safetensors"
                                           : "model-" + std::to_string(s + 1) + "-of-" +
                                                 std::to_string(shards) + ".safetensors";
      std::vector<kvo::model::TensorToWrite> tensors;
      for (std::size_t i = s * per_shard; i < std::min(entries.size(), (s + 1) * per_shard); ++i) {
        const auto& e = entries[i];
        kvo::model::TensorToWrite t;
        t.name = e.name;
        t.dtype = layout.dtype();
        t.shape = e.shape;
        t.data.resize(layout.entry_bytes(e));
        kvo::model::fill_synthetic(layout, e, seed, t.data.data());
        index += std::string(i == 0 ? "" : ",") + "\n    " + kvo::model::json_quote(e.name) + ": " +
                 kvo::model::json_quote(file);
        tensors.push_back(std::move(t));
      }
      kvo::model::write_safetensors(out + "/" + file, tensors);
    }
    if (shards > 1) write_text(out + "/model.safetensors.index.json", index + "\n  }\n}\n");
    std::cout << "kvo-make-model: wrote " << config.architecture << " (" << config.layers
              << " layers, hidden " << config.hidden_size << ", "
              << kvo::model::parameter_count(config) << " parameters, "
              << kvo::dtype_name(config.dtype) << ") to " << out << "\n";
    return 0;
  } catch (const kvo::cli::UsageError& e) {
    std::cerr << "kvo-make-model: " << e.what() << "\n\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kvo-make-model: " << e.what() << "\n";
    return 1;
  }
}
