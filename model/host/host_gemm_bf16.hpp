// The host path's GEMM for bf16 weights on CPUs with AVX512_BF16 (VDPBF16PS): the weights are
// multiplied as they are stored, the activations rounded to bf16 (round to nearest even), the
// products summed in f32. Twice the multiply-adds per instruction of an f32 GEMM, and no f32 copy
// of the weights; what it costs in accuracy is the rounding of the activations, 2^-8 relative,
// as every bf16 engine (the CUDA path's cuBLAS calls included) rounds them.
//
// Each output is the same sum in the same order (pairs of inputs, first to last) wherever its
// row and column fall in a tile, so a GEMM's results do not depend on the tiling or the thread
// count. (HostLinear sends calls of fewer than kGemmMinRows rows to its f32 row kernel instead,
// which sums in another order: a row's bits can differ between a short call and a long one.)
// Error: |y - x W^T| <= (2^-8 + gamma_in (1 + 2^-8)) sum_i |x_i| |w_i| (+ in * 2^-126, the
// instruction flushes subnormals), gamma_in = in u / (1 - in u), u = 2^-24.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvo::model::bf16_gemm {

// Output columns and input rows of one tile; the panel of a tile's weights is kCols x in.
inline constexpr int kCols = 128;
inline constexpr int kRows = 8;  // rows of x multiplied together

// Whether this CPU runs the kernel (AVX-512 F/BW/VL/DQ and AVX512_BF16) and this build has it
// (defined beside the host workspace's layout, which sizes the kernel's scratch by it).
bool available();

inline constexpr int kChunkPairs = 256;  // pairs of inputs per chunk: a 128 KiB panel

// Bytes of scratch one call needs (at any `in`): the packed weight panel [kChunkPairs][kCols]
// pairs, then kRows converted rows of x, [kChunkPairs] pairs each.
inline std::size_t scratch_bytes(int /*in*/) {
  return (static_cast<std::size_t>(kChunkPairs) * kCols +
          static_cast<std::size_t>(kChunkPairs) * kRows) *
         sizeof(std::uint32_t);
}

// y [rows][cols] (row stride ld_y) = bf16(x) [rows][in] (row stride ld_x) W^T, or += with
// `accumulate`; W [cols][in] bf16 (row stride in), cols <= kCols. `scratch` holds
// scratch_bytes(in), any alignment of a float (every access is unaligned). REQUIRES: available().
void multiply(const float* x, int rows, int in, std::int64_t ld_x, const std::uint16_t* w, int cols,
              bool accumulate, float* y, std::int64_t ld_y, void* scratch);

}  // namespace kvo::model::bf16_gemm
