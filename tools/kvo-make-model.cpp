// kvo-make-model: writes a deterministic random model in Hugging Face's layout (config.json +
// model.safetensors, or shards + model.safetensors.index.json) for a preset or explicit
// dimensions. The values are the decoder's synthetic weights for the same seed, so a model
// written here and the same shape drawn on the device give the same tokens.
//
// Everything is checked first (the dimensions against their limits, the output directory, the
// free disk space); the files are then written into a temporary directory beside --out, tensor
// by tensor in pieces, and moved into place only when all of them are complete. A failure leaves
// nothing behind.
#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/checkpoint/weights.hpp"
#include "model/families/family.hpp"
#include "offload/util/partial_files.hpp"
#include "tools/cli/cli.hpp"
#include "tools/cli/progress_bar.hpp"

namespace {

using kvo::model::ModelConfig;

struct Args {
  std::string out;
  std::string preset = "tiny";
  std::string arch;  // empty: the preset's
  ModelConfig dims;  // the dimension options write here; `given` says which were
  double rope_theta = 0;
  std::string rope;  // empty: the preset's (none for another family)
  double rope_factor = 4;
  int rope_original = 4096;
  int tie = 0;
  int window = 0;
  std::string dtype;
  std::uint64_t seed = 1;
  int shards = 1;
};

// Every option, declared once. Dimension defaults come from the preset, so they are applied in
// resolve() only for the options not given.
void declare_options(CLI::App& app, Args& a) {
  kvo::cli::describe(app,
                     "Writes a deterministic random Llama-family model in Hugging Face's layout "
                     "(config.json and safetensors), for a preset or explicit dimensions.");
  using kvo::cli::add_integer;
  using L = kvo::model::ModelLimits;
  kvo::cli::add_text(app, "--out", a.out, "DIR", "a new or empty directory to write")->required();
  kvo::cli::add_choice(app, "--preset", a.preset, kvo::model::preset_names(), "the base shape");
  kvo::cli::add_choice(app, "--arch", a.arch, kvo::model::family_model_types(),
                       "architecture (default: the preset's)");
  app.option_defaults()->group("Dimensions (default: the preset's)");
  ModelConfig& d = a.dims;
  d.layers = d.hidden_size = d.intermediate_size = d.heads = d.kv_heads = d.head_dim =
      d.vocab_size = 0;
  const auto dim = [&](const char* name, int& value, int min, int max, const char* help) {
    add_integer(app, name, value, min, max, help)
        ->description(std::string(help) + "; " + std::to_string(min) + " to " +
                      std::to_string(max));
  };
  dim("--layers", d.layers, 1, L::kLayers, "decoder layers");
  dim("--hidden", d.hidden_size, 1, L::kHidden, "hidden size");
  dim("--intermediate", d.intermediate_size, 1, L::kIntermediate, "MLP size");
  dim("--heads", d.heads, 1, L::kHeads, "attention heads");
  dim("--kv-heads", d.kv_heads, 1, L::kHeads, "KV heads");
  dim("--head-dim", d.head_dim, 2, L::kHeadDim, "head dimension (even)");
  dim("--vocab", d.vocab_size, 1, L::kVocab, "vocabulary size");
  kvo::cli::add_real(app, "--rope-theta", a.rope_theta, 1, 1e12, "rope base")
      ->description("rope base; 1 to 1e12");
  kvo::cli::add_choice(app, "--rope", a.rope,
                       {"default", "linear", "dynamic", "yarn", "longrope", "llama3"},
                       "rope scaling, written as transformers writes it (longrope: synthetic "
                       "short and long factors)");
  kvo::cli::add_real(app, "--rope-factor", a.rope_factor, 1, 1e6, "")
      ->description("the scaling's factor; 1 to 1e6 (default 4)");
  add_integer(app, "--rope-original", a.rope_original, 1, L::kPositions, "")
      ->description("the pretraining length of llama3, yarn and longrope (default 4096)");
  add_integer(app, "--tie", a.tie, 0, 1, "")->description("1: tied embeddings; 0 or 1");
  add_integer(app, "--window", a.window, 1, L::kPositions, "")
      ->description(
          "the sliding window, in keys: every layer's for mistral and phi3, the window "
          "layers' for gemma2 and gemma3_text (default: none, Gemma's own)");
  kvo::cli::add_choice(app, "--dtype", a.dtype, kvo::dtype_names(false),
                       "element type (default: the preset's)");
  app.option_defaults()->group("Files");
  add_integer(app, "--seed", a.seed, 0, UINT64_MAX, "seed of the values");
  add_integer(app, "--shards", a.shards, 1, 1000,
              "write N shards and an index instead of one file");
}

// c with the rope scaling of --rope, read back through the config reader, which derives what
// transformers derives (yarn's and longrope's attention factor) and checks it.
ModelConfig with_rope(const ModelConfig& c, const Args& a) {
  nlohmann::ordered_json config = nlohmann::ordered_json::parse(kvo::model::to_config_json(c));
  config.erase("original_max_position_embeddings");
  // The block of rope_parameters (Gemma 3's: its full layers' entry), its base kept; built apart
  // and put back, as a reference into the ordered object would not survive an insertion.
  const bool per_type = config["rope_parameters"].contains("full_attention");
  nlohmann::ordered_json& where =
      per_type ? config["rope_parameters"]["full_attention"] : config["rope_parameters"];
  nlohmann::ordered_json r = {{"rope_type", "default"}, {"rope_theta", where["rope_theta"]}};
  if (a.rope != "default") {
    r["rope_type"] = a.rope;
    r["factor"] = a.rope_factor;
    if (a.rope == "llama3" || a.rope == "yarn" || a.rope == "longrope") {
      r["original_max_position_embeddings"] = a.rope_original;
    }
    if (a.rope == "longrope") {
      const int half = c.head_dim / 2;
      for (int i = 0; i < half; ++i) {
        r["short_factor"].push_back(1 + 0.02 * i);
        r["long_factor"].push_back(1 + (a.rope_factor - 1) * i / std::max(half - 1, 1));
      }
    }
  }
  where = r;
  if (r.contains("original_max_position_embeddings")) {
    // At the top level too, where Phi-3's class reads it first.
    config["original_max_position_embeddings"] = a.rope_original;
  }
  try {
    return kvo::model::parse_model_config(config.dump(), "--rope " + a.rope);
  } catch (const kvo::Error& e) {
    throw kvo::cli::UsageError(e.what());
  }
}

ModelConfig resolve(const Args& a, const CLI::App& app) {
  ModelConfig c = kvo::model::preset(a.preset);
  if (!a.arch.empty()) {
    const kvo::model::Family& family = kvo::model::family_of_model_type(a.arch, "--arch");
    c.architecture = family.architectures.front();
    c.model_type = family.model_type;
    c.qkv_bias = c.o_bias = false;
    if (a.arch != "llama") c.rope_scaling = {};  // llama3's rope scaling is Llama's alone
  }
  const auto given = [&](const char* name) { return app.count(name) != 0; };
  const kvo::model::Family& family =
      kvo::model::family_of_architecture(c.architecture, "--preset " + a.preset);
  if (given("--layers")) c.layers = a.dims.layers;
  if (given("--hidden")) c.hidden_size = a.dims.hidden_size;
  if (given("--intermediate")) c.intermediate_size = a.dims.intermediate_size;
  if (given("--heads")) c.heads = a.dims.heads;
  if (given("--kv-heads")) c.kv_heads = a.dims.kv_heads;
  if (given("--head-dim")) c.head_dim = a.dims.head_dim;
  if (given("--vocab")) c.vocab_size = a.dims.vocab_size;
  if (given("--tie")) c.tie_word_embeddings = a.tie != 0;
  if (given("--rope-theta")) c.rope_theta = static_cast<float>(a.rope_theta);
  if (given("--window")) {
    const std::string type = family.model_type;
    if (type != "mistral" && type != "phi3" && type != "gemma2" && type != "gemma3_text") {
      throw kvo::cli::UsageError("--window: " + type +
                                 " has no sliding window (mistral, phi3, gemma2 and gemma3_text "
                                 "have)");
    }
    c.sliding_window = a.window;
  }
  // What the family's models have, for the dimensions now set (Gemma's window layers).
  family.settle(c);
  if (!a.dtype.empty()) c.dtype = kvo::parse_dtype(a.dtype);
  if (!a.rope.empty()) c = with_rope(c, a);
  try {
    kvo::model::validate(c);
  } catch (const kvo::Error& e) {
    throw kvo::cli::UsageError(std::string("the model's dimensions do not fit: ") + e.what());
  }
  return c;
}

kvo::Error io_error(const std::string& what) {
  return kvo::Error(kvo::ErrorCode::kInvalidArgument, what + ": " + std::strerror(errno));
}

// --out must be a new or empty directory, so that no file of an earlier model (an index naming
// other shards) survives beside the new one. Returns whether it exists.
bool check_out_dir(const std::string& out) {
  struct stat st {};
  if (::stat(out.c_str(), &st) != 0) {
    if (errno != ENOENT) throw io_error("cannot use --out " + out);
    return false;
  }
  if (!S_ISDIR(st.st_mode)) throw kvo::cli::UsageError("--out " + out + " is not a directory");
  DIR* dir = ::opendir(out.c_str());
  if (dir == nullptr) throw io_error("cannot read --out " + out);
  bool empty = true;
  while (const dirent* e = ::readdir(dir)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) empty = false;
  }
  ::closedir(dir);
  if (!empty) {
    throw kvo::cli::UsageError("--out " + out +
                               " is not empty; give a new or empty directory (remove the old "
                               "model first)");
  }
  return true;
}

std::string parent_of(const std::string& path) {
  std::string p = path;
  while (p.size() > 1 && p.back() == '/') p.pop_back();
  const std::size_t slash = p.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

// A directory of files being written (offload/util/partial_files.hpp: a partial, removed if the
// tool is interrupted, or by the next run once this one is gone); removed with its files unless
// committed.
class PartialDir {
 public:
  explicit PartialDir(const std::string& out) {
    const std::string pattern = kvo::offload::partial_pattern(out);
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (::mkdtemp(buffer.data()) == nullptr)
      throw io_error("cannot create a directory beside " + out);
    path_ = buffer.data();
    registration_ = kvo::offload::PartialRegistration(path_, true);
  }
  ~PartialDir() {
    if (path_.empty()) return;
    for (const auto& f : files_) ::unlink((path_ + "/" + f).c_str());
    ::rmdir(path_.c_str());
  }
  PartialDir(const PartialDir&) = delete;
  PartialDir& operator=(const PartialDir&) = delete;

  std::string file(const std::string& name) {
    files_.push_back(name);
    return path_ + "/" + name;
  }
  // Puts the directory at `out`, which is absent or an empty directory (rename replaces one of
  // those in one step).
  void commit(const std::string& out) {
    if (::rename(path_.c_str(), out.c_str()) != 0) {
      throw io_error("cannot move the model to " + out);
    }
    path_.clear();
    registration_.release();
  }

 private:
  std::string path_;
  std::vector<std::string> files_;
  kvo::offload::PartialRegistration registration_;
};

void write_text(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) throw io_error("cannot write " + path);
  const bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (std::fclose(f) != 0 || !ok) throw io_error("failed writing " + path);
}

int make_model(const Args& args, const CLI::App& app) {
  const ModelConfig config = resolve(args, app);
  const kvo::model::WeightLayout layout(config, config.dtype);
  const auto& entries = layout.entries();
  if (static_cast<std::size_t>(args.shards) > entries.size()) {
    throw kvo::cli::UsageError("--shards " + std::to_string(args.shards) + " is more than the " +
                               std::to_string(entries.size()) + " tensors of the model");
  }
  const bool out_exists = check_out_dir(args.out);
  std::uint64_t data_bytes = 0;
  for (const auto& e : entries) data_bytes += layout.entry_bytes(e);
  // The headers and config are small: a mebibyte covers them.
  const std::uint64_t need = data_bytes + (1u << 20);
  struct statvfs fs {};
  const std::string fs_dir = out_exists ? args.out : parent_of(args.out);
  if (::statvfs(fs_dir.c_str(), &fs) != 0) throw io_error("cannot inspect " + fs_dir);
  const std::uint64_t free_bytes = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (need > free_bytes) {
    throw kvo::Error(kvo::ErrorCode::kOutOfMemory, "the model needs " + kvo::format_bytes(need) +
                                                       " on disk but " + fs_dir + " has " +
                                                       kvo::format_bytes(free_bytes) + " free");
  }

  for (const std::string& stale : kvo::offload::remove_stale_partials(parent_of(args.out))) {
    std::cerr << "kvo-make-model: removed " << stale << ", left by a run that was killed\n";
  }
  PartialDir partial(args.out);
  write_text(partial.file("config.json"), kvo::model::to_config_json(config));
  const std::size_t shards = static_cast<std::size_t>(args.shards);
  const std::size_t per_shard = (entries.size() + shards - 1) / shards;
  nlohmann::ordered_json index;
  index["metadata"] = {{"total_size", data_bytes}};
  index["weight_map"] = nlohmann::ordered_json::object();
  kvo::cli::ProgressBar bar("writing", static_cast<double>(data_bytes) / 1e6, "MB");
  std::uint64_t written = 0;
  // Values are drawn in pieces of this many elements, so no tensor is ever whole in memory.
  constexpr std::int64_t kPiece = 1 << 22;
  std::vector<std::byte> piece(static_cast<std::size_t>(kPiece) * kvo::dtype_size(layout.dtype()));
  for (std::size_t s = 0; s < shards; ++s) {
    const std::string file = shards == 1 ? "model.safetensors"
                                         : "model-" + std::to_string(s + 1) + "-of-" +
                                               std::to_string(shards) + ".safetensors";
    const std::size_t first = s * per_shard, last = std::min(entries.size(), (s + 1) * per_shard);
    std::vector<kvo::model::TensorHeader> headers;
    for (std::size_t i = first; i < last; ++i) {
      headers.push_back({entries[i].name, layout.dtype(), entries[i].shape});
      index["weight_map"][entries[i].name] = file;
    }
    kvo::model::SafetensorsWriter writer(partial.file(file), std::move(headers));
    for (std::size_t i = first; i < last; ++i) {
      const auto& e = entries[i];
      for (std::int64_t at = 0; at < e.elements; at += kPiece) {
        const std::int64_t n = std::min(kPiece, e.elements - at);
        kvo::model::fill_synthetic_range(layout, e, args.seed, at, n, piece.data());
        const std::size_t bytes = static_cast<std::size_t>(n) * kvo::dtype_size(layout.dtype());
        writer.write(piece.data(), bytes);
        written += bytes;
        bar.update(static_cast<std::int64_t>(written), static_cast<std::int64_t>(data_bytes));
      }
    }
    writer.finish();
  }
  if (shards > 1) {
    write_text(partial.file("model.safetensors.index.json"), index.dump(2) + "\n");
  }
  partial.commit(args.out);
  std::cout << "kvo-make-model: wrote " << config.architecture << " (" << config.layers
            << " layers, hidden " << config.hidden_size << ", "
            << kvo::model::parameter_count(config) << " parameters, "
            << kvo::dtype_name(config.dtype) << ") to " << args.out << "\n";
  return kvo::cli::kExitSuccess;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("", "kvo-make-model");
  Args args;
  declare_options(app, args);
  return kvo::cli::run(app, argc, argv, [&] { return make_model(args, app); });
}
