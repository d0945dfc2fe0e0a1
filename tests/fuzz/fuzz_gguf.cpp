// libFuzzer target: a whole GGUF file. Either it is refused with kvo::Error, or every tensor it
// accepts lies inside the data section at an aligned offset, its bytes are its dimensions'
// product over its type's block times the block's bytes, and no two tensors overlap.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/checkpoint/gguf.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* file = reinterpret_cast<const std::byte*>(data);
  kvo::model::GgufContents c;
  try {
    c = kvo::model::parse_gguf(file, size, "fuzz.gguf");
  } catch (const kvo::Error&) {
    return 0;
  }
  if (c.version != 3 || c.alignment == 0 || (c.alignment & (c.alignment - 1)) != 0) std::abort();
  if (c.data_offset % c.alignment != 0) std::abort();
  std::vector<std::pair<std::uint64_t, std::uint64_t>> spans;
  for (const kvo::model::GgufTensor& t : c.tensors) {
    if (t.offset % c.alignment != 0 || t.data != file + c.data_offset + t.offset) std::abort();
    if (t.data + t.bytes > file + size || t.dims.empty() || t.dims[0] % t.type->block != 0) {
      std::abort();
    }
    if (static_cast<std::uint64_t>(t.elements()) / t.type->block * t.type->block_bytes != t.bytes) {
      std::abort();
    }
    spans.emplace_back(t.offset, t.offset + t.bytes);
  }
  std::sort(spans.begin(), spans.end());
  for (std::size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) std::abort();
  }
  return 0;
}
