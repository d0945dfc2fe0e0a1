// A regular file a user hands the model, mapped read-only whole (offload/util/input_file.hpp opens
// it: never blocking, never anything but a regular file, at most `max_bytes`). The checkpoint
// readers parse the mapping and keep it for the tensors' bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvo::model {

class MappedFile {
 public:
  // Throws kvo::Error(kInvalidArgument): what InputFile refuses; "<path>: a truncated <format>
  // file (N bytes, less than <min_bytes>)"; "cannot map <path>: ...".
  MappedFile(const std::string& path, std::uint64_t max_bytes, std::uint64_t min_bytes,
             const std::string& format);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return static_cast<const std::byte*>(mapping_); }
  std::size_t size() const { return size_; }

 private:
  void* mapping_ = nullptr;
  std::size_t size_ = 0;
};

}  // namespace kvo::model
