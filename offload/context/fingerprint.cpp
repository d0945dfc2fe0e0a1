#include "kvoffload/fingerprint.hpp"

#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>

// xxHash from its header alone (Debian libxxhash-dev), as the saved contexts' checksums.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include "kvoffload/error.hpp"
#include "offload/util/input_file.hpp"
#include "offload/util/printable.hpp"

namespace kvo {
namespace {

constexpr std::uint64_t kBlockBytes = 64u << 20;
// A tokenizer file, or any other file files_digest hashes, is at most this large.
constexpr std::uint64_t kMaxDigestFileBytes = std::uint64_t{4} << 30;

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

std::string hex(const XXH128_hash_t& h) {
  char text[33];
  std::snprintf(text, sizeof text, "%016llx%016llx", static_cast<unsigned long long>(h.high64),
                static_cast<unsigned long long>(h.low64));
  return text;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

// The bytes' digest: the blocks' digests in order, then the byte count.
std::string combine(const std::vector<XXH128_hash_t>& blocks, std::uint64_t bytes) {
  XXH3_state_t* state = XXH3_createState();
  XXH3_128bits_reset(state);
  XXH3_128bits_update(state, blocks.data(), blocks.size() * sizeof(XXH128_hash_t));
  XXH3_128bits_update(state, &bytes, sizeof bytes);
  const XXH128_hash_t h = XXH3_128bits_digest(state);
  XXH3_freeState(state);
  return hex(h);
}

// Newlines and backslashes escaped, so that a value stays on its line.
std::string escape(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (const char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else {
      out += c;
    }
  }
  return out;
}

// The "key=value" lines after the format line, as a map.
std::map<std::string, std::string> fields_of(const std::string& text) {
  std::map<std::string, std::string> fields;
  std::size_t start = text.find('\n');
  while (start != std::string::npos && start < text.size()) {
    ++start;
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(start, end - start);
    const std::size_t eq = line.find('=');
    if (eq == std::string::npos) {
      fields.emplace(line, "");
    } else {
      fields.emplace(line.substr(0, eq), line.substr(eq + 1));
    }
    start = end;
  }
  return fields;
}

// One tensor's contribution to the weights' digest.
struct TensorEntry {
  std::string dtype;
  std::vector<std::int64_t> shape;
  std::string bytes_digest;
};

}  // namespace

std::string fingerprint_number(double value) {
  if (!std::isfinite(value)) {
    throw invalid("a model fingerprint holds finite numbers only, got " +
                  std::string(std::isnan(value) ? "NaN"
                              : value > 0       ? "inf"
                                                : "-inf"));
  }
  if (value == std::trunc(value) && std::fabs(value) < 9007199254740992.0) {
    return std::to_string(static_cast<std::int64_t>(value));  // -0 too: "0"
  }
  // The shortest digits that read back as `value`, d.ddde±x, laid out as Python's repr does:
  // positional for exponents from -4 to 15, else scientific with at least two exponent digits.
  char buf[64];
  const std::to_chars_result r =
      std::to_chars(buf, buf + sizeof buf, value, std::chars_format::scientific);
  const std::string sci(buf, r.ptr);
  const std::size_t e = sci.find('e');
  const bool negative = sci[0] == '-';
  std::string digits;
  for (std::size_t i = negative ? 1 : 0; i < e; ++i) {
    if (sci[i] != '.') digits += sci[i];
  }
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    } else {
      const auto point = static_cast<std::size_t>(exponent) + 1;
      if (digits.size() <= point) digits += std::string(point - digits.size() + 1, '0');
      out += digits.substr(0, point) + "." + digits.substr(point);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp[16];
  std::snprintf(exp, sizeof exp, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp;
}

void Fingerprint::set(const std::string& key, const std::string& value) {
  if (key.empty()) throw invalid("a model fingerprint's key is empty");
  for (const char c : key) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '=' || u < 0x21 || u > 0x7e) {
      throw invalid(
          "a model fingerprint's key holds '=', a space or a byte outside printable "
          "ASCII: '" +
          printable(key, 100) + "'");
    }
  }
  fields_[key] = escape(value);
}

void Fingerprint::set_number(const std::string& key, double value) {
  try {
    set(key, fingerprint_number(value));
  } catch (const Error& e) {
    throw invalid(printable(key, 100) + ": " + e.what());
  }
}

void Fingerprint::set_integer(const std::string& key, std::int64_t value) {
  set(key, std::to_string(value));
}

void Fingerprint::set_bool(const std::string& key, bool value) {
  set(key, value ? "true" : "false");
}

std::string Fingerprint::text() const {
  std::string out = kFingerprintFormat;
  for (const auto& [key, value] : fields_) out += "\n" + key + "=" + value;
  return out;
}

bool is_fingerprint(const std::string& text) {
  const std::size_t n = sizeof(kFingerprintFormat) - 1;
  return text.compare(0, n, kFingerprintFormat) == 0 && (text.size() == n || text[n] == '\n');
}

std::string fingerprint_difference(const std::string& saved, const std::string& mine) {
  const std::map<std::string, std::string> a = fields_of(saved);
  const std::map<std::string, std::string> b = fields_of(mine);
  auto ia = a.begin();
  auto ib = b.begin();
  const auto shown = [](const std::string& value) { return printable(value, 200); };
  while (ia != a.end() || ib != b.end()) {
    if (ib == b.end() || (ia != a.end() && ia->first < ib->first)) {
      return shown(ia->first) + " is " + shown(ia->second) + " in the file and absent here";
    }
    if (ia == a.end() || ib->first < ia->first) {
      return shown(ib->first) + " is absent in the file and " + shown(ib->second) + " here";
    }
    if (ia->second != ib->second) {
      return shown(ia->first) + " is " + shown(ia->second) + " in the file and " +
             shown(ib->second) + " here";
    }
    ++ia;
    ++ib;
  }
  return "";
}

std::string fingerprint_field(const std::string& text, const std::string& key) {
  const std::map<std::string, std::string> fields = fields_of(text);
  const auto it = fields.find(key);
  return it == fields.end() ? "" : it->second;
}

// ---- the weights' digest ----------------------------------------------------------------------

struct WeightsDigest::Impl {
  std::map<std::string, TensorEntry> tensors;
};

WeightsDigest::WeightsDigest() : impl_(std::make_unique<Impl>()) {}
WeightsDigest::~WeightsDigest() = default;
WeightsDigest::WeightsDigest(WeightsDigest&&) noexcept = default;
WeightsDigest& WeightsDigest::operator=(WeightsDigest&&) noexcept = default;

void WeightsDigest::add(const std::string& name, const std::string& dtype,
                        const std::vector<std::int64_t>& shape, const void* data,
                        std::uint64_t bytes, int threads) {
  if (impl_->tensors.count(name) != 0) {
    throw invalid("the weights' digest has a tensor " + printable(name, 200) + " already");
  }
  add_digest(name, dtype, shape, bytes_digest(data, bytes, threads));
}

void WeightsDigest::add_digest(const std::string& name, const std::string& dtype,
                               const std::vector<std::int64_t>& shape,
                               const std::string& bytes_digest) {
  if (!impl_->tensors.emplace(name, TensorEntry{dtype, shape, bytes_digest}).second) {
    throw invalid("the weights' digest has a tensor " + printable(name, 200) + " already");
  }
}

std::size_t WeightsDigest::size() const {
  return impl_->tensors.size();
}

std::string WeightsDigest::hex() const {
  // name NUL dtype NUL ndim dims... bytes-digest, for each tensor in the order of names.
  std::string all;
  for (const auto& [name, t] : impl_->tensors) {
    all += name;
    all += '\0';
    all += t.dtype;
    all += '\0';
    const auto ndim = static_cast<std::uint32_t>(t.shape.size());
    all.append(reinterpret_cast<const char*>(&ndim), sizeof ndim);
    for (const std::int64_t d : t.shape) all.append(reinterpret_cast<const char*>(&d), sizeof d);
    all += t.bytes_digest;
  }
  return kvo::hex(XXH3_128bits(all.data(), all.size()));
}

std::string WeightsDigest::bytes_digest(const void* data, std::uint64_t bytes, int threads) {
  return bytes_digests({{data, bytes}}, threads)[0];
}

std::vector<std::string> WeightsDigest::bytes_digests(
    const std::vector<ByteRange>& ranges, int threads,
    const std::function<void(std::uint64_t, std::uint64_t)>& progress) {
  // Every block of every range: (range, first byte), hashed in any order into its place.
  struct Block {
    std::size_t range;
    std::uint64_t begin;
  };
  std::vector<Block> blocks;
  std::vector<std::vector<XXH128_hash_t>> digests(ranges.size());
  std::uint64_t total = 0;
  for (std::size_t r = 0; r < ranges.size(); ++r) {
    const std::uint64_t n = ranges[r].bytes;
    digests[r].resize(static_cast<std::size_t>(n == 0 ? 0 : (n - 1) / kBlockBytes + 1));
    for (std::uint64_t begin = 0; begin < n; begin += kBlockBytes) blocks.push_back({r, begin});
    total += n;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<std::uint64_t> done{0};
  std::mutex progress_mutex;
  const auto work = [&](bool reports) {
    for (std::size_t i = next++; i < blocks.size(); i = next++) {
      const ByteRange& range = ranges[blocks[i].range];
      const std::uint64_t n = std::min(kBlockBytes, range.bytes - blocks[i].begin);
      digests[blocks[i].range][static_cast<std::size_t>(blocks[i].begin / kBlockBytes)] =
          XXH3_128bits(static_cast<const unsigned char*>(range.data) + blocks[i].begin,
                       static_cast<std::size_t>(n));
      done += n;
      if (reports && progress) {
        const std::lock_guard<std::mutex> lock(progress_mutex);
        progress(done.load(), total);
      }
    }
  };
  const auto want = static_cast<std::size_t>(threads > 0 ? threads : usable_cores());
  const std::size_t helpers = std::min(want, std::max<std::size_t>(blocks.size(), 1)) - 1;
  std::vector<std::thread> pool;
  for (std::size_t t = 0; t < helpers; ++t) pool.emplace_back(work, false);
  work(true);
  for (std::thread& t : pool) t.join();
  std::vector<std::string> out;
  out.reserve(ranges.size());
  for (std::size_t r = 0; r < ranges.size(); ++r)
    out.push_back(combine(digests[r], ranges[r].bytes));
  return out;
}

struct WeightsDigest::TensorBytes::Impl {
  std::vector<XXH128_hash_t> blocks;
  XXH3_state_t* state = XXH3_createState();
  std::uint64_t in_block = 0;
  std::uint64_t total = 0;
  Impl() { XXH3_128bits_reset(state); }
  ~Impl() { XXH3_freeState(state); }
};

WeightsDigest::TensorBytes::TensorBytes() : impl_(std::make_unique<Impl>()) {}
WeightsDigest::TensorBytes::~TensorBytes() = default;

void WeightsDigest::TensorBytes::update(const void* data, std::uint64_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  Impl& s = *impl_;
  while (bytes > 0) {
    const std::uint64_t n = std::min(bytes, kBlockBytes - s.in_block);
    XXH3_128bits_update(s.state, p, static_cast<std::size_t>(n));
    s.in_block += n;
    s.total += n;
    p += n;
    bytes -= n;
    if (s.in_block == kBlockBytes) {
      s.blocks.push_back(XXH3_128bits_digest(s.state));
      XXH3_128bits_reset(s.state);
      s.in_block = 0;
    }
  }
}

std::string WeightsDigest::TensorBytes::digest() const {
  std::vector<XXH128_hash_t> blocks = impl_->blocks;
  if (impl_->in_block > 0) blocks.push_back(XXH3_128bits_digest(impl_->state));
  return combine(blocks, impl_->total);
}

// ---- files ------------------------------------------------------------------------------------

std::string files_digest(const std::string& dir, const std::vector<std::string>& names) {
  std::string all;
  bool any = false;
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    if (::access(path.c_str(), F_OK) != 0) {
      all += name + " absent\n";
      continue;
    }
    any = true;
    const offload::InputFile file(path, kMaxDigestFileBytes);
    std::string digest;
    if (file.size() == 0) {
      digest = WeightsDigest::bytes_digest(nullptr, 0, 1);
    } else {
      void* map = ::mmap(nullptr, file.size(), PROT_READ, MAP_PRIVATE, file.fd(), 0);
      if (map == MAP_FAILED) {
        throw invalid("cannot map " + path + " to hash it: " + std::strerror(errno));
      }
      digest = WeightsDigest::bytes_digest(map, file.size());
      ::munmap(map, file.size());
    }
    all += name + " " + digest + "\n";
  }
  return any ? hex(XXH3_128bits(all.data(), all.size())) : "";
}

}  // namespace kvo
