#include "model/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "kvoffload/error.hpp"
#include "model/json.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

const char* safetensors_dtype(DType d) {
  return d == DType::kF32 ? "F32" : d == DType::kF16 ? "F16" : "BF16";
}

bool file_exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw invalid("cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw invalid("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::close(fd);
    throw invalid("cannot stat " + path);
  }
  size_ = static_cast<std::size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw invalid(path + ": truncated safetensors file (" + std::to_string(size_) +
                  " bytes, not even the 8-byte header length)");
  }
  mapping_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping_ == MAP_FAILED) {
    mapping_ = nullptr;
    throw invalid("cannot map " + path + ": " + std::strerror(errno));
  }
  const auto* bytes = static_cast<const std::byte*>(mapping_);
  std::uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i)
    header_len = (header_len << 8) | std::to_integer<std::uint64_t>(bytes[i]);
  try {
    if (header_len > size_ - 8) {
      throw invalid(path + ": truncated safetensors file: the header claims " +
                    std::to_string(header_len) + " bytes but the file has " +
                    std::to_string(size_ - 8) + " after the length");
    }
    const std::string header(reinterpret_cast<const char*>(bytes + 8), header_len);
    const Json root = Json::parse(header, path + " (safetensors header)");
    if (!root.is_object()) throw invalid(path + ": safetensors header is not a JSON object");
    const std::byte* data = bytes + 8 + header_len;
    const std::size_t data_size = size_ - 8 - header_len;
    for (const auto& [name, entry] : root.object()) {
      if (name == "__metadata__") continue;
      const std::string where = path + ": tensor \"" + name + "\"";
      const Json* dtype = entry.find("dtype");
      const Json* shape = entry.find("shape");
      const Json* offsets = entry.find("data_offsets");
      if (dtype == nullptr || !dtype->is_string() || shape == nullptr || !shape->is_array() ||
          offsets == nullptr || !offsets->is_array() || offsets->array().size() != 2) {
        throw invalid(where + " has a malformed header entry (needs dtype, shape, data_offsets)");
      }
      TensorInfo t;
      t.name = name;
      t.file = path;
      const std::string& d = dtype->string();
      std::size_t elem = 0;
      if (d == "F32")
        t.dtype = DType::kF32, elem = 4;
      else if (d == "F16")
        t.dtype = DType::kF16, elem = 2;
      else if (d == "BF16")
        t.dtype = DType::kBF16, elem = 2;
      std::uint64_t count = 1;
      for (const Json& dim : shape->array()) {
        if (!dim.is_number() || dim.number() < 0 || dim.number() > 9.0e15) {
          throw invalid(where + " has a malformed shape");
        }
        t.shape.push_back(static_cast<std::int64_t>(dim.number()));
        count *= static_cast<std::uint64_t>(dim.number());
      }
      const Json& b = offsets->array()[0];
      const Json& e = offsets->array()[1];
      if (!b.is_number() || !e.is_number() || b.number() < 0 || e.number() < b.number()) {
        throw invalid(where + " has malformed data_offsets");
      }
      const auto begin = static_cast<std::uint64_t>(b.number());
      const auto end = static_cast<std::uint64_t>(e.number());
      if (end > data_size) {
        throw invalid(where + " ends at byte " + std::to_string(end) +
                      " of the data section, which has only " + std::to_string(data_size) +
                      " bytes (the file is truncated or its header lies)");
      }
      t.dtype_text = d;
      t.dtype_supported = elem != 0;
      if (elem == 0) {
        t.bytes = static_cast<std::size_t>(end - begin);
        t.data = data + begin;
      } else {
        if (end - begin != count * elem) {
          throw invalid(where + ": data_offsets [" + std::to_string(begin) + ", " +
                        std::to_string(end) + ") hold " + std::to_string(end - begin) +
                        " bytes but shape and dtype " + d + " need " +
                        std::to_string(count * elem));
        }
        t.data = data + begin;
        t.bytes = static_cast<std::size_t>(end - begin);
      }
      tensors_[name] = std::move(t);
    }
  } catch (...) {
    ::munmap(mapping_, size_);
    mapping_ = nullptr;
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  const std::string index = dir + "/model.safetensors.index.json";
  std::vector<std::string> shards;
  if (file_exists(index)) {
    const Json root = Json::parse(read_text(index), index);
    const Json* map = root.find("weight_map");
    if (map == nullptr || !map->is_object()) throw invalid(index + ": missing \"weight_map\"");
    for (const auto& [name, file] : map->object()) {
      if (!file.is_string())
        throw invalid(index + ": weight_map entry \"" + name + "\" is not a file name");
      bool seen = false;
      for (const auto& s : shards) seen = seen || s == file.string();
      if (!seen) shards.push_back(file.string());
    }
  } else if (file_exists(dir + "/model.safetensors")) {
    shards.push_back("model.safetensors");
  } else {
    throw invalid(dir + ": no model.safetensors or model.safetensors.index.json");
  }
  for (const auto& shard : shards) {
    files_.push_back(std::make_unique<SafetensorsFile>(dir + "/" + shard));
    for (const auto& [name, info] : files_.back()->tensors()) tensors_[name] = &info;
  }
}

const TensorInfo& Checkpoint::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    throw invalid(dir_ + ": the checkpoint lacks tensor \"" + name + "\"");
  }
  return *it->second;
}

void write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  std::ostringstream header;
  header << "{\"__metadata__\":{\"format\":\"pt\"}";
  std::uint64_t offset = 0;
  for (const auto& t : tensors) {
    header << "," << json_quote(t.name) << ":{\"dtype\":\"" << safetensors_dtype(t.dtype)
           << "\",\"shape\":[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) header << (i ? "," : "") << t.shape[i];
    header << "],\"data_offsets\":[" << offset << "," << offset + t.data.size() << "]}";
    offset += t.data.size();
  }
  header << "}";
  std::string text = header.str();
  while ((text.size() + 8) % 8 != 0) text += ' ';  // data starts 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw invalid("cannot write " + path);
  unsigned char len[8];
  std::uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(n >> (8 * i));
  out.write(reinterpret_cast<const char*>(len), 8);
  out.write(text.data(), static_cast<std::streamsize>(text.size()));
  for (const auto& t : tensors) {
    out.write(reinterpret_cast<const char*>(t.data.data()),
              static_cast<std::streamsize>(t.data.size()));
  }
  if (!out) throw invalid("failed writing " + path);
}

}  // namespace kvo::model
