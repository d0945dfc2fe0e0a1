#include "model/checkpoint/fingerprint.hpp"

#include <sys/mman.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

// xxHash from its header alone (Debian libxxhash-dev), as the saved contexts' checksums.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvoffload/error.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "offload/util/byte_io.hpp"
#include "offload/util/input_file.hpp"

namespace kvo::model {

namespace {

constexpr std::uint64_t kBlockBytes = 64u << 20;
constexpr const char* kCacheName = "kvoffload-fingerprint.json";
constexpr std::uint64_t kMaxCacheBytes = 16u << 20;

std::string hex(const XXH128_hash_t& h) {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return text;
}

// One line of the cache: a file as it was when hashed.
struct CachedFile {
  std::string name;
  std::uint64_t size = 0, device = 0, inode = 0;
  std::int64_t mtime_ns = 0;
  Digest digest;
};

bool same_file(const CachedFile& c, const offload::InputFile& f) {
  return c.size == f.size() && c.device == f.device() && c.inode == f.inode() &&
         c.mtime_ns == f.mtime_ns();
}

// The cache's entries; an unreadable or malformed cache is no cache (it is rewritten).
std::vector<CachedFile> read_cache(const std::string& path) {
  std::vector<CachedFile> out;
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return out;
  try {
    Json document;
    const JsonField root =
        parse_json_object(read_regular_file(path, kMaxCacheBytes), path, document);
    for (const JsonField& f : root.at("files").elements()) {
      CachedFile c;
      c.name = f.at("name").text();
      c.size = static_cast<std::uint64_t>(f.at("size").integer(0, INT64_MAX));
      c.device = static_cast<std::uint64_t>(f.at("device").integer(0, INT64_MAX));
      c.inode = static_cast<std::uint64_t>(f.at("inode").integer(0, INT64_MAX));
      c.mtime_ns = f.at("mtime_ns").integer(INT64_MIN, INT64_MAX);
      c.digest = f.at("xxh3_128").text();
      if (c.digest.size() != 32) continue;
      out.push_back(std::move(c));
    }
  } catch (const Error&) {
    out.clear();
  }
  return out;
}

bool write_cache(const std::string& path, const std::vector<CachedFile>& files) {
  Json root;
  root["about"] = "XXH3-128 digests of the model files, for kvoffload's saved contexts";
  root["files"] = Json::array();
  for (const CachedFile& c : files) {
    root["files"].push_back({{"name", c.name},
                             {"size", c.size},
                             {"device", c.device},
                             {"inode", c.inode},
                             {"mtime_ns", c.mtime_ns},
                             {"xxh3_128", c.digest}});
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

}  // namespace

Digest file_digest(const std::string& path,
                   const std::function<void(std::int64_t, std::int64_t)>& progress) {
  const offload::InputFile file(path, kMaxSafetensorsFileBytes);
  const std::uint64_t size = file.size();
  const std::uint64_t blocks = size == 0 ? 0 : (size - 1) / kBlockBytes + 1;
  std::vector<XXH128_hash_t> digests(static_cast<std::size_t>(blocks));
  if (blocks > 0) {
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, file.fd(), 0);
    if (map == MAP_FAILED) {
      throw Error(ErrorCode::kInvalidArgument,
                  "cannot map " + path + " to hash it: " + std::strerror(errno));
    }
    ::madvise(map, size, MADV_SEQUENTIAL);
    const auto* bytes = static_cast<const unsigned char*>(map);
    std::atomic<std::uint64_t> next{0};
    std::atomic<std::int64_t> done{0};
    std::mutex progress_mutex;
    const auto work = [&](bool reports) {
      for (std::uint64_t b = next++; b < blocks; b = next++) {
        const std::uint64_t begin = b * kBlockBytes;
        const std::uint64_t n = std::min(kBlockBytes, size - begin);
        digests[static_cast<std::size_t>(b)] = XXH3_128bits(bytes + begin, n);
        done += static_cast<std::int64_t>(n);
        if (reports && progress) {
          const std::lock_guard<std::mutex> lock(progress_mutex);
          progress(done.load(), static_cast<std::int64_t>(size));
        }
      }
    };
    const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
    const auto helpers = static_cast<unsigned>(std::min<std::uint64_t>(cores, blocks)) - 1;
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < helpers; ++t) threads.emplace_back(work, false);
    work(true);
    for (std::thread& t : threads) t.join();
    ::munmap(map, size);
  }
  // The blocks' digests, in order, and the size: the file's digest.
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, digests.data(), digests.size() * sizeof(XXH128_hash_t));
  XXH3_128bits_update(state, &size, sizeof size);
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return hex(h);
}

Digest weights_digest(const std::string& checkpoint_dir,
                      const std::function<void(std::int64_t, std::int64_t)>& progress) {
  std::vector<std::string> names;
  const std::string index = checkpoint_dir + "/model.safetensors.index.json";
  if (path_exists(index)) {
    names.push_back("model.safetensors.index.json");
    for (const std::string& shard :
         parse_safetensors_index(read_regular_file(index, kMaxSafetensorsIndexBytes), index)
             .shards) {
      names.push_back(shard);
    }
  } else {
    names.push_back("model.safetensors");
  }
  const std::string beside = checkpoint_dir + "/" + kCacheName;
  std::vector<CachedFile> cached = read_cache(beside);
  if (cached.empty()) {
    const std::string user = user_cache_path(checkpoint_dir, false);
    if (!user.empty()) cached = read_cache(user);
  }
  std::vector<CachedFile> now;
  bool changed = false;
  for (const std::string& name : names) {
    const std::string path = checkpoint_dir + "/" + name;
    const offload::InputFile file(path, kMaxSafetensorsFileBytes);
    CachedFile c{name, file.size(), file.device(), file.inode(), file.mtime_ns(), ""};
    for (const CachedFile& old : cached) {
      if (old.name == name && same_file(old, file)) c.digest = old.digest;
    }
    if (c.digest.empty()) {
      c.digest = file_digest(path, progress);
      changed = true;
    }
    now.push_back(std::move(c));
  }
  if (changed || now.size() != cached.size()) {
    if (!write_cache(beside, now)) {
      const std::string user = user_cache_path(checkpoint_dir, true);
      if (!user.empty()) write_cache(user, now);
    }
  }
  std::string all;
  for (const CachedFile& c : now) all += c.name + " " + c.digest + "\n";
  return hex(XXH3_128bits(all.data(), all.size()));
}

Digest tokenizer_digest(const std::string& model_dir) {
  std::string all;
  for (const char* name :
       {"tokenizer.json", "tokenizer.model", "tokenizer_config.json", "chat_template.jinja"}) {
    const std::string path = model_dir + "/" + name;
    all += std::string(name) + " " + (path_exists(path) ? file_digest(path) : "absent") + "\n";
  }
  return hex(XXH3_128bits(all.data(), all.size()));
}

}  // namespace kvo::model
