#include "offload/context/context_file.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "kvoffload/error.hpp"
#include "kvoffload/fingerprint.hpp"
#include "kvoffload/plan.hpp"
#include "offload/util/checked_math.hpp"
#include "offload/util/element_types.hpp"
#include "offload/util/printable.hpp"
#include "offload/util/stream_copy.hpp"

// xxHash from its header alone (Debian libxxhash-dev): nothing to link, here or for consumers of
// the installed library.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kvo::offload {

#if defined(KVO_HASH_AVX2)
void xxh3_update_avx2(void* state, const void* data, std::size_t bytes);  // context_hash_avx2.cpp
#endif

namespace {

constexpr char kMagic[8] = {'K', 'V', 'O', 'C', 'T', 'X', '\r', '\n'};
constexpr std::uint32_t kVersion = 1;        // V rows the size of K rows
constexpr std::uint32_t kVersionVSized = 2;  // and v_head_dim after the fixed header
// magic, version, layers, kv_heads, head_dim, max_seq, dtype, length, row_bytes, model_bytes,
// token_count
constexpr std::size_t kFixedHeaderBytes = 8 + 4 * 7 + 8 + 4 + 4;
// A fingerprint is a few hundred lines; anything far larger is a corrupted size field.
constexpr std::uint32_t kMaxModelBytes = 16u << 20;
// Rows move in pieces of this size, so that hashing and device copies need no large buffer.
constexpr std::size_t kChunkBytes = 8u << 20;

Error bad_file(const std::string& what, const std::string& why) {
  return Error(ErrorCode::kInvalidArgument, what + ": " + why);
}

void put_u32(std::string& out, std::uint32_t value) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
void put_u64(std::string& out, std::uint64_t value) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}
std::uint32_t get_u32(const unsigned char* p) {
  std::uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= static_cast<std::uint32_t>(p[i]) << (8 * i);
  return value;
}
std::uint64_t get_u64(const unsigned char* p) {
  std::uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<std::uint64_t>(p[i]) << (8 * i);
  return value;
}

// The widest XXH3 update this CPU runs (the same hashes either way).
using UpdateFn = void (*)(void* state, const void* data, std::size_t bytes);
void xxh3_update_sse2(void* state, const void* data, std::size_t bytes) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, bytes);
}
UpdateFn xxh3_update() {
#if defined(KVO_HASH_AVX2)
  static const UpdateFn update =
      __builtin_cpu_supports("avx2") ? xxh3_update_avx2 : xxh3_update_sse2;
  return update;
#else
  return xxh3_update_sse2;
#endif
}

// A streaming XXH3-64 state.
class Hash {
 public:
  Hash() : state_(XXH3_createState()), update_(xxh3_update()) {
    if (state_ == nullptr) throw std::bad_alloc();
    XXH3_64bits_reset(state_);
  }
  ~Hash() { XXH3_freeState(state_); }
  Hash(const Hash&) = delete;
  Hash& operator=(const Hash&) = delete;
  void update(const void* data, std::size_t bytes) { update_(state_, data, bytes); }
  std::uint64_t digest() const { return XXH3_64bits_digest(state_); }

 private:
  XXH3_state_t* state_;
  UpdateFn update_;
};

int dtype_code(DType dtype) {
  return traits(dtype).file_code;  // tied to DType and kvo_dtype by element_types.hpp
}

std::string layer_name(int layer, int layers) {
  return "layer " + std::to_string(layer) + " of " + std::to_string(layers);
}

int v_head_dim(const ContextShape& s) {
  return s.v_head_dim > 0 ? s.v_head_dim : s.head_dim;
}

// One layer's rows in a record: K's bytes, then V's.
struct BlockBytes {
  std::uint64_t k = 0;
  std::uint64_t v = 0;
  std::uint64_t of(int kv) const { return kv == 0 ? k : v; }
  std::uint64_t at(int kv) const { return kv == 0 ? 0 : k; }  // where kv's rows start
  std::uint64_t rows() const { return k + v; }
  // Where kv's rows of a layer start in a record's rows staged as the file holds them.
  std::size_t staged(int layer, int kv) const {
    return static_cast<std::size_t>(static_cast<std::uint64_t>(layer) * rows() + at(kv));
  }
};

BlockBytes block_bytes(const ContextHeader& header) {
  const ContextShape& s = header.shape;
  const auto length = static_cast<std::uint64_t>(header.length);
  BlockBytes b;
  b.k = checked_mul(length, s.row_bytes, "context rows");
  b.v = checked_mul(length, s.v_row_bytes > 0 ? s.v_row_bytes : s.row_bytes, "context rows");
  checked_add(b.k, b.v, "context rows");
  return b;
}

bool v_sized(const ContextShape& s) {
  return v_head_dim(s) != s.head_dim;
}

}  // namespace

void skip_context_rows(ByteSource& source, const ContextHeader& header, const std::string& what) {
  const std::uint64_t block = checked_add(block_bytes(header).rows(), 8, "context");
  // Block by block, so that a truncation names its layer as a read would.
  for (int layer = 0; layer < header.shape.layers; ++layer) {
    if (!source.skip(block)) {
      throw bad_file(what, "truncated in the block of " + layer_name(layer, header.shape.layers) +
                               "; the cache was left as it was");
    }
  }
}

std::uint64_t context_record_bytes(const ContextHeader& header) {
  const std::uint64_t head = kFixedHeaderBytes + (v_sized(header.shape) ? 4 : 0) +
                             header.model.size() + 4 * header.tokens.size() + 8;
  const std::uint64_t block = checked_add(block_bytes(header).rows(), 8, "context block");
  return checked_add(head,
                     checked_mul(static_cast<std::uint64_t>(header.shape.layers), block, "context"),
                     "context");
}

void write_context(ByteSink& sink, const ContextHeader& header, SlotRows& rows) {
  const ContextShape& s = header.shape;
  std::string head(kMagic, sizeof(kMagic));
  put_u32(head, v_sized(s) ? kVersionVSized : kVersion);
  for (int value :
       {s.layers, s.kv_heads, s.head_dim, s.max_seq, dtype_code(s.dtype), header.length}) {
    put_u32(head, static_cast<std::uint32_t>(value));
  }
  put_u64(head, s.row_bytes);
  put_u32(head, static_cast<std::uint32_t>(header.model.size()));
  put_u32(head, static_cast<std::uint32_t>(header.tokens.size()));
  if (v_sized(s)) put_u32(head, static_cast<std::uint32_t>(v_head_dim(s)));
  head += header.model;
  for (std::int32_t id : header.tokens) put_u32(head, static_cast<std::uint32_t>(id));
  put_u64(head, XXH3_64bits(head.data(), head.size()));
  sink.write(head.data(), head.size());

  const BlockBytes b = block_bytes(header);
  std::unique_ptr<std::byte[]> bounce;
  for (int layer = 0; layer < s.layers; ++layer) {
    Hash hash;
    for (int kv = 0; kv < 2; ++kv) {
      const std::uint64_t bytes = b.of(kv);
      if (const std::byte* host = rows.host_rows(layer, kv)) {
        hash.update(host, bytes);
        sink.write(host, bytes);
        continue;
      }
      if (!bounce) bounce = std::make_unique<std::byte[]>(kChunkBytes);
      for (std::uint64_t offset = 0; offset < bytes; offset += kChunkBytes) {
        const std::size_t piece =
            static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBytes, bytes - offset));
        rows.copy_from_device(layer, kv, offset, piece, bounce.get());
        hash.update(bounce.get(), piece);
        sink.write(bounce.get(), piece);
      }
    }
    std::string sum;
    put_u64(sum, hash.digest());
    sink.write(sum.data(), sum.size());
  }
}

ContextHeader read_context_header(ByteSource& source, const std::string& what) {
  unsigned char fixed[kFixedHeaderBytes];
  const std::size_t got = read_fully(source, fixed, sizeof(fixed));
  if (got < sizeof(kMagic) || std::memcmp(fixed, kMagic, sizeof(kMagic)) != 0) {
    throw bad_file(what, got == 0 ? "empty: no saved context in it"
                                  : "not a saved context (no KVOCTX header)");
  }
  if (got < sizeof(fixed)) throw bad_file(what, "truncated inside the header");
  const std::uint32_t version = get_u32(fixed + 8);
  if (version != kVersion && version != kVersionVSized) {
    throw bad_file(what, "a saved context of format version " + std::to_string(version) +
                             "; this library reads versions " + std::to_string(kVersion) + " and " +
                             std::to_string(kVersionVSized));
  }
  const unsigned char* p = fixed + 12;
  ContextHeader header;
  ContextShape& s = header.shape;
  std::uint32_t fields[6];
  for (std::uint32_t& field : fields) {
    field = get_u32(p);
    p += 4;
  }
  s.row_bytes = get_u64(p);
  const std::uint32_t model_bytes = get_u32(p + 8);
  const std::uint32_t token_count = get_u32(p + 12);
  const std::string corrupted = "the header is corrupted";
  if (model_bytes > kMaxModelBytes) {
    throw bad_file(
        what, corrupted + " (a model fingerprint of " + std::to_string(model_bytes) + " bytes)");
  }
  if (token_count != 0 && token_count != fields[5]) {
    throw bad_file(what, corrupted + " (" + std::to_string(token_count) + " token ids for " +
                             std::to_string(fields[5]) + " rows)");
  }

  Hash hash;
  hash.update(fixed, sizeof(fixed));
  std::uint32_t v_dim = 0;  // version 1: V rows are K's size
  if (version == kVersionVSized) {
    unsigned char extra[4];
    if (read_fully(source, extra, sizeof(extra)) < sizeof(extra)) {
      throw bad_file(what, "truncated inside the header");
    }
    hash.update(extra, sizeof(extra));
    v_dim = get_u32(extra);
  }
  header.model.resize(model_bytes);
  if (read_fully(source, header.model.data(), model_bytes) < model_bytes) {
    throw bad_file(what, "truncated inside the header (model fingerprint)");
  }
  hash.update(header.model.data(), model_bytes);
  // Token ids arrive in pieces, so that a wrong count in a short input fails as truncated
  // instead of allocating for it first.
  std::vector<unsigned char> piece;
  for (std::uint32_t done = 0; done < token_count;) {
    const std::uint32_t n = std::min<std::uint32_t>(token_count - done, 1u << 16);
    piece.resize(4 * static_cast<std::size_t>(n));
    if (read_fully(source, piece.data(), piece.size()) < piece.size()) {
      throw bad_file(what, "truncated inside the header (token ids)");
    }
    hash.update(piece.data(), piece.size());
    for (std::uint32_t i = 0; i < n; ++i) {
      header.tokens.push_back(static_cast<std::int32_t>(get_u32(piece.data() + 4 * i)));
    }
    done += n;
  }
  unsigned char sum[8];
  if (read_fully(source, sum, sizeof(sum)) < sizeof(sum)) {
    throw bad_file(what, "truncated inside the header (checksum)");
  }
  if (get_u64(sum) != hash.digest()) {
    throw bad_file(what, corrupted + " (checksum mismatch)");
  }

  // The checksum held, so these are the values that were written; check they make sense.
  const std::uint32_t max_int = 0x7fffffff;
  for (std::uint32_t field : fields) {
    if (field > max_int) throw bad_file(what, corrupted + " (a field out of range)");
  }
  s.layers = static_cast<int>(fields[0]);
  s.kv_heads = static_cast<int>(fields[1]);
  s.head_dim = static_cast<int>(fields[2]);
  s.max_seq = static_cast<int>(fields[3]);
  if (!dtype_of_file_code(static_cast<int>(fields[4]), &s.dtype)) {
    throw bad_file(what, corrupted + " (an unknown K/V dtype)");
  }
  header.length = static_cast<int>(fields[5]);
  if (header.length > s.max_seq) {
    throw bad_file(what, corrupted + " (" + std::to_string(header.length) + " rows for max_seq " +
                             std::to_string(s.max_seq) + ")");
  }
  if (s.kv_heads == 0 || s.head_dim == 0 ||
      s.row_bytes != kv_row_bytes(s.dtype, s.kv_heads, s.head_dim)) {
    throw bad_file(what, corrupted + " (row size does not match the shape)");
  }
  if (version == kVersionVSized) {
    // Version 2 is written only for V rows of their own size.
    if (v_dim == 0 || v_dim > max_int || static_cast<int>(v_dim) == s.head_dim) {
      throw bad_file(what, corrupted + " (v_head_dim)");
    }
    s.v_head_dim = static_cast<int>(v_dim);
    s.v_row_bytes = kv_row_bytes(s.dtype, s.kv_heads, s.v_head_dim);
  }
  return header;
}

namespace {

constexpr char kShardKey[] = "kv_heads_held=";

// The heads a model text's shard line names ("all" without one).
std::string held_heads(const std::string& model) {
  if (model.rfind(kShardKey, 0) != 0) return "all of its KV heads";
  const std::size_t end = model.find('\n');
  const std::string value = model.substr(sizeof(kShardKey) - 1, end - (sizeof(kShardKey) - 1));
  return "KV heads " + printable(value, 100);
}

}  // namespace

std::string shard_line(int kv_head_begin, int kv_heads, int model_kv_heads) {
  if (model_kv_heads <= 0 || (kv_head_begin == 0 && kv_heads == model_kv_heads)) return "";
  return std::string(kShardKey) + "[" + std::to_string(kv_head_begin) + ", " +
         std::to_string(kv_head_begin + kv_heads) + ") of " + std::to_string(model_kv_heads) + "\n";
}

void check_context_fits(const ContextHeader& file, const ContextShape& shape,
                        const std::string& model, const std::string& what) {
  const ContextShape& f = file.shape;
  auto refuse = [&](const std::string& field, const std::string& in_file, const std::string& here) {
    throw bad_file(what, "saved from a cache with " + field + " " + in_file + ", this one has " +
                             field + " " + here + "; nothing was loaded");
  };
  if (f.layers != shape.layers) {
    refuse("layers", std::to_string(f.layers), std::to_string(shape.layers));
  }
  // A tensor-parallel rank's heads first: the file of another rank or world size has the same
  // shape, or another kv_heads, and either way this says why.
  const std::string file_heads = held_heads(file.model);
  const std::string heads = held_heads(model);
  if (file_heads != heads) {
    throw bad_file(what, "saved by a cache holding " + file_heads + ", this one holds " + heads +
                             " (a tensor-parallel rank restores only its own heads' file); "
                             "nothing was loaded");
  }
  if (f.kv_heads != shape.kv_heads) {
    refuse("kv_heads", std::to_string(f.kv_heads), std::to_string(shape.kv_heads));
  }
  if (f.head_dim != shape.head_dim) {
    refuse("head_dim", std::to_string(f.head_dim), std::to_string(shape.head_dim));
  }
  if (v_head_dim(f) != v_head_dim(shape)) {
    refuse("v_head_dim", std::to_string(v_head_dim(f)), std::to_string(v_head_dim(shape)));
  }
  if (f.dtype != shape.dtype) refuse("K/V dtype", dtype_name(f.dtype), dtype_name(shape.dtype));
  if (f.max_seq != shape.max_seq) {
    refuse("max_seq", std::to_string(f.max_seq), std::to_string(shape.max_seq));
  }
  if (file.model == model) return;
  // Past the shard line (equal, checked above), the writers' fingerprints.
  const auto body = [](const std::string& text) {
    return text.rfind(kShardKey, 0) == 0 && text.find('\n') != std::string::npos
               ? text.substr(text.find('\n') + 1)
               : text;
  };
  const std::string saved = body(file.model);
  const std::string mine = body(model);
  if (is_fingerprint(mine)) {
    if (!is_fingerprint(saved)) {
      throw bad_file(what,
                     "saved with a fingerprint that predates the full model fingerprint (" +
                         std::string(kFingerprintFormat) +
                         "): it cannot be checked against this model's config, weights and load "
                         "options; prefill the context again to save it anew; nothing was loaded");
    }
    throw bad_file(what, "saved for another model: " + fingerprint_difference(saved, mine) +
                             "; nothing was loaded");
  }
  // A caller's own fingerprint: name the first line that differs.
  auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    std::size_t start = 0;
    while (start < text.size()) {
      std::size_t end = text.find('\n', start);
      if (end == std::string::npos) end = text.size();
      out.push_back(text.substr(start, end - start));
      start = end + 1;
    }
    return out;
  };
  const std::vector<std::string> a = lines(file.model);
  const std::vector<std::string> b = lines(model);
  std::size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  // The file's line is escaped: a crafted file may hold any bytes there.
  const std::string in_file = i < a.size() ? "'" + printable(a[i], 200) + "'" : "nothing more";
  const std::string here = i < b.size() ? "'" + printable(b[i], 200) + "'" : "nothing more";
  throw bad_file(what, "saved for another model: its fingerprint has " + in_file +
                           " where this model's has " + here + "; nothing was loaded");
}

namespace {

// Pieces a reader thread hashes and copies: small enough to stay in its core's cache between the
// two.
constexpr std::size_t kCachedBytes = 256u << 10;

// Threads that read a record's layer blocks at once from a file: copying out of the page cache
// and hashing scale with cores (one core reaches about 0.4 of a sequential read into a small
// buffer; the rows' destination is a gigabyte, not a cache line).
int reader_threads(int layers) {
  const unsigned cores = std::thread::hardware_concurrency();
  return std::max(1, std::min({layers, cores == 0 ? 1 : static_cast<int>(cores), 4}));
}

// The blocks of every layer, read at their offsets by several threads into host memory
// (dst[2 * layer + kv]), each checked against its checksum; then the source stands past them.
// Errors as read_context_rows's, for the first failing layer. A source that maps its bytes (a
// file) is copied from the mapping, each piece hashed and then copied with streaming stores: on
// the 2-core development machine that restored at 0.82 of a sequential read where pread, which
// copies through the cache, reached 0.70 (medians of 7 alternating runs,
// bench/results/context-restore-host.json). Other sources, a file shorter than the blocks, and
// every file opened with ContextReading::kPread are read with read_ahead.
void read_blocks_in_parallel(ByteSource& source, const std::vector<std::byte*>& dst, int layers,
                             const BlockBytes& b, const std::string& what) {
  const std::uint64_t block = b.rows() + 8;
  enum class Problem : unsigned char { kNone, kTruncated, kCorrupted };
  std::vector<Problem> problems(static_cast<std::size_t>(layers), Problem::kNone);
  std::atomic<int> next{0};
  std::mutex failed;
  std::exception_ptr error;
  const std::uint64_t all = checked_mul(block, static_cast<std::uint64_t>(layers), "context");
  const std::byte* mapped = source.map_ahead(0, all);
  const bool from_mapping = mapped != nullptr;
  const CopyFn copy = copy_streaming();
  // One layer's block, piece by piece: from the mapping, hashed there and then copied around the
  // cache; or read with read_ahead into the rows and hashed there.
  auto load_layer = [&](int layer) {
    const std::uint64_t at = static_cast<std::uint64_t>(layer) * block;
    Hash hash;
    for (int kv = 0; kv < 2; ++kv) {
      std::byte* rows = dst[2 * static_cast<std::size_t>(layer) + kv];
      const std::uint64_t bytes = b.of(kv);
      for (std::uint64_t offset = 0; offset < bytes; offset += kCachedBytes) {
        const std::size_t piece =
            static_cast<std::size_t>(std::min<std::uint64_t>(kCachedBytes, bytes - offset));
        const std::uint64_t from = at + b.at(kv) + offset;
        if (from_mapping) {
          hash.update(mapped + from, piece);
          copy(rows + offset, mapped + from, piece);
        } else if (source.read_ahead(rows + offset, piece, from) == piece) {
          hash.update(rows + offset, piece);
        } else {
          return Problem::kTruncated;
        }
      }
    }
    unsigned char sum[8];
    if (from_mapping) {
      std::memcpy(sum, mapped + at + b.rows(), sizeof(sum));
    } else if (source.read_ahead(sum, sizeof(sum), at + b.rows()) < sizeof(sum)) {
      return Problem::kTruncated;
    }
    return get_u64(sum) != hash.digest() ? Problem::kCorrupted : Problem::kNone;
  };
  auto work = [&] {
    try {
      for (int layer = next++; layer < layers; layer = next++) {
        problems[static_cast<std::size_t>(layer)] = load_layer(layer);
      }
    } catch (...) {
      const std::lock_guard<std::mutex> lock(failed);
      if (!error) error = std::current_exception();
      next = layers;
    }
    fence_streaming_stores();
  };
  std::vector<std::thread> helpers;
  for (int t = 1; t < reader_threads(layers); ++t) helpers.emplace_back(work);
  work();
  for (std::thread& helper : helpers) helper.join();
  if (error) std::rethrow_exception(error);
  for (int layer = 0; layer < layers; ++layer) {
    switch (problems[static_cast<std::size_t>(layer)]) {
      case Problem::kNone:
        break;
      case Problem::kTruncated:
        throw bad_file(what, "truncated in the block of " + layer_name(layer, layers) +
                                 "; the cache was left as it was");
      case Problem::kCorrupted:
        throw bad_file(what, "the block of " + layer_name(layer, layers) +
                                 " is corrupted (checksum mismatch); the cache was left as it was");
    }
  }
  if (!source.skip(all)) {
    throw bad_file(what, "truncated in the layer blocks; the cache was left as it was");
  }
}

}  // namespace

void read_context_rows(ByteSource& source, const ContextHeader& header, SlotRows& rows,
                       std::vector<std::byte>* staged, const std::string& what) {
  const int layers = header.shape.layers;
  const BlockBytes b = block_bytes(header);
  if (staged != nullptr) {
    staged->resize(static_cast<std::size_t>(
        checked_mul(static_cast<std::uint64_t>(layers), b.rows(), "staged context")));
  }
  auto staged_rows = [&](int layer, int kv) { return staged->data() + b.staged(layer, kv); };
  // Where each block's rows go; all of them in host memory and a file to read from: in
  // parallel.
  std::vector<std::byte*> dst;
  for (int layer = 0; layer < layers && b.rows() > 0; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      dst.push_back(staged != nullptr ? staged_rows(layer, kv) : rows.host_rows(layer, kv));
    }
  }
  if (source.positional() && !dst.empty() &&
      std::find(dst.begin(), dst.end(), nullptr) == dst.end()) {
    read_blocks_in_parallel(source, dst, layers, b, what);
    return;
  }
  std::unique_ptr<std::byte[]> bounce;
  for (int layer = 0; layer < layers; ++layer) {
    auto truncated = [&] {
      return bad_file(what, "truncated in the block of " + layer_name(layer, layers) +
                                "; the cache was left as it was");
    };
    Hash hash;
    for (int kv = 0; kv < 2; ++kv) {
      const std::uint64_t bytes = b.of(kv);
      std::byte* host = staged != nullptr ? staged_rows(layer, kv) : rows.host_rows(layer, kv);
      if (host != nullptr) {
        for (std::uint64_t offset = 0; offset < bytes; offset += kChunkBytes) {
          const std::size_t piece =
              static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBytes, bytes - offset));
          if (read_fully(source, host + offset, piece) < piece) throw truncated();
          hash.update(host + offset, piece);
        }
        continue;
      }
      // A device layer of an empty slot: rows go up as they arrive; a later refusal leaves
      // the slot empty, so nobody sees them.
      if (!bounce) bounce = std::make_unique<std::byte[]>(kChunkBytes);
      for (std::uint64_t offset = 0; offset < bytes; offset += kChunkBytes) {
        const std::size_t piece =
            static_cast<std::size_t>(std::min<std::uint64_t>(kChunkBytes, bytes - offset));
        if (read_fully(source, bounce.get(), piece) < piece) throw truncated();
        hash.update(bounce.get(), piece);
        rows.copy_to_device(layer, kv, offset, piece, bounce.get());
      }
    }
    unsigned char sum[8];
    if (read_fully(source, sum, sizeof(sum)) < sizeof(sum)) throw truncated();
    if (get_u64(sum) != hash.digest()) {
      throw bad_file(what, "the block of " + layer_name(layer, layers) +
                               " is corrupted (checksum mismatch); the cache was left as it was");
    }
  }
}

void commit_staged_rows(const ContextHeader& header, SlotRows& rows,
                        const std::vector<std::byte>& staged) {
  const BlockBytes b = block_bytes(header);
  for (int layer = 0; layer < header.shape.layers; ++layer) {
    for (int kv = 0; kv < 2; ++kv) {
      const std::uint64_t bytes = b.of(kv);
      const std::byte* src = staged.data() + b.staged(layer, kv);
      if (std::byte* host = rows.host_rows(layer, kv)) {
        std::memcpy(host, src, bytes);
      } else if (bytes > 0) {
        rows.copy_to_device(layer, kv, 0, bytes, src);
      }
    }
  }
}

}  // namespace kvo::offload
