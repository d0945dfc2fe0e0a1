#include "model/checkpoint/mapped_file.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "kvoffload/error.hpp"
#include "offload/util/input_file.hpp"

namespace kvo::model {

MappedFile::MappedFile(const std::string& path, std::uint64_t max_bytes, std::uint64_t min_bytes,
                       const std::string& format) {
  const offload::InputFile file(path, max_bytes);
  size_ = static_cast<std::size_t>(file.size());
  if (size_ < min_bytes) {
    throw Error(ErrorCode::kInvalidArgument, path + ": a truncated " + format + " file (" +
                                                 std::to_string(size_) + " bytes, less than " +
                                                 std::to_string(min_bytes) + ")");
  }
  mapping_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, file.fd(), 0);
  const int map_errno = errno;
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw Error(ErrorCode::kInvalidArgument,
                "cannot map " + path + ": " + std::strerror(map_errno));
  }
}

MappedFile::~MappedFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

}  // namespace kvo::model
