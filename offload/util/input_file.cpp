#include "offload/util/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kvoffload/error.hpp"
#include "offload/util/printable.hpp"

namespace kvo::offload {

const char* file_kind(unsigned mode) {
  switch (mode & S_IFMT) {
    case S_IFREG:
      return "a regular file";
    case S_IFDIR:
      return "a directory";
    case S_IFIFO:
      return "a FIFO";
    case S_IFCHR:
      return "a character device";
    case S_IFBLK:
      return "a block device";
    case S_IFSOCK:
      return "a socket";
    case S_IFLNK:
      return "a symbolic link";
    default:
      return "not a file";
  }
}

InputFile::InputFile(const std::string& path, std::uint64_t max_bytes, const std::string& what)
    : path_(path), what_(what), max_bytes_(max_bytes) {
  auto fail = [&](const std::string& problem) {
    return Error(ErrorCode::kInvalidArgument, name() + ": " + problem);
  };
  if (path.empty()) throw fail("an empty path");
  if (path.find('\0') != std::string::npos) throw fail("the path holds a NUL byte");
  // O_NONBLOCK: opening a FIFO without a writer returns at once instead of waiting for one.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (fd_ < 0) throw fail(std::string("cannot open it: ") + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int err = errno;
    ::close(fd_);
    throw fail(std::string("cannot stat it: ") + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd_);
    throw Error(ErrorCode::kInvalidArgument,
                name() + " is " + file_kind(st.st_mode) + ", not a regular file");
  }
  size_ = static_cast<std::uint64_t>(st.st_size);
  if (size_ > max_bytes) {
    ::close(fd_);
    throw fail("holds " + std::to_string(size_) + " bytes, more than the " +
               std::to_string(max_bytes) + " such a file may hold");
  }
  const int flags = ::fcntl(fd_, F_GETFL);
  if (flags >= 0) ::fcntl(fd_, F_SETFL, flags & ~O_NONBLOCK);
  device_ = static_cast<std::uint64_t>(st.st_dev);
  inode_ = static_cast<std::uint64_t>(st.st_ino);
  mtime_ns_ = static_cast<std::int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

InputFile::InputFile(InputFile&& other) noexcept
    : path_(std::move(other.path_)),
      what_(std::move(other.what_)),
      fd_(other.fd_),
      size_(other.size_),
      max_bytes_(other.max_bytes_),
      device_(other.device_),
      inode_(other.inode_),
      mtime_ns_(other.mtime_ns_) {
  other.fd_ = -1;
}

std::string InputFile::name() const {
  const std::string shown = printable(path_, 240);
  return what_.empty() ? shown : what_ + " " + shown;
}

std::string InputFile::read_all() const {
  // A file whose size says 0 may still hold bytes (/proc and /sys report 0): it is read to its
  // end, up to the bound. Any other is read to its size, and must not have grown since.
  const bool sized = size_ > 0;
  const std::uint64_t want = sized ? size_ : max_bytes_;
  std::string text;
  std::uint64_t got = 0;
  while (got <= want) {
    const std::uint64_t step = std::min<std::uint64_t>(want - got + 1, std::uint64_t{1} << 20);
    if (text.size() < got + step) text.resize(static_cast<std::size_t>(got + step));
    const ssize_t n =
        ::pread(fd_, text.data() + got, static_cast<std::size_t>(step), static_cast<off_t>(got));
    if (n < 0) {
      if (errno == EINTR) continue;
      throw Error(ErrorCode::kInvalidArgument,
                  name() + ": cannot read it: " + std::string(std::strerror(errno)));
    }
    if (n == 0) break;  // the end (a file shrunk since it was opened ends where it ends)
    got += static_cast<std::uint64_t>(n);
  }
  if (got > want) {
    throw Error(ErrorCode::kInvalidArgument,
                sized ? name() + ": it grew while it was read (another program is writing it)"
                      : name() + ": holds more than the " + std::to_string(max_bytes_) +
                            " bytes such a file may hold");
  }
  text.resize(static_cast<std::size_t>(got));
  return text;
}

std::string read_input_file(const std::string& path, std::uint64_t max_bytes,
                            const std::string& what) {
  return InputFile(path, max_bytes, what).read_all();
}

}  // namespace kvo::offload
