// Every file a user hands kvoffload is opened through here: once, without ever blocking, and only
// when it is a regular file of a bounded size.
//
// A path is opened non-blocking (a FIFO with no writer, or a device, would otherwise hang the
// open or the first read), then fstat'ed on that same descriptor: what is checked is what is
// read, with no window for the path to change in between. Anything but a regular file is
// refused, naming what it is ("a FIFO", "a character device", "a directory"), and so is a file
// larger than the bound its reader states. The descriptor is then made blocking again for the
// reads.
#pragma once

#include <cstdint>
#include <string>

namespace kvo::offload {

class InputFile {
 public:
  // Throws kvo::Error(kInvalidArgument) "<what> <path>: <problem>" ("cannot open it: ...", "holds
  // N bytes, more than the M such a file may hold"), or "<what> <path> is a FIFO, not a regular
  // file".
  // `what` names the input for a reader ("--prompt-file", "the tokenizer"); empty: just the path.
  InputFile(const std::string& path, std::uint64_t max_bytes, const std::string& what = "");
  ~InputFile();
  InputFile(InputFile&& other) noexcept;
  InputFile& operator=(InputFile&&) = delete;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  int fd() const { return fd_; }
  std::uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // The file's identity, for caches of what was computed from it.
  std::uint64_t device() const { return device_; }
  std::uint64_t inode() const { return inode_; }
  std::int64_t mtime_ns() const { return mtime_ns_; }
  // "<what> <path>" or "<path>", as the errors start.
  std::string name() const;

  // The whole file, from its first byte. Throws naming the path when a read fails or the file
  // grew past its bound while it was read.
  std::string read_all() const;

 private:
  std::string path_;
  std::string what_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  std::uint64_t max_bytes_ = 0;
  std::uint64_t device_ = 0;
  std::uint64_t inode_ = 0;
  std::int64_t mtime_ns_ = 0;
};

// InputFile(path, max_bytes, what).read_all().
std::string read_input_file(const std::string& path, std::uint64_t max_bytes,
                            const std::string& what = "");

// What a file-system object is, for messages: "a directory", "a FIFO", "a socket", ...
const char* file_kind(unsigned mode);

}  // namespace kvo::offload
