// Quantized weight formats as GGUF files lay a model out: which block type each tensor gets and
// the bytes that makes, for planning device memory before such a file is in hand (kvo-vram
// --weights). The recipes are llama.cpp's quantizer's for these names:
//   q8_0    every matrix Q8_0
//   int8    every matrix int8 per output channel, kept as Q8_0 blocks sharing the row's scale
//           (weights.hpp quantize_int8_rows): q8_0's bytes
//   q4_k_m  matrices Q4_K; attn_v and ffn_down Q6_K in the layers that get more bits (the first
//           and last eighth, and every third layer between); the output matrix Q6_K (the
//           embedding when the two are tied), the embedding otherwise Q4_K
//   q5_k_m  as q4_k_m with Q5_K for Q4_K
// A K-quant needs rows of a multiple of 256 elements; other rows fall back as llama.cpp falls
// back (Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0). Norms and biases stay f32. Each tensor is
// counted at its place in the device arena (rounded up to 256 bytes, as WeightLayout rounds).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/checkpoint/model_config.hpp"

namespace kvo::model {

std::vector<std::string> weight_format_names();  // q8_0, int8, q4_k_m, q5_k_m

// Bytes of `config`'s weights in `format`. Throws kvo::Error(kInvalidArgument) for a format not
// listed, or a family whose layout these recipes do not cover (Phi-3's fused projections).
std::uint64_t quantized_weight_bytes(const ModelConfig& config, const std::string& format);

// Refuses (kvo::Error kInvalidArgument) a format asked of a GGUF file (`checkpoint`), whose
// weights come in its own blocks: the formats quantize a safetensors checkpoint or drawn
// weights. Kvo-generate and kvo-vram refuse the same combinations.
void check_weight_format_source(const std::string& format, const std::string& checkpoint);

}  // namespace kvo::model
