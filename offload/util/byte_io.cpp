#include "offload/util/byte_io.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <istream>
#include <ostream>
#include <vector>

#include "kvoffload/error.hpp"
#include "offload/util/input_file.hpp"
#include "offload/util/partial_files.hpp"

namespace kvo::offload {

namespace {

Error io_error(const std::string& what, const std::string& path, int err) {
  return Error(ErrorCode::kInvalidArgument, what + " " + path + ": " + std::strerror(err));
}

// A save replaces a regular file or creates one; anything else at the path (a device, a FIFO, a
// directory, a symbolic link) is refused, so that "--save-context /dev/null" never turns the
// device into a file.
void check_replaceable(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    throw io_error("cannot save to", path, errno);
  }
  if (!S_ISREG(st.st_mode)) {
    throw Error(ErrorCode::kInvalidArgument,
                "cannot save to " + path + ": it is " + file_kind(st.st_mode) +
                    ", and a save only ever replaces a regular file (give a file's path)");
  }
}

}  // namespace

void AtomicFileSink::check_path(const std::string& path) {
  if (path.empty()) throw Error(ErrorCode::kInvalidArgument, "cannot save to an empty path");
  check_replaceable(path);
  // The directory: a partial file made and removed says it exists and takes files.
  std::string name = partial_pattern(path);
  std::vector<char> buffer(name.begin(), name.end());
  buffer.push_back('\0');
  const int fd = ::mkstemp(buffer.data());
  if (fd < 0) throw io_error("cannot write files beside", path, errno);
  ::close(fd);
  ::unlink(buffer.data());
}

AtomicFileSink::AtomicFileSink(const std::string& path) : path_(path) {
  if (path.empty()) throw Error(ErrorCode::kInvalidArgument, "cannot save to an empty path");
  check_replaceable(path_);
  remove_stale_partials(directory_of(path_));
  const std::string pattern = partial_pattern(path_);
  std::vector<char> name(pattern.begin(), pattern.end());
  name.push_back('\0');
  fd_ = ::mkstemp(name.data());
  if (fd_ < 0) throw io_error("cannot create a temporary file beside", path_, errno);
  temp_ = name.data();
  registration_ = PartialRegistration(temp_, false);
  ::fchmod(fd_, 0644);
}

AtomicFileSink::~AtomicFileSink() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFileSink::write(const void* data, std::size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t done = ::write(fd_, p, bytes);
    if (done < 0) {
      if (errno == EINTR) continue;
      throw io_error("cannot write", temp_, errno);
    }
    p += done;
    bytes -= static_cast<std::size_t>(done);
  }
}

void AtomicFileSink::commit() {
  if (::fsync(fd_) != 0) throw io_error("cannot sync", temp_, errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) throw io_error("cannot close", temp_, errno);
  check_replaceable(path_);  // again: the path may have changed while the file was written
  if (::rename(temp_.c_str(), path_.c_str()) != 0) {
    throw io_error("cannot rename the temporary file to", path_, errno);
  }
  temp_.clear();
  registration_.release();
  // The rename itself is durable once the directory is synced.
  const int dir = ::open(directory_of(path_).c_str(), O_RDONLY | O_DIRECTORY);
  if (dir >= 0) {
    ::fsync(dir);
    ::close(dir);
  }
}

std::size_t read_fully(ByteSource& source, void* dst, std::size_t bytes) {
  std::size_t done = 0;
  while (done < bytes) {
    const std::size_t got = source.read(static_cast<char*>(dst) + done, bytes - done);
    if (got == 0) break;
    done += got;
  }
  return done;
}

const std::byte* ByteSource::map_ahead(std::uint64_t, std::uint64_t) {
  return nullptr;
}

std::size_t ByteSource::read_ahead(void*, std::size_t, std::uint64_t) {
  throw Error(ErrorCode::kInternal, "this input cannot be read at an offset");
}

bool ByteSource::skip(std::uint64_t bytes) {
  constexpr std::uint64_t kPiece = 8u << 20;  // read and dropped at a time
  std::vector<char> sink(static_cast<std::size_t>(std::min<std::uint64_t>(bytes, kPiece)));
  while (bytes > 0) {
    const std::size_t piece = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, sink.size()));
    if (read_fully(*this, sink.data(), piece) < piece) return false;
    bytes -= piece;
  }
  return true;
}

FileSource::FileSource(const std::string& path, bool mapped)
    : path_(path), file_(path, kMaxContextFileBytes, "the saved context"), mapped_(mapped) {
  fd_ = file_.fd();
  size_ = file_.size();
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
}

FileSource::~FileSource() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

void FileSource::rewind() {
  if (::lseek(fd_, 0, SEEK_SET) != 0) throw io_error("cannot read", path_, errno);
}

std::size_t FileSource::read(void* data, std::size_t bytes) {
  return read_all(data, bytes, -1);
}

std::size_t FileSource::read_ahead(void* data, std::size_t bytes, std::uint64_t offset) {
  const off_t here = ::lseek(fd_, 0, SEEK_CUR);
  if (here < 0) throw io_error("cannot read", path_, errno);
  return read_all(data, bytes, here + static_cast<off_t>(offset));
}

const std::byte* FileSource::map_ahead(std::uint64_t offset, std::uint64_t bytes) {
  if (!mapped_) return nullptr;
  const off_t at = ::lseek(fd_, 0, SEEK_CUR);
  if (at < 0 || static_cast<std::uint64_t>(at) > size_) return nullptr;
  const std::uint64_t here = static_cast<std::uint64_t>(at);
  if (bytes == 0 || offset > size_ - here || bytes > size_ - here - offset) return nullptr;
  if (mapping_ == nullptr) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd_, 0);
    if (p == MAP_FAILED) return nullptr;  // the caller reads instead
    ::madvise(p, size_, MADV_SEQUENTIAL);
    mapping_ = p;
  }
  return static_cast<const std::byte*>(mapping_) + here + offset;
}

std::size_t FileSource::read_all(void* data, std::size_t bytes, off_t at) const {
  std::size_t total = 0;
  char* p = static_cast<char*>(data);
  while (total < bytes) {
    const ssize_t done =
        at < 0 ? ::read(fd_, p + total, bytes - total)
               : ::pread(fd_, p + total, bytes - total, at + static_cast<off_t>(total));
    if (done < 0) {
      if (errno == EINTR) continue;
      throw io_error("cannot read", path_, errno);
    }
    if (done == 0) break;
    total += static_cast<std::size_t>(done);
  }
  return total;
}

bool FileSource::skip(std::uint64_t bytes) {
  const off_t here = ::lseek(fd_, 0, SEEK_CUR);
  if (here < 0) return ByteSource::skip(bytes);
  if (static_cast<std::uint64_t>(here) + bytes > size_) return false;
  return ::lseek(fd_, static_cast<off_t>(here + static_cast<off_t>(bytes)), SEEK_SET) >= 0;
}

void StreamSink::write(const void* data, std::size_t bytes) {
  out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out_)
    throw Error(ErrorCode::kInvalidArgument, "cannot write the saved context: the stream failed");
}

std::size_t StreamSource::read(void* data, std::size_t bytes) {
  in_.read(static_cast<char*>(data), static_cast<std::streamsize>(bytes));
  const std::streamsize got = in_.gcount();
  if (in_.bad())
    throw Error(ErrorCode::kInvalidArgument, "cannot read the saved context: the stream failed");
  return static_cast<std::size_t>(got);
}

}  // namespace kvo::offload
