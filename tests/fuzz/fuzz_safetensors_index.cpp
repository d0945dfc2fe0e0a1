// libFuzzer target: model.safetensors.index.json. Either it is refused with kvo::Error, or every
// shard it names is a plain file name (nothing that leaves the model directory), each listed
// once, and every tensor maps to one of them.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kvoffload/error.hpp"
#include "model/checkpoint/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  kvo::model::ShardIndex index;
  try {
    index = kvo::model::parse_safetensors_index(text, "fuzz.index.json");
  } catch (const kvo::Error&) {
    return 0;
  }
  for (const std::string& shard : index.shards) {
    if (shard.empty() || shard == "." || shard == ".." ||
        shard.find_first_of(std::string("/\\\0", 3)) != std::string::npos) {
      std::abort();
    }
    if (std::count(index.shards.begin(), index.shards.end(), shard) != 1) std::abort();
  }
  for (const auto& [tensor, shard] : index.shard_of) {
    if (std::find(index.shards.begin(), index.shards.end(), shard) == index.shards.end()) {
      std::abort();
    }
  }
  return 0;
}
