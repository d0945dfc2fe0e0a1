// The host path's prefill GEMM for weights in GGUF blocks with the activations quantized to 8 bits
// (kvo-generate --activations q8): integer products summed exactly with AVX512-VNNI (vpdpbusd),
// then scaled in f32 once per sub-block, as llama.cpp multiplies such weights. About two and a
// half times the multiply-adds per instruction of an f32 GEMM over a dequantized panel.
//
// The weights: each 32 elements of a row as 32 unsigned codes u, a scale per 16 (per 32 but for
// Q6_K) and an offset m (ggml_blocks.hpp codes_part), w = scale (u - code_offset) + m. A tile of
// weight rows is repacked once per task into groups of 16 rows, the codes interleaved 4 bytes a
// row, so that one 64-byte load meets one broadcast of 4 activations.
// The activations: each row quantized by groups of 32 (x = d q, q in [-127, 127], d = max |x| /
// 127, as the decode rows' q8 kernels quantize the 32-element types).
//
// Output o of token t: over the sub-blocks b of the row, in order,
//   s_b = sum (u - code_offset) q (exact in int32), p_b = f32(s_b) * d_b (rounded),
//   acc = fma(p_b, scale_b, acc), then acc = fma(m_b, d_b * sum q, acc) where m != 0 (Q4_1, Q4_K,
//   Q5_K), from acc = 0; y = acc + bias. The same bits with VNNI and with the plain loops, and
// whatever the tile, the thread count or the other rows of the call. What it computes is the
// product of the weights with the quantized activations, within the rounding of those f32 steps.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/checkpoint/ggml_blocks.hpp"
#include "model/common/numerics.hpp"

namespace kvo::model::q8_gemm {

// Whether the GEMM serves weights of ggml type `type`: Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K.
bool serves(std::uint32_t type);
// Whether this CPU runs the VNNI kernel (AVX-512 F/BW/VL and AVX512-VNNI) and this build has it.
bool available();

// Elements a weight scale covers: 16 for Q6_K, 32 for the others.
inline int sub_block(std::uint32_t type) {
  return type == blocks::kQ6_K ? 16 : 32;
}
// Bytes of one quantized activation row of `in` elements for weights of `type`, a multiple of 64:
// q [in], then per sub-block an int32 and two floats, the group scales [in / 32] and the sums
// [in / sub-block].
inline std::size_t activation_row_bytes(std::uint32_t type, int in) {
  const std::size_t subs = static_cast<std::size_t>(in / sub_block(type));
  const std::size_t bytes =
      static_cast<std::size_t>(in) + 12 * subs + 4 * static_cast<std::size_t>(in / 32) + 4 * subs;
  return (bytes + 63) / 64 * 64;
}
// dst (activation_row_bytes) = x [in] quantized for weights of `type`. `portable`: the plain
// loops even where the CPU has VNNI (the same bytes).
void quantize_row(std::uint32_t type, const float* x, int in, void* dst, bool portable = false);

// Bytes of the repacked panel of `rows` weight rows of `in` elements.
std::size_t panel_bytes(std::uint32_t type, int rows, int in);
// panel = rows [rows][in] of a matrix in blocks of `type` (the first at w), repacked.
void pack(std::uint32_t type, const void* w, int rows, int in, void* panel);

// y[t * ldy + o] = row o of the packed panel . quantized row t (+ bias[o0 + o], of bias_type, or
// added to y with `accumulate`) for t < n, o < rows; xq: n quantized rows, activation_row_bytes
// apart. `portable`: the plain loops (the same bits). REQUIRES: available() unless portable.
void multiply(std::uint32_t type, const void* panel, int rows, int in, const void* xq, int n,
              DType bias_type, const void* bias, int o0, float* y, std::int64_t ldy,
              bool accumulate, bool portable = false);

}  // namespace kvo::model::q8_gemm
