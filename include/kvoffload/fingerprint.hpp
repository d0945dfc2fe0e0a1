// A model's fingerprint: what a saved context records of the model its rows were computed by, so
// that it is refused by any other. One format for every writer (kvo-generate, the Python drop-in,
// an engine on the C++ API), defined here:
//
//   kvoffload-fingerprint 2
//   config.<key>=<value>      every field of the model's config that shapes its keys, flattened
//                             ("config.rope_parameters.rope_theta=500000"), as the writer's config
//                             states it; fields that are off (false, null, empty) are left out
//   weights.xxh3=<hex>        WeightsDigest of the weights as loaded (or weights.seed=<n> for
//                             drawn weights, weights.gguf_xxh3=<hex> for a GGUF file)
//   tokenizer.xxh3=<hex>      files_digest of the tokenizer's files, where there is one
//   load.<option>=<value>     the load options that change the keys (weights format,
//                             activations)
//
// one "key=value" line each, sorted by key, numbers in one canonical form (fingerprint_number),
// so that two writers that state the same facts write the same bytes. A load compares field by
// field and names the first that differs with both values (fingerprint_difference).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/api.h"

namespace kvo {

// The first line of a fingerprint of this format.
inline constexpr char kFingerprintFormat[] = "kvoffload-fingerprint 2";

// A finite double in its canonical text: an integral value of magnitude below 2^53 as an integer
// ("500000", "-3", "0"), any other as the shortest decimal that reads back as the same double,
// laid out as Python's repr lays it out ("1e-05", "0.0001", "1.5e+16", "0.1"). A value from
// float32 is written as the double it converts to. Throws kvo::Error(kInvalidArgument) for a NaN
// or an infinity.
KVO_API std::string fingerprint_number(double value);

// A fingerprint being written. Keys are printable ASCII without '=' (the writer's names); values
// are one line of text, each escaped so that a newline or a backslash stays inside its line.
class KVO_API Fingerprint {
 public:
  // Sets `key` (replacing a value set before). Throws kvo::Error(kInvalidArgument) for an empty
  // key or one holding '=' or a byte outside printable ASCII.
  void set(const std::string& key, const std::string& value);
  void set_number(const std::string& key, double value);
  void set_integer(const std::string& key, std::int64_t value);
  void set_bool(const std::string& key, bool value);
  bool has(const std::string& key) const { return fields_.count(key) != 0; }
  // kFingerprintFormat, then the fields sorted by key, one line each.
  std::string text() const;

 private:
  std::map<std::string, std::string> fields_;
};

// Whether `text` is a fingerprint of this format (its first line is kFingerprintFormat).
KVO_API bool is_fingerprint(const std::string& text);

// The first field (by key) in which two fingerprints differ, as "<key> is <saved's value> in the
// file and <mine> here", a missing field's value being "absent"; "" when they are the same. Values
// are made printable and cut to 200 characters (a file may hold any bytes there).
// REQUIRES: is_fingerprint(saved) && is_fingerprint(mine).
KVO_API std::string fingerprint_difference(const std::string& saved, const std::string& mine);

// The value of `key` in a fingerprint, or "" when it has none.
KVO_API std::string fingerprint_field(const std::string& text, const std::string& key);

// The digest of a model's weights: XXH3-128 over its tensors in the order of their names, each
// contributing its name, its dtype's name, its shape and the digest of its bytes (the XXH3-128
// digests of each 64 MiB block in order, then the byte count: the same for any thread count and
// however the bytes were fed). Tensors may be added in any order. Not copyable; movable.
class KVO_API WeightsDigest {
 public:
  WeightsDigest();
  ~WeightsDigest();
  WeightsDigest(WeightsDigest&&) noexcept;
  WeightsDigest& operator=(WeightsDigest&&) noexcept;
  WeightsDigest(const WeightsDigest&) = delete;
  WeightsDigest& operator=(const WeightsDigest&) = delete;

  // A tensor whose bytes (in memory order, little-endian) lie at data; they are hashed on up to
  // `threads` threads (0: the cores this process may use). Throws kvo::Error(kInvalidArgument)
  // for a name added before.
  void add(const std::string& name, const std::string& dtype,
           const std::vector<std::int64_t>& shape, const void* data, std::uint64_t bytes,
           int threads = 0);
  // A tensor whose bytes' digest (bytes_digest, or a TensorBytes' digest()) is known already.
  void add_digest(const std::string& name, const std::string& dtype,
                  const std::vector<std::int64_t>& shape, const std::string& bytes_digest);
  std::size_t size() const;
  // 32 lowercase hex digits.
  std::string hex() const;

  // The digest of `bytes` bytes at data, as add() takes it.
  static std::string bytes_digest(const void* data, std::uint64_t bytes, int threads = 0);
  // The digests of several ranges at once, every 64 MiB block of every range on one pool of up
  // to `threads` threads (0: the cores this process may use), so that a checkpoint of many
  // tensors hashes at the speed of its memory; `progress(done, total)` is called with the bytes
  // hashed so far as blocks finish.
  struct ByteRange {
    const void* data = nullptr;
    std::uint64_t bytes = 0;
  };
  static std::vector<std::string> bytes_digests(
      const std::vector<ByteRange>& ranges, int threads = 0,
      const std::function<void(std::uint64_t, std::uint64_t)>& progress = {});

  // The same digest of bytes fed in pieces of any size (a tensor copied from a device a piece at
  // a time): the pieces in order give the digest of their concatenation.
  class KVO_API TensorBytes {
   public:
    TensorBytes();
    ~TensorBytes();
    TensorBytes(const TensorBytes&) = delete;
    TensorBytes& operator=(const TensorBytes&) = delete;
    void update(const void* data, std::uint64_t bytes);
    std::string digest() const;

   private:
    struct Impl;
    std::unique_ptr<Impl> impl_;
  };

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The files a tokenizer is made of, beside a Hugging Face checkpoint.
inline constexpr const char* kTokenizerFiles[] = {"tokenizer.json", "tokenizer.model",
                                                  "tokenizer_config.json", "chat_template.jinja"};

// XXH3-128 (32 hex digits) over the named files of `dir`, each contributing its name and its
// bytes' digest (bytes_digest), an absent one counted as absent; "" when every one is absent.
// Only regular files are read. Throws kvo::Error(kInvalidArgument) naming a file that exists and
// cannot be read.
KVO_API std::string files_digest(const std::string& dir, const std::vector<std::string>& names);

}  // namespace kvo
