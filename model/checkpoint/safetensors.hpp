// Hugging Face's safetensors files, memory-mapped: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {...}}, then the
// data. A checkpoint is one model.safetensors or several shards listed by
// model.safetensors.index.json.
//
// Read strictly to the format's specification, so that a file that lies is refused when it is
// opened, naming the tensor: offsets are integers, the tensors tile the data section exactly (no
// overlap, no hole, nothing after the last one), no name appears twice, a shape's byte count is
// computed without overflow and must equal its offsets' range, and only regular files are read.
// An index may only name files inside the model directory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/types.hpp"
#include "model/checkpoint/mapped_file.hpp"

namespace kvo::model {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::string dtype_text;        // as the header spells it ("BF16", "I64", ...)
  bool dtype_supported = false;  // F32, F16 or BF16; others are only an error when asked for
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;  // inside the file's bytes
  std::size_t bytes = 0;
  std::string file;  // for messages
};

// The largest file this reader maps (1 TiB: a 400B model in bf16 is 0.8 TiB, in shards).
inline constexpr std::uint64_t kMaxSafetensorsFileBytes = std::uint64_t{1} << 40;

// The largest model.safetensors.index.json read.
inline constexpr std::uint64_t kMaxSafetensorsIndexBytes = std::uint64_t{64} << 20;

// The largest header the format allows (as its reference implementation does).
inline constexpr std::uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// The tensor table of a whole safetensors file held in memory: `file` [size] is the length, the
// header and the data. Throws kvo::Error(kInvalidArgument) naming `path` and the tensor.
std::map<std::string, TensorInfo> parse_safetensors(const std::byte* file, std::size_t size,
                                                    const std::string& path);

// model.safetensors.index.json: which shard holds each tensor.
struct ShardIndex {
  std::map<std::string, std::string> shard_of;  // tensor name -> shard file name
  std::vector<std::string> shards;              // each shard once, in the order first named
};

// Throws kvo::Error(kInvalidArgument) for malformed JSON, a repeated tensor, a missing
// "weight_map", or a shard that is not a plain file name (no directory part, not "." or "..").
ShardIndex parse_safetensors_index(const std::string& text, const std::string& path);

// One mapped file, checked by parse_safetensors when it is opened.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  MappedFile file_;
  std::map<std::string, TensorInfo> tensors_;
};

// All tensors of a checkpoint directory. Opening maps the files and reads their headers; no
// tensor data is touched.
class Checkpoint {
 public:
  // Opens dir/model.safetensors.index.json and its shards, or else dir/model.safetensors.
  // Throws kvo::Error(kInvalidArgument) for a malformed file, a tensor held by two shards, or an
  // index entry whose shard lacks the tensor.
  explicit Checkpoint(const std::string& dir);
  // Throws kvo::Error(kInvalidArgument) naming the tensor and the checkpoint when it is absent.
  const TensorInfo& tensor(const std::string& name) const;
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const std::map<std::string, const TensorInfo*>& tensors() const { return tensors_; }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorInfo*> tensors_;
};

// A tensor to write: `data` holds shape's product elements of dtype.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::vector<std::byte> data;
};

// The header of a tensor whose bytes are written later, in pieces.
struct TensorHeader {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<std::int64_t> shape;
  std::uint64_t bytes() const;
};

// Writes a safetensors file in one pass: the header first, then each tensor's bytes in the
// order given, in any number of pieces, so no tensor needs to be whole in memory.
class SafetensorsWriter {
 public:
  // Opens (truncates) `path` and writes the header. Throws kvo::Error naming the path.
  SafetensorsWriter(const std::string& path, std::vector<TensorHeader> tensors);
  // Appends the next bytes of the data section. Throws when they pass the declared total.
  void write(const void* bytes, std::size_t size);
  // Checks that every declared byte was written and flushes. Throws kvo::Error otherwise.
  void finish();
  std::uint64_t data_bytes() const { return total_; }

 private:
  std::string path_;
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> out_;
  std::uint64_t total_ = 0;
  std::uint64_t written_ = 0;
};

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace kvo::model
