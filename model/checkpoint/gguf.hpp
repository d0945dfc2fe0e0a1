// GGUF files (the single-file format of llama.cpp's models), version 3, little-endian,
// memory-mapped: a header (magic "GGUF", version, tensor count, metadata count), the metadata
// (typed key-value pairs: the architecture and its hyperparameters, the tokenizer), the tensor
// table (name, dimensions, ggml block type, offset), padding to the file's alignment, then the
// tensors' data.
//
// Read strictly, so that a file that lies is refused when it is opened, naming the file and the
// field: every count is bounded by the bytes left before anything is allocated for it (a tensor
// count of 2^40 in a small file is refused as such, not attempted), every string lies inside the
// file, the alignment is a power of two, every tensor's offset is aligned, its bytes (computed
// without overflow from its dimensions and its type's block) lie inside the data section and
// overlap no other tensor's, no key or tensor name appears twice, and only regular files are
// read. Types this reader does not know, nested arrays and big-endian files are refused by name.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint/mapped_file.hpp"

namespace kvo::model {

// A metadata value's type, as the file numbers them.
enum class GgufValueType : std::uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
const char* gguf_value_type_name(GgufValueType type);

// One metadata value: a scalar (its integer or floating value; a bool is 0 or 1), a string, or an
// array of one scalar or string type (arrays of arrays are refused).
struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  GgufValueType element = GgufValueType::kUint8;  // of an array
  bool is_integer = false;                        // an integer or bool (scalar or elements)
  std::int64_t integer = 0;                       // signed types, bools and unsigned below 2^63
  std::uint64_t unsigned_integer = 0;             // unsigned types, exactly
  double floating = 0;
  std::string text;
  std::vector<std::int64_t> integers;  // an integer or bool array
  std::vector<double> floats;          // a float array
  std::vector<std::string> strings;    // a string array
  std::uint64_t count = 0;             // an array's elements
};

// ggml's tensor types: the element or block each row is made of.
struct GgmlType {
  std::uint32_t id = 0;
  const char* name = "";
  std::uint32_t block = 1;        // elements a block holds
  std::uint32_t block_bytes = 0;  // bytes of one block
};
// The type numbered `id`, or nullptr for one this reader does not know.
const GgmlType* ggml_type(std::uint32_t id);

struct GgufTensor {
  std::string name;
  std::vector<std::int64_t> dims;  // ggml's order: dims[0] is a row's length (the fastest)
  const GgmlType* type = nullptr;
  std::uint64_t offset = 0;  // from the start of the data section
  std::uint64_t bytes = 0;
  const std::byte* data = nullptr;  // inside the file's bytes
  std::int64_t elements() const;
};

// The largest file this reader maps (1 TiB), and the longest metadata key the format allows.
inline constexpr std::uint64_t kMaxGgufFileBytes = std::uint64_t{1} << 40;
inline constexpr std::uint64_t kMaxGgufKeyBytes = 65535;
inline constexpr int kMaxGgufDims = 4;
inline constexpr std::uint32_t kDefaultGgufAlignment = 32;

// What a GGUF file holds, read from its bytes (`file` [size]: the whole file in memory).
struct GgufContents {
  std::uint32_t version = 0;
  std::uint32_t alignment = kDefaultGgufAlignment;
  std::uint64_t data_offset = 0;  // where the data section starts
  std::map<std::string, GgufValue> metadata;
  std::vector<GgufTensor> tensors;                  // in the file's order
  std::map<std::string, std::size_t> tensor_index;  // name -> index in tensors
};

// Whether a model given by `path` is a GGUF file: the tools and the decoder take a model as a
// directory (config.json, safetensors, tokenizer files) or as one GGUF file, and tell them apart by
// this (a regular file; whether it is a well-formed GGUF is for GgufFile to say).
bool is_gguf_model(const std::string& path);
// Whether `path` is a regular file that starts with GGUF's magic (where a regular file may also be
// a config.json, as the planner's model may be).
bool has_gguf_magic(const std::string& path);

// Throws kvo::Error(kInvalidArgument) "<path>: <field>: <problem>".
GgufContents parse_gguf(const std::byte* file, std::size_t size, const std::string& path);

// One mapped file, checked by parse_gguf when it is opened; typed access to its metadata with
// errors that name the file and the key.
class GgufFile {
 public:
  explicit GgufFile(const std::string& path);
  // A file's bytes the caller holds (and keeps alive as long as this), read as a file `name`.
  GgufFile(const std::byte* bytes, std::size_t size, const std::string& name);
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const GgufContents& contents() const { return contents_; }
  const std::string& path() const { return path_; }
  std::size_t size() const { return size_; }

  bool has(const std::string& key) const { return contents_.metadata.count(key) != 0; }
  // The value at `key`, which must exist and be of the kind asked for (any integer type for
  // integer(), any number for number()); throws naming the key and what it holds.
  const GgufValue& at(const std::string& key) const;
  std::int64_t integer(const std::string& key) const;
  double number(const std::string& key) const;
  const std::string& text(const std::string& key) const;
  const std::vector<std::string>& strings(const std::string& key) const;
  // The tensor named `name`; throws naming the file when there is none.
  const GgufTensor& tensor(const std::string& name) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;  // null for bytes the caller holds
  std::size_t size_ = 0;
  GgufContents contents_;
};

}  // namespace kvo::model
