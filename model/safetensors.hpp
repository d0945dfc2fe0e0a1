// Hugging Face's safetensors files, memory-mapped: an 8-byte little-endian header length, a JSON
// header {name: {dtype, shape, data_offsets: [begin, end)}}, then the data. A checkpoint is one
// model.safetensors or several shards listed by model.safetensors.index.json.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/types.hpp"

namespace kvo::model {

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::string dtype_text;        // as the header spells it ("BF16", "I64", ...)
  bool dtype_supported = false;  // F32, F16 or BF16; others are only an error when asked for
  std::vector<std::int64_t> shape;
  const std::byte* data = nullptr;  // inside the mapping
  std::size_t bytes = 0;
  std::string file;  // for messages
};

// One mapped file. Every tensor's offsets and size are checked against the file when it is
// opened: a truncated file or a header that lies is an error naming the tensor.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* mapping_ = nullptr;
  std::size_t size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
};

// All tensors of a checkpoint directory.
class Checkpoint {
 public:
  // Opens dir/model.safetensors.index.json and its shards, or else dir/model.safetensors.
  explicit Checkpoint(const std::string& dir);
  // Throws kvo::Error(kInvalidArgument) naming the tensor and the checkpoint when it is absent.
  const TensorInfo& tensor(const std::string& name) const;
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }

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

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace kvo::model
