#include "model/checkpoint/fingerprint.hpp"

#include <sys/mman.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvoffload/error.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "offload/util/byte_io.hpp"
#include "offload/util/input_file.hpp"

namespace kvo::model {

namespace {

constexpr const char* kCacheName = "kvoffload-fingerprint.json";
constexpr std::uint64_t kMaxCacheBytes = 64u << 20;
// The digests a cache holds; a cache of another format (the whole files' digests of earlier
// versions) is no cache.
constexpr int kCacheFormat = 2;

std::string hex(const XXH128_hash_t& h) {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return text;
}

// One file of the cache: the file as it was when hashed, and its tensors' bytes' digests.
struct CachedFile {
  std::string name;
  std::uint64_t size = 0, device = 0, inode = 0;
  std::int64_t mtime_ns = 0;
  std::map<std::string, Digest> tensors;
};

bool same_file(const CachedFile& c, const offload::InputFile& f) {
  return c.size == f.size() && c.device == f.device() && c.inode == f.inode() &&
         c.mtime_ns == f.mtime_ns();
}

// The cache's entries; an unreadable, malformed or older cache is no cache (it is rewritten).
std::vector<CachedFile> read_cache(const std::string& path) {
  std::vector<CachedFile> out;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return out;
  try {
    Json document;
    const JsonField root =
        parse_json_object(read_regular_file(path, kMaxCacheBytes), path, document);
    if (root.integer_or("format", 0, 0, 1 << 20) != kCacheFormat) return out;
    for (const JsonField& f : root.at("files").elements()) {
      CachedFile c;
      c.name = f.at("name").text();
      c.size = static_cast<std::uint64_t>(f.at("size").integer(0, INT64_MAX));
      c.device = static_cast<std::uint64_t>(f.at("device").integer(0, INT64_MAX));
      c.inode = static_cast<std::uint64_t>(f.at("inode").integer(0, INT64_MAX));
      c.mtime_ns = f.at("mtime_ns").integer(INT64_MIN, INT64_MAX);
      for (const auto& [tensor, digest] : f.at("xxh3_128").json().items()) {
        if (!digest.is_string() || digest.get<std::string>().size() != 32) {
          throw Error(ErrorCode::kInvalidArgument, "malformed");
        }
        c.tensors[tensor] = digest.get<std::string>();
      }
      out.push_back(std::move(c));
    }
  } catch (const Error&) {
    out.clear();
  } catch (const nlohmann::json::exception&) {
    out.clear();
  }
  return out;
}

bool write_cache(const std::string& path, const std::vector<CachedFile>& files) {
  Json root;
  root["about"] =
      "XXH3-128 digests of the tensors of the model files, for kvoffload's saved "
      "contexts";
  root["format"] = kCacheFormat;
  root["files"] = Json::array();
  for (const CachedFile& c : files) {
    root["files"].push_back({{"name", c.name},
                             {"size", c.size},
                             {"device", c.device},
                             {"inode", c.inode},
                             {"mtime_ns", c.mtime_ns},
                             {"xxh3_128", c.tensors}});
  }
  try {
    const std::string text = root.dump(1, ' ', false, Json::error_handler_t::replace) + "\n";
    offload::AtomicFileSink sink(path);
    sink.write(text.data(), text.size());
    sink.commit();
    return true;
  } catch (const Error&) {
    return false;
  }
}

// The cache file for `checkpoint_dir` in the user's cache directory, which is made when `make`.
std::string user_cache_path(const std::string& checkpoint_dir, bool make) {
  char* real = ::realpath(checkpoint_dir.c_str(), nullptr);
  const std::string absolute = real != nullptr ? real : checkpoint_dir;
  std::free(real);
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  std::string base;
  if (xdg != nullptr && xdg[0] == '/') {
    base = xdg;
  } else if (home != nullptr && home[0] == '/') {
    base = std::string(home) + "/.cache";
  } else {
    return {};
  }
  base += "/kvoffload/fingerprints";
  for (std::size_t at = 1; make && at <= base.size(); ++at) {  // mkdir -p
    if (at == base.size() || base[at] == '/') ::mkdir(base.substr(0, at).c_str(), 0755);
  }
  return base + "/" + hex(XXH3_128bits(absolute.data(), absolute.size())) + ".json";
}

// The safetensors files of a checkpoint directory: the index's shards, or model.safetensors.
std::vector<std::string> safetensors_files(const std::string& dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  if (!path_exists(index)) return {"model.safetensors"};
  return parse_safetensors_index(read_regular_file(index, kMaxSafetensorsIndexBytes), index).shards;
}

// A config value as one line: numbers canonical, lists "[a,b]", objects "{k:v,...}".
std::string value_text(const nlohmann::ordered_json& v) {
  if (v.is_boolean()) return v.get<bool>() ? "true" : "false";
  if (v.is_number_unsigned()) return std::to_string(v.get<std::uint64_t>());
  if (v.is_number_integer()) return std::to_string(v.get<std::int64_t>());
  if (v.is_number()) return fingerprint_number(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  if (v.is_null()) return "null";
  std::string out = v.is_array() ? "[" : "{";
  bool first = true;
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (!first) out += ",";
    first = false;
    if (v.is_object()) out += it.key() + ":";
    out += value_text(*it);
  }
  return out + (v.is_array() ? "]" : "}");
}

// Every layer attends in full: as good as no layer_types at all.
bool all_full_attention(const nlohmann::ordered_json& v) {
  if (!v.is_array()) return false;
  for (const auto& e : v) {
    if (!e.is_string() || e.get<std::string>() != "full_attention") return false;
  }
  return true;
}

void flatten(const nlohmann::ordered_json& o, const std::string& prefix, bool top,
             Fingerprint& out) {
  for (auto it = o.begin(); it != o.end(); ++it) {
    const nlohmann::ordered_json& v = it.value();
    const std::string key = prefix + it.key();
    if (v.is_null()) continue;
    if (top && ((v.is_boolean() && !v.get<bool>()) || (v.is_array() && v.empty()) ||
                (v.is_object() && v.empty()))) {
      continue;
    }
    if (top && it.key() == "layer_types" && all_full_attention(v)) continue;
    if (v.is_object()) {
      flatten(v, key + ".", false, out);
    } else {
      out.set(key, value_text(v));
    }
  }
}

}  // namespace

Digest file_digest(const std::string& path,
                   const std::function<void(std::int64_t, std::int64_t)>& progress) {
  const offload::InputFile file(path, kMaxSafetensorsFileBytes);
  const std::uint64_t size = file.size();
  if (size == 0) return WeightsDigest::bytes_digest(nullptr, 0, 1);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  if (map == MAP_FAILED) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot map " + path + " to hash it: " + std::strerror(errno));
  }
  ::madvise(map, size, MADV_SEQUENTIAL);
  const auto report = [&](std::uint64_t done, std::uint64_t total) {
    if (progress) progress(static_cast<std::int64_t>(done), static_cast<std::int64_t>(total));
  };
  const std::vector<std::string> digest = WeightsDigest::bytes_digests({{map, size}}, 0, report);
  ::munmap(map, size);
  return digest[0];
}

Digest weights_digest(const std::string& checkpoint_dir,
                      const std::function<void(std::int64_t, std::int64_t)>& progress) {
  const std::string beside = checkpoint_dir + "/" + kCacheName;
  std::vector<CachedFile> cached = read_cache(beside);
  if (cached.empty()) {
    const std::string user = user_cache_path(checkpoint_dir, false);
    if (!user.empty()) cached = read_cache(user);
  }
  // Each file's tensors: from the cache where the file is as it was, else hashed (every block of
  // every file that changed on one pool of threads).
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::vector<CachedFile> now;
  std::vector<WeightsDigest::ByteRange> ranges;
  std::vector<std::pair<std::size_t, std::string>> hashed;  // (file, tensor) of each range
  for (const std::string& name : safetensors_files(checkpoint_dir)) {
    const std::string path = checkpoint_dir + "/" + name;
    const offload::InputFile identity(path, kMaxSafetensorsFileBytes);
    files.push_back(std::make_unique<SafetensorsFile>(path));
    CachedFile c{name, identity.size(), identity.device(), identity.inode(), identity.mtime_ns(),
                 {}};
    const std::map<std::string, TensorInfo>& tensors = files.back()->tensors();
    for (const CachedFile& old : cached) {
      if (old.name == name && same_file(old, identity) && old.tensors.size() == tensors.size()) {
        c.tensors = old.tensors;
      }
    }
    if (c.tensors.empty()) {
      for (const auto& [tensor, info] : tensors) {
        ranges.push_back({info.data, info.bytes});
        hashed.emplace_back(now.size(), tensor);
      }
    }
    now.push_back(std::move(c));
  }
  if (!ranges.empty()) {
    const auto report = [&](std::uint64_t done, std::uint64_t total) {
      if (progress) progress(static_cast<std::int64_t>(done), static_cast<std::int64_t>(total));
    };
    const std::vector<std::string> digests = WeightsDigest::bytes_digests(ranges, 0, report);
    for (std::size_t i = 0; i < hashed.size(); ++i) {
      now[hashed[i].first].tensors[hashed[i].second] = digests[i];
    }
    if (!write_cache(beside, now)) {
      const std::string user = user_cache_path(checkpoint_dir, true);
      if (!user.empty()) write_cache(user, now);
    }
  }
  WeightsDigest digest;
  for (std::size_t f = 0; f < files.size(); ++f) {
    for (const auto& [tensor, info] : files[f]->tensors()) {
      const auto it = now[f].tensors.find(tensor);
      if (it == now[f].tensors.end()) {  // a cache that names other tensors: a changed file
        digest.add(tensor, info.dtype_text, info.shape, info.data, info.bytes);
      } else {
        digest.add_digest(tensor, info.dtype_text, info.shape, it->second);
      }
    }
  }
  return digest.hex();
}

Digest tokenizer_digest(const std::string& model_dir) {
  return files_digest(
      model_dir, std::vector<std::string>(std::begin(kTokenizerFiles), std::end(kTokenizerFiles)));
}

void add_config(const ModelConfig& config, Fingerprint& fingerprint) {
  nlohmann::ordered_json o = nlohmann::ordered_json::parse(to_config_json(config));
  o.erase("architectures");
  o.erase("torch_dtype");
  // Phi-3's pretraining length at the top level: the rope block states the one the rope reads.
  o.erase("original_max_position_embeddings");
  flatten(o, "config.", true, fingerprint);
}

std::string model_fingerprint(const ModelConfig& config, const std::string& checkpoint,
                              std::uint64_t seed, const LoadedWeights& loaded,
                              const std::function<void(std::int64_t, std::int64_t)>& progress) {
  Fingerprint f;
  add_config(config, f);
  if (checkpoint.empty()) {
    f.set("weights.seed", std::to_string(seed));
  } else if (is_gguf_model(checkpoint)) {
    f.set("weights.gguf_xxh3", file_digest(checkpoint, progress));  // its tokenizer is inside
  } else {
    f.set("weights.xxh3", weights_digest(checkpoint, progress));
    const Digest tokenizer = tokenizer_digest(checkpoint);
    if (!tokenizer.empty()) f.set("tokenizer.xxh3", tokenizer);
  }
  f.set("load.weights",
        loaded.format + (loaded.per_row_scales ? " (int8: one scale per row)" : ""));
  f.set("load.activations", loaded.q8_activations ? "q8" : "f32");
  return f.text();
}

}  // namespace kvo::model
