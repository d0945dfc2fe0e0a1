// libFuzzer target: a whole GGUF file through the weight check and the load (layer indices in
// tensor names, the rows of q and k put back in the order of the decoder's rotation, blocks (and
// for the host f16/bf16 matrices) kept or dequantized into the layout's dtype). Either it is
// refused with kvo::Error, or every byte the load uploads lands inside the layout's arena, each
// tensor's bytes exactly once.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/gguf_config.hpp"
#include "model/checkpoint/gguf_weights.hpp"
#include "model/checkpoint/weights.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const kvo::model::GgufFile file(reinterpret_cast<const std::byte*>(data), size, "fuzz.gguf");
    const kvo::model::ModelConfig c = kvo::model::gguf_model_config(file);
    const kvo::model::WeightLayout plain(c, kvo::DType::kF32);
    kvo::model::check_gguf_weights(plain, file);
    for (const bool half : {true, false}) {  // the host's layout (f16/bf16 kept), CUDA's
      const kvo::model::WeightLayout layout(c, kvo::DType::kF32,
                                            kvo::model::gguf_kept_matrices(plain, file, half));
      // The arena's bytes, each counted as it is written: a layout of a fuzzed config may be
      // large, but the tensors it needs are in the file, so its bytes are bounded by the input's.
      if (layout.bytes() > (std::size_t{64} << 20)) return 0;
      std::vector<std::uint8_t> written(layout.bytes(), 0);
      kvo::model::load_gguf_weights(
          layout, file, [&](std::size_t offset, const void*, std::size_t bytes) {
            if (offset > written.size() || bytes > written.size() - offset) {
              std::abort();
            }
            for (std::size_t i = 0; i < bytes; ++i) {
              if (written[offset + i]++ != 0) std::abort();
            }
          });
      // Every tensor of the layout was written whole.
      for (const kvo::model::WeightEntry& e : layout.entries()) {
        for (std::size_t i = 0; i < layout.entry_bytes(e); ++i) {
          if (written[e.offset + i] != 1) std::abort();
        }
      }
    }
  } catch (const kvo::Error&) {
  }
  return 0;
}
