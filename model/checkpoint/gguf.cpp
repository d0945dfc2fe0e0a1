#include "model/checkpoint/gguf.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "kvoffload/error.hpp"
#include "offload/util/element_types.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

// ggml's types with their blocks: the sizes are the format's, one row of ne[0] elements being
// ne[0] / block blocks.
constexpr GgmlType kTypes[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 40},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},    {40, "NVFP4", 64, 36},
    {41, "Q1_0", 128, 18},
};

// The format's list agrees with the element types' table on every type the table has.
constexpr bool agrees_with_element_types() {
  for (const GgmlType& t : kTypes) {
    const int elements = ggml_block_elements(t.id);
    if (elements != 0 && (static_cast<std::uint32_t>(elements) != t.block ||
                          static_cast<std::uint32_t>(ggml_block_bytes(t.id)) != t.block_bytes)) {
      return false;
    }
  }
  return true;
}
static_assert(agrees_with_element_types(), "a ggml block size differs from element_types.hpp");

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

// Bytes of one scalar of `type`; 0 for a string or an array.
std::uint64_t scalar_bytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    case GgufValueType::kString:
    case GgufValueType::kArray:
      return 0;
  }
  return 0;
}

bool known_value_type(std::uint32_t type) {
  return type <= static_cast<std::uint32_t>(GgufValueType::kFloat64);
}

bool is_float_type(GgufValueType type) {
  return type == GgufValueType::kFloat32 || type == GgufValueType::kFloat64;
}

// Reads the file front to back; every read checks the bytes left first and names the field.
class Cursor {
 public:
  Cursor(const std::byte* data, std::size_t size, const std::string& path)
      : data_(data), size_(size), path_(path) {}

  std::uint64_t position() const { return at_; }
  std::uint64_t left() const { return size_ - at_; }
  const std::string& path() const { return path_; }

  Error error(const std::string& field, const std::string& problem) const {
    return invalid(path_ + ": " + field + ": " + problem);
  }

  void need(std::uint64_t bytes, const std::string& field) const {
    if (bytes > left()) {
      throw error(field, "the file ends " + std::to_string(left()) + " bytes on, " +
                             std::to_string(bytes) + " needed (truncated?)");
    }
  }

  template <typename T>
  T read(const std::string& field) {
    need(sizeof(T), field);
    T value;
    std::memcpy(&value, data_ + at_, sizeof(T));  // the format and x86-64 are little-endian
    at_ += sizeof(T);
    return value;
  }

  // A string: a uint64 length, then that many bytes (no terminator).
  std::string string(const std::string& field, std::uint64_t max_bytes) {
    const auto length = read<std::uint64_t>(field + " (its length)");
    if (length > left()) {
      throw error(field, "a string of " + std::to_string(length) + " bytes, past the end of the " +
                             "file (" + std::to_string(left()) + " bytes left)");
    }
    if (length > max_bytes) {
      throw error(field, "a string of " + std::to_string(length) + " bytes, more than the " +
                             std::to_string(max_bytes) + " allowed");
    }
    need(length, field);
    std::string text(reinterpret_cast<const char*>(data_ + at_), static_cast<std::size_t>(length));
    at_ += length;
    return text;
  }

  void skip_to(std::uint64_t position) { at_ = position; }

 private:
  const std::byte* data_;
  std::uint64_t size_;
  std::uint64_t at_ = 0;
  std::string path_;
};

std::int64_t read_integer(Cursor& in, GgufValueType type, const std::string& field,
                          std::uint64_t* unsigned_value) {
  std::int64_t value = 0;
  std::uint64_t exact = 0;
  switch (type) {
    case GgufValueType::kUint8:
      exact = in.read<std::uint8_t>(field);
      value = static_cast<std::int64_t>(exact);
      break;
    case GgufValueType::kInt8:
      value = in.read<std::int8_t>(field);
      break;
    case GgufValueType::kBool: {
      const auto b = in.read<std::uint8_t>(field);
      if (b > 1) throw in.error(field, "a bool of " + std::to_string(b) + ", not 0 or 1");
      value = b;
      break;
    }
    case GgufValueType::kUint16:
      exact = in.read<std::uint16_t>(field);
      value = static_cast<std::int64_t>(exact);
      break;
    case GgufValueType::kInt16:
      value = in.read<std::int16_t>(field);
      break;
    case GgufValueType::kUint32:
      exact = in.read<std::uint32_t>(field);
      value = static_cast<std::int64_t>(exact);
      break;
    case GgufValueType::kInt32:
      value = in.read<std::int32_t>(field);
      break;
    case GgufValueType::kUint64:
      exact = in.read<std::uint64_t>(field);
      // Above 2^63 - 1 only the unsigned value is exact; integer() refuses it.
      value = exact > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())
                  ? std::numeric_limits<std::int64_t>::max()
                  : static_cast<std::int64_t>(exact);
      break;
    case GgufValueType::kInt64:
      value = in.read<std::int64_t>(field);
      break;
    default:
      throw in.error(field, "not an integer type");
  }
  if (unsigned_value != nullptr) {
    const bool is_unsigned = type == GgufValueType::kUint8 || type == GgufValueType::kUint16 ||
                             type == GgufValueType::kUint32 || type == GgufValueType::kUint64;
    *unsigned_value = is_unsigned ? exact : (value >= 0 ? static_cast<std::uint64_t>(value) : 0);
  }
  return value;
}

double read_float(Cursor& in, GgufValueType type, const std::string& field) {
  if (type == GgufValueType::kFloat32) return in.read<float>(field);
  return in.read<double>(field);
}

GgufValue read_value(Cursor& in, std::uint32_t raw_type, const std::string& key) {
  if (!known_value_type(raw_type)) {
    throw in.error(key, "unknown value type " + std::to_string(raw_type));
  }
  GgufValue v;
  v.type = static_cast<GgufValueType>(raw_type);
  if (v.type == GgufValueType::kString) {
    v.text = in.string(key, in.left());
    return v;
  }
  if (v.type != GgufValueType::kArray) {
    if (is_float_type(v.type)) {
      v.floating = read_float(in, v.type, key);
    } else {
      v.is_integer = true;
      v.integer = read_integer(in, v.type, key, &v.unsigned_integer);
      v.floating = static_cast<double>(v.integer);
    }
    return v;
  }
  const auto element = in.read<std::uint32_t>(key + " (its element type)");
  if (!known_value_type(element)) {
    throw in.error(key, "an array of unknown value type " + std::to_string(element));
  }
  v.element = static_cast<GgufValueType>(element);
  if (v.element == GgufValueType::kArray) {
    throw in.error(key, "an array of arrays (not read)");
  }
  v.count = in.read<std::uint64_t>(key + " (its element count)");
  // Bounded by the bytes left before anything is allocated: a string takes at least its length.
  const std::uint64_t each = v.element == GgufValueType::kString ? 8 : scalar_bytes(v.element);
  if (v.count > in.left() / each) {
    throw in.error(key, "an array of " + std::to_string(v.count) + " " +
                            gguf_value_type_name(v.element) + " elements, more than the " +
                            std::to_string(in.left()) + " bytes left could hold");
  }
  const auto count = static_cast<std::size_t>(v.count);
  if (v.element == GgufValueType::kString) {
    v.strings.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      v.strings.push_back(in.string(key + "[" + std::to_string(i) + "]", in.left()));
    }
  } else if (is_float_type(v.element)) {
    v.floats.reserve(count);
    for (std::size_t i = 0; i < count; ++i) v.floats.push_back(read_float(in, v.element, key));
  } else {
    v.is_integer = true;
    v.integers.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      v.integers.push_back(read_integer(in, v.element, key, nullptr));
    }
  }
  return v;
}

std::string shape_text(const std::vector<std::int64_t>& dims) {
  std::string text = "[";
  for (std::size_t i = 0; i < dims.size(); ++i) {
    text += (i ? ", " : "") + std::to_string(dims[i]);
  }
  return text + "]";
}

}  // namespace

const char* gguf_value_type_name(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "unknown";
}

const GgmlType* ggml_type(std::uint32_t id) {
  for (const GgmlType& t : kTypes) {
    if (t.id == id) return &t;
  }
  return nullptr;
}

std::int64_t GgufTensor::elements() const {
  std::int64_t n = 1;
  for (std::int64_t d : dims) n *= d;  // checked against overflow when the file was read
  return n;
}

GgufContents parse_gguf(const std::byte* file, std::size_t size, const std::string& path) {
  Cursor in(file, size, path);
  GgufContents out;
  in.need(4, "the magic");
  if (std::memcmp(file, "GGUF", 4) != 0) {
    throw in.error("the magic", "the file does not start with \"GGUF\": not a GGUF file");
  }
  in.skip_to(4);
  out.version = in.read<std::uint32_t>("the version");
  if (out.version != 3) {
    if (out.version == 0x03000000u || out.version == 0x02000000u) {
      throw in.error("the version", "a big-endian GGUF file (only little-endian is read)");
    }
    throw in.error("the version", "version " + std::to_string(out.version) +
                                      (out.version == 1 || out.version == 2
                                           ? " (an older format; convert the model again)"
                                           : " (unknown)") +
                                      ", only version 3 is read");
  }
  const auto tensor_count = in.read<std::uint64_t>("the tensor count");
  const auto metadata_count = in.read<std::uint64_t>("the metadata count");
  // Bounded before anything is read into memory: a pair takes at least a 1-byte key (8 + 1), a
  // type (4) and a 1-byte value; a tensor's entry a name length (8), one dimension (4 + 8), a
  // type (4) and an offset (8).
  constexpr std::uint64_t kMinPair = 8 + 1 + 4 + 1;
  constexpr std::uint64_t kMinTensor = 8 + 4 + 8 + 4 + 8;
  if (metadata_count > in.left() / kMinPair) {
    throw in.error("the metadata count", std::to_string(metadata_count) +
                                             " key-value pairs, more than the " +
                                             std::to_string(in.left()) + " bytes left could hold");
  }
  if (tensor_count > in.left() / kMinTensor) {
    throw in.error("the tensor count", std::to_string(tensor_count) + " tensors, more than the " +
                                           std::to_string(in.left()) + " bytes left could hold");
  }

  for (std::uint64_t i = 0; i < metadata_count; ++i) {
    const std::string where = "metadata pair " + std::to_string(i);
    std::string key = in.string(where + " (its key)", kMaxGgufKeyBytes);
    if (key.empty()) throw in.error(where, "an empty key");
    for (const char ch : key) {
      if (static_cast<unsigned char>(ch) < 0x20 || static_cast<unsigned char>(ch) > 0x7e) {
        throw in.error(where, "key \"" + printable(key) + "\" is not printable ASCII");
      }
    }
    const auto type = in.read<std::uint32_t>(key + " (its type)");
    GgufValue value = read_value(in, type, key);
    if (!out.metadata.emplace(key, std::move(value)).second) {
      throw in.error(key, "appears twice in the metadata");
    }
  }

  auto alignment = out.metadata.find("general.alignment");
  if (alignment != out.metadata.end()) {
    const GgufValue& a = alignment->second;
    if (a.type != GgufValueType::kUint32) {
      throw in.error("general.alignment",
                     std::string("a ") + gguf_value_type_name(a.type) + ", not a uint32");
    }
    if (a.unsigned_integer == 0 || (a.unsigned_integer & (a.unsigned_integer - 1)) != 0) {
      throw in.error("general.alignment",
                     std::to_string(a.unsigned_integer) + " is not a power of two");
    }
    out.alignment = static_cast<std::uint32_t>(a.unsigned_integer);
  }

  out.tensors.reserve(static_cast<std::size_t>(tensor_count));
  for (std::uint64_t i = 0; i < tensor_count; ++i) {
    GgufTensor t;
    t.name = in.string("tensor " + std::to_string(i) + " (its name)", kMaxGgufKeyBytes);
    const std::string field = "tensor \"" + printable(t.name) + "\"";
    const auto dims = in.read<std::uint32_t>(field + " (its dimension count)");
    if (dims < 1 || dims > kMaxGgufDims) {
      throw in.error(
          field, std::to_string(dims) + " dimensions, not 1 to " + std::to_string(kMaxGgufDims));
    }
    std::uint64_t elements = 1;
    for (std::uint32_t d = 0; d < dims; ++d) {
      const auto extent = in.read<std::uint64_t>(field + " (its dimensions)");
      if (extent == 0 ||
          extent >
              static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()) / elements) {
        throw in.error(field, "dimension " + std::to_string(d) + " is " + std::to_string(extent) +
                                  (extent == 0 ? "" : ", and the element count overflows"));
      }
      elements *= extent;
      t.dims.push_back(static_cast<std::int64_t>(extent));
    }
    const auto type = in.read<std::uint32_t>(field + " (its type)");
    t.type = ggml_type(type);
    if (t.type == nullptr) {
      throw in.error(field, "unknown ggml type " + std::to_string(type));
    }
    if (t.dims[0] % t.type->block != 0) {
      throw in.error(field, "rows of " + std::to_string(t.dims[0]) + " elements, not a multiple " +
                                "of " + t.type->name + "'s block of " +
                                std::to_string(t.type->block));
    }
    if (elements / t.type->block >
        std::numeric_limits<std::uint64_t>::max() / t.type->block_bytes) {
      throw in.error(field, "its size in bytes overflows");
    }
    t.bytes = elements / t.type->block * t.type->block_bytes;
    t.offset = in.read<std::uint64_t>(field + " (its offset)");
    if (t.offset % out.alignment != 0) {
      throw in.error(field, "offset " + std::to_string(t.offset) + " is not a multiple of the " +
                                "alignment " + std::to_string(out.alignment));
    }
    if (!out.tensor_index.emplace(t.name, out.tensors.size()).second) {
      throw in.error(field, "appears twice in the tensor table");
    }
    out.tensors.push_back(std::move(t));
  }

  // The data section starts at the next multiple of the alignment.
  const std::uint64_t end_of_table = in.position();
  out.data_offset = (end_of_table + out.alignment - 1) / out.alignment * out.alignment;
  if (out.data_offset < end_of_table || (out.tensors.size() > 0 && out.data_offset > size)) {
    throw in.error("the data section", "starts at " + std::to_string(out.data_offset) +
                                           ", past the end of the file (" + std::to_string(size) +
                                           " bytes)");
  }
  const std::uint64_t data_bytes = out.data_offset <= size ? size - out.data_offset : 0;
  std::vector<std::size_t> order(out.tensors.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return out.tensors[a].offset < out.tensors[b].offset;
  });
  std::uint64_t covered_to = 0;
  const GgufTensor* previous = nullptr;
  for (std::size_t i : order) {
    GgufTensor& t = out.tensors[i];
    const std::string field = "tensor \"" + printable(t.name) + "\"";
    if (t.offset > data_bytes || t.bytes > data_bytes - t.offset) {
      throw in.error(field, std::string(t.type->name) + " " + shape_text(t.dims) + " takes " +
                                std::to_string(t.bytes) + " bytes at offset " +
                                std::to_string(t.offset) + ", past the data section's " +
                                std::to_string(data_bytes) + " bytes");
    }
    if (previous != nullptr && t.offset < covered_to) {
      throw in.error(field, "its bytes [" + std::to_string(t.offset) + ", " +
                                std::to_string(t.offset + t.bytes) + ") overlap tensor \"" +
                                printable(previous->name) + "\"'s, which end at " +
                                std::to_string(covered_to));
    }
    t.data = file + out.data_offset + t.offset;
    covered_to = t.offset + t.bytes;
    previous = &t;
  }
  return out;
}

bool is_gguf_model(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

bool has_gguf_magic(const std::string& path) {
  if (!is_gguf_model(path)) return false;
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return static_cast<bool>(in.read(magic, 4)) && std::memcmp(magic, "GGUF", 4) == 0;
}

GgufFile::GgufFile(const std::string& path)
    : path_(path), file_(std::make_unique<MappedFile>(path, kMaxGgufFileBytes, 24, "GGUF")) {
  size_ = file_->size();
  contents_ = parse_gguf(file_->data(), size_, path);
}

GgufFile::GgufFile(const std::byte* bytes, std::size_t size, const std::string& name)
    : path_(name), size_(size) {
  contents_ = parse_gguf(bytes, size, name);
}

const GgufValue& GgufFile::at(const std::string& key) const {
  const auto it = contents_.metadata.find(key);
  if (it == contents_.metadata.end()) throw invalid(path_ + ": no metadata key " + key);
  return it->second;
}

std::int64_t GgufFile::integer(const std::string& key) const {
  const GgufValue& v = at(key);
  if (v.type == GgufValueType::kArray || v.type == GgufValueType::kString || !v.is_integer) {
    throw invalid(path_ + ": " + key + " is a " + gguf_value_type_name(v.type) +
                  ", not an integer");
  }
  if (v.type == GgufValueType::kUint64 &&
      v.unsigned_integer > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw invalid(path_ + ": " + key + " is " + std::to_string(v.unsigned_integer) + ", too large");
  }
  return v.integer;
}

double GgufFile::number(const std::string& key) const {
  const GgufValue& v = at(key);
  if (v.type == GgufValueType::kArray || v.type == GgufValueType::kString) {
    throw invalid(path_ + ": " + key + " is a " + gguf_value_type_name(v.type) + ", not a number");
  }
  // A NaN or an infinity would reach a config as JSON null, which reads as absent (the default).
  if (!std::isfinite(v.floating)) {
    throw invalid(path_ + ": " + key + " is " + (std::isnan(v.floating) ? "NaN" : "infinite") +
                  ", not a finite number");
  }
  return v.floating;
}

const std::string& GgufFile::text(const std::string& key) const {
  const GgufValue& v = at(key);
  if (v.type != GgufValueType::kString) {
    throw invalid(path_ + ": " + key + " is a " + gguf_value_type_name(v.type) + ", not a string");
  }
  return v.text;
}

const std::vector<std::string>& GgufFile::strings(const std::string& key) const {
  const GgufValue& v = at(key);
  if (v.type != GgufValueType::kArray || v.element != GgufValueType::kString) {
    throw invalid(path_ + ": " + key + " is not an array of strings");
  }
  return v.strings;
}

const GgufTensor& GgufFile::tensor(const std::string& name) const {
  const auto it = contents_.tensor_index.find(name);
  if (it == contents_.tensor_index.end()) {
    throw invalid(path_ + ": no tensor named " + printable(name));
  }
  return contents_.tensors[it->second];
}

}  // namespace kvo::model
