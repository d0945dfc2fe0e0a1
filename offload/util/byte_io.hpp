// Bytes in and bytes out, and their ends: files (POSIX descriptors, written atomically) and C++
// streams. Saved contexts are written and read through them (offload/context/context_file.hpp).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <iosfwd>
#include <string>

#include "offload/util/input_file.hpp"
#include "offload/util/partial_files.hpp"

namespace kvo::offload {

// Where bytes go: a file descriptor or a std::ostream. write() throws kvo::Error on failure.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual void write(const void* data, std::size_t bytes) = 0;
};

// Where bytes come from. read() returns fewer than `bytes` only at the end of the input.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  virtual std::size_t read(void* data, std::size_t bytes) = 0;
  // Passes over `bytes`; false when the input ends first. Reads and drops them unless the
  // source can seek.
  virtual bool skip(std::uint64_t bytes);
  // Sources that can also read at an offset from where they stand, from several threads at
  // once (a file), say so; the layer blocks of a record are then read in parallel.
  virtual bool positional() const { return false; }
  // Reads up to `bytes` starting `offset` bytes past the current position, without moving it;
  // returns how many arrived (fewer only at the end of the input). Thread-safe.
  // REQUIRES: positional().
  virtual std::size_t read_ahead(void* data, std::size_t bytes, std::uint64_t offset);
  // The `bytes` starting `offset` bytes past the current position, mapped read-only into memory
  // for as long as the source lives, or nullptr when the source cannot map them (the default) or
  // they are not all there. Lets a reader copy and hash in one pass, without a system call per
  // piece. REQUIRES: positional().
  virtual const std::byte* map_ahead(std::uint64_t offset, std::uint64_t bytes);
};

// Reads up to `bytes` into dst; returns how many arrived (fewer only at the end of the input).
std::size_t read_fully(ByteSource& source, void* dst, std::size_t bytes);

// Writes `path` atomically: the bytes go to a partial file beside it
// (offload/util/partial_files.hpp), which commit() syncs to disk and renames over `path` (then
// syncs the directory). Destroyed without commit(), it removes the partial file and `path` is as it
// was. `path` must be absent or a regular file: a device, a FIFO, a directory or a symbolic link
// there is refused, never replaced. Errors name the path and the system's reason.
class AtomicFileSink : public ByteSink {
 public:
  explicit AtomicFileSink(const std::string& path);
  // What the constructor checks, and that a file can be made in the directory, without writing
  // anything: for a program to refuse a save before the work whose result it saves.
  static void check_path(const std::string& path);
  ~AtomicFileSink() override;
  AtomicFileSink(const AtomicFileSink&) = delete;
  AtomicFileSink& operator=(const AtomicFileSink&) = delete;

  void write(const void* data, std::size_t bytes) override;
  void commit();

 private:
  std::string path_;
  std::string temp_;
  int fd_ = -1;
  PartialRegistration registration_;
};

// The largest saved context read (Llama-3-8B at 8M tokens in bf16 is 1 TiB).
inline constexpr std::uint64_t kMaxContextFileBytes = std::uint64_t{1} << 42;

// A saved context opened once (offload/util/input_file.hpp: a regular file, never blocking).
class FileSource : public ByteSource {
 public:
  // Throws naming the path and the reason. mapped: map_ahead may map the file; else it never
  // does, and every byte is read with pread.
  explicit FileSource(const std::string& path, bool mapped = true);
  ~FileSource() override;
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  std::size_t read(void* data, std::size_t bytes) override;
  bool skip(std::uint64_t bytes) override;
  bool positional() const override { return true; }
  std::size_t read_ahead(void* data, std::size_t bytes, std::uint64_t offset) override;
  // Maps the whole file once, on the first call (MADV_SEQUENTIAL). Reading a mapped page that
  // the system cannot deliver raises SIGBUS instead of an error: the file shrunk by another
  // process, or a read error (a failing disk, a network file system gone). Built with mapped =
  // false, it returns nullptr, and callers read with pread, which reports both.
  const std::byte* map_ahead(std::uint64_t offset, std::uint64_t bytes) override;
  std::uint64_t size() const { return size_; }
  // Back to the first byte, for reading the file again (its headers were inspected).
  void rewind();

 private:
  // Up to `bytes` from where the file stands (at < 0, moving it) or from offset `at` (not).
  std::size_t read_all(void* data, std::size_t bytes, off_t at) const;

  std::string path_;
  InputFile file_;
  int fd_ = -1;
  std::uint64_t size_ = 0;
  bool mapped_ = true;       // map_ahead may map
  void* mapping_ = nullptr;  // the whole file, once map_ahead has mapped it
};

class StreamSink : public ByteSink {
 public:
  explicit StreamSink(std::ostream& out) : out_(out) {}
  void write(const void* data, std::size_t bytes) override;

 private:
  std::ostream& out_;
};

class StreamSource : public ByteSource {
 public:
  explicit StreamSource(std::istream& in) : in_(in) {}
  std::size_t read(void* data, std::size_t bytes) override;

 private:
  std::istream& in_;
};

}  // namespace kvo::offload
