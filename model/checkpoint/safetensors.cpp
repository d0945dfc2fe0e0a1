#include "model/checkpoint/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "kvoffload/error.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "offload/util/checked_math.hpp"
#include "offload/util/input_file.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

const char* safetensors_dtype(DType d) {
  return d == DType::kF32 ? "F32" : d == DType::kF16 ? "F16" : "BF16";
}

// Element sizes of the format's dtypes; 0: not one of them.
std::size_t element_bytes(const std::string& dtype) {
  static const std::map<std::string, std::size_t> kSizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"F8_E8M0", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},     {"U32", 4},
      {"F32", 4},  {"F64", 8}, {"I64", 8}, {"U64", 8},     {"C64", 8}};
  const auto it = kSizes.find(dtype);
  return it == kSizes.end() ? 0 : it->second;
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

struct Span {
  std::uint64_t begin, end;
  const std::string* name;
};

// The tensors must tile [0, data_size) exactly: sorted by offset, each starts where the
// previous one ended, and the last ends at the end of the data.
void check_tiling(std::vector<Span> spans, std::uint64_t data_size, const std::string& path) {
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  const std::string* previous = nullptr;
  for (const Span& s : spans) {
    if (s.begin < covered) {
      throw invalid(path + ": tensors \"" + printable(*previous) + "\" and \"" +
                    printable(*s.name) + "\" overlap (bytes " + std::to_string(s.begin) + " to " +
                    std::to_string(covered) + " of the data section)");
    }
    if (s.begin > covered) {
      throw invalid(path + ": bytes " + std::to_string(covered) + " to " + std::to_string(s.begin) +
                    " of the data section belong to no tensor (before \"" + printable(*s.name) +
                    "\")");
    }
    covered = s.end;
    previous = s.name;
  }
  if (covered != data_size) {
    throw invalid(path + ": the data section has " + std::to_string(data_size) +
                  " bytes but its tensors cover only " + std::to_string(covered));
  }
}

// One tensor's entry: exactly dtype, shape and data_offsets. Every problem reads
// "FILE: [\"NAME\"].FIELD: what is wrong".
TensorInfo parse_entry(const std::string& name, const JsonField& entry, const std::string& path,
                       const std::byte* data, std::uint64_t data_size, Span& span) {
  for (const auto& [key, value] : entry.members()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      throw value.error("an unknown field (an entry holds dtype, shape and data_offsets)");
    }
  }
  const JsonField dtype = entry.at("dtype");
  TensorInfo t;
  t.name = name;
  t.file = path;
  t.dtype_text = dtype.text();
  const std::size_t elem = element_bytes(t.dtype_text);
  if (elem == 0) throw dtype.error("an unknown dtype " + dtype.shown());
  for (const DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (t.dtype_text == safetensors_dtype(d)) t.dtype = d, t.dtype_supported = true;
  }
  const JsonField shape = entry.at("shape");
  std::uint64_t bytes = elem;
  for (const JsonField& dim : shape.elements()) {
    const std::int64_t d = dim.integer(0, INT64_MAX);
    t.shape.push_back(d);
    if (__builtin_mul_overflow(bytes, static_cast<std::uint64_t>(d), &bytes)) {
      throw shape.error(shape.shown() + " of " + t.dtype_text + " holds more than 2^64 bytes");
    }
  }
  const JsonField offsets = entry.at("data_offsets");
  const std::vector<JsonField> ends = offsets.elements();
  if (ends.size() != 2) {
    throw offsets.error("must be two integers [begin, end], got " + offsets.shown());
  }
  const auto begin = static_cast<std::uint64_t>(ends[0].integer(0, INT64_MAX));
  const auto end = static_cast<std::uint64_t>(ends[1].integer(0, INT64_MAX));
  if (end < begin) throw offsets.error("ends before it begins: " + offsets.shown());
  if (end > data_size) {
    throw offsets.error("ends at byte " + std::to_string(end) +
                        " of the data section, which has only " + std::to_string(data_size) +
                        " bytes (the file is truncated or its header lies)");
  }
  if (end - begin != bytes) {
    throw offsets.error("[" + std::to_string(begin) + ", " + std::to_string(end) + ") hold " +
                        std::to_string(end - begin) + " bytes but shape " + shape.shown() + " of " +
                        t.dtype_text + " needs " + std::to_string(bytes));
  }
  t.data = data + begin;
  t.bytes = static_cast<std::size_t>(bytes);
  span = {begin, end, nullptr};
  return t;
}

}  // namespace

std::map<std::string, TensorInfo> parse_safetensors(const std::byte* file, std::size_t size,
                                                    const std::string& path) {
  if (size < 8) {
    throw invalid(path + ": truncated safetensors file (" + std::to_string(size) +
                  " bytes, not even the 8-byte header length)");
  }
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | std::to_integer<std::uint64_t>(file[i]);
  }
  if (header_len > kMaxSafetensorsHeaderBytes) {
    throw invalid(path + ": the safetensors header claims " + std::to_string(header_len) +
                  " bytes, more than the format's limit of " +
                  std::to_string(kMaxSafetensorsHeaderBytes));
  }
  if (header_len > size - 8) {
    throw invalid(path + ": truncated safetensors file: the header claims " +
                  std::to_string(header_len) + " bytes but the file has " +
                  std::to_string(size - 8) + " after the length");
  }
  const std::string_view header(reinterpret_cast<const char*>(file + 8), header_len);
  if (header.empty() || header.front() != '{') {
    throw invalid(path + ": the safetensors header does not start with '{'");
  }
  Json holder;
  const JsonField root = parse_json_object(header, path, holder);
  const std::byte* data = file + 8 + header_len;
  const std::uint64_t data_size = size - 8 - header_len;
  std::map<std::string, TensorInfo> tensors;
  std::vector<Span> spans;
  for (const auto& [name, entry] : root.members()) {
    if (name == "__metadata__") {
      for (const auto& [key, value] : entry.members()) (void)value.text();  // strings only
      continue;
    }
    Span span{};
    TensorInfo t = parse_entry(name, entry, path, data, data_size, span);
    const auto [it, inserted] = tensors.emplace(name, std::move(t));
    (void)inserted;  // parse_json refuses repeated keys
    span.name = &it->first;
    spans.push_back(span);
  }
  check_tiling(std::move(spans), data_size, path);
  return tensors;
}

ShardIndex parse_safetensors_index(const std::string& text, const std::string& path) {
  Json holder;
  const JsonField root = parse_json_object(text, path, holder);
  ShardIndex index;
  for (const auto& [name, file] : root.at("weight_map").members()) {
    const std::string& shard = file.text();
    // Shards sit beside the index: a name with a directory part could reach any file.
    if (shard.empty() || shard == "." || shard == ".." ||
        shard.find_first_of(std::string("/\\\0", 3)) != std::string::npos) {
      throw file.error("names " + file.shown() +
                       ", which is not a file in the model directory (shards are plain file "
                       "names beside the index)");
    }
    if (std::find(index.shards.begin(), index.shards.end(), shard) == index.shards.end()) {
      index.shards.push_back(shard);
    }
    index.shard_of.emplace(name, shard);
  }
  return index;
}

SafetensorsFile::SafetensorsFile(const std::string& path)
    : path_(path), file_(path, kMaxSafetensorsFileBytes, 8, "safetensors") {
  tensors_ = parse_safetensors(file_.data(), file_.size(), path);
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    throw invalid("cannot open the model directory " + dir + ": " + std::strerror(errno));
  }
  if (!S_ISDIR(st.st_mode)) throw invalid(dir + " is not a directory");
  const std::string index_path = dir + "/model.safetensors.index.json";
  ShardIndex index;
  const bool indexed = exists(index_path);
  if (indexed) {
    index = parse_safetensors_index(read_regular_file(index_path, kMaxSafetensorsIndexBytes),
                                    index_path);
  } else if (exists(dir + "/model.safetensors")) {
    index.shards.push_back("model.safetensors");
  } else {
    throw invalid(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  std::map<std::string, const SafetensorsFile*> holder;
  for (const auto& shard : index.shards) {
    files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + shard));
    for (const auto& [name, info] : files_.back()->tensors()) {
      const auto [it, inserted] = tensors_.emplace(name, &info);
      if (!inserted) {
        throw invalid(dir + ": tensor \"" + printable(name) + "\" is in both " + it->second->file +
                      " and " + info.file);
      }
    }
  }
  for (const auto& [name, shard] : index.shard_of) {
    const auto it = tensors_.find(name);
    if (it == tensors_.end() || it->second->file != dir + "/" + shard) {
      throw invalid(index_path + " places tensor \"" + printable(name) + "\" in " + shard +
                    ", which does not hold it");
    }
  }
}

const TensorInfo& Checkpoint::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    throw invalid(dir_ + ": the checkpoint lacks tensor \"" + name + "\"");
  }
  return *it->second;
}

std::uint64_t TensorHeader::bytes() const {
  std::uint64_t n = dtype_size(dtype);
  for (const auto d : shape) {
    if (d < 0) throw invalid("tensor \"" + name + "\" has a negative dimension");
    n = offload::checked_mul(n, static_cast<std::uint64_t>(d), "tensor bytes");
  }
  return n;
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<TensorHeader> tensors)
    : path_(path), out_(nullptr, &std::fclose) {
  nlohmann::ordered_json header;
  header["__metadata__"] = {{"format", "pt"}};
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    const std::uint64_t end = offload::checked_add(offset, t.bytes(), "safetensors data bytes");
    header[t.name] = {
        {"dtype", safetensors_dtype(t.dtype)}, {"shape", t.shape}, {"data_offsets", {offset, end}}};
    offset = end;
  }
  total_ = offset;
  std::string text = header.dump();
  while (text.size() % 8 != 0) text += ' ';  // data starts 8-byte aligned
  out_.reset(std::fopen(path.c_str(), "wb"));
  if (!out_) throw invalid("cannot write " + path + ": " + std::strerror(errno));
  unsigned char len[8];
  const std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  if (std::fwrite(len, 1, 8, out_.get()) != 8 ||
      std::fwrite(text.data(), 1, text.size(), out_.get()) != text.size()) {
    throw invalid("failed writing " + path + ": " + std::strerror(errno));
  }
}

void SafetensorsWriter::write(const void* bytes, std::size_t size) {
  if (written_ + size > total_) {
    throw Error(ErrorCode::kInternal, path_ + ": more tensor bytes than the header declares");
  }
  if (size > 0 && std::fwrite(bytes, 1, size, out_.get()) != size) {
    throw invalid("failed writing " + path_ + ": " + std::strerror(errno));
  }
  written_ += size;
}

void SafetensorsWriter::finish() {
  if (written_ != total_) {
    throw Error(ErrorCode::kInternal, path_ + ": " + std::to_string(written_) + " of " +
                                          std::to_string(total_) + " tensor bytes written");
  }
  if (std::fflush(out_.get()) != 0 || std::fclose(out_.release()) != 0) {
    throw invalid("failed writing " + path_ + ": " + std::strerror(errno));
  }
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  std::vector<TensorHeader> headers;
  for (const auto& t : tensors) headers.push_back({t.name, t.dtype, t.shape});
  SafetensorsWriter writer(path, std::move(headers));
  for (const auto& t : tensors) writer.write(t.data.data(), t.data.size());
  writer.finish();
}

}  // namespace kvo::model
