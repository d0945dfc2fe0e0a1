// The inner loops of the host path. Each is compiled for three x86-64 levels (AVX-512, AVX2 with
// FMA, and the SSE2 baseline every x86-64 has) and the loader picks the one the CPU runs; other
// targets get one portable build. They are plain loops over blocks of kLanes floats, which the
// compiler turns into vectors of the level's width: the order of every sum is fixed by the source,
// so the levels differ only in whether a multiply-add is fused.
#pragma once

#include <cstddef>
#include <cstdint>

#include "model/common/numerics.hpp"
#include "offload/attend/attend_keys.hpp"
#include "offload/attend/row_math.hpp"

namespace kvo::model::kernels {

using attend::rows::kLanes;

// dst [count] = src [count] of `type`, exactly (an f16 NaN stays a NaN, quieted on AVX-512).
void to_f32(const void* src, DType type, std::int64_t count, float* dst);
// dst [count] of `type` = src [count], rounded to nearest even (as store_elem).
void from_f32(const float* src, std::int64_t count, DType type, void* dst);

// gate [count] = silu(gate) * up.
void swiglu(float* gate, const float* up, std::int64_t count);
// gate [count] = gelu_tanh(gate) * up (numerics.hpp).
void geglu_tanh(float* gate, const float* up, std::int64_t count);
// x [count] += y * scale (the product rounded first; scale 1: y).
void add(float* x, const float* y, std::int64_t count, float scale);
// x [count] *= factor.
void scale(float* x, std::int64_t count, float factor);
// x [count] = soft_cap_value(x, cap) (numerics.hpp).
void soft_cap(float* x, std::int64_t count, float cap);
// out [rows][h] = x / sqrt(mean(x^2) + eps) * w, the mean of squares summed in double.
void rms_norm_rows(const float* x, int rows, int h, const float* w, float eps, float* out);

// y[t * ldy + o] = dot(x[t * ldx ...], row o of w) + bias[o] (added to y[...] when
// `accumulate`) for t < rows, o in [o0, o1). w [out][in] is of `type`, bias [out] (or null) of
// `bias_type` (the model dtype: an f32 model's kept f16 matrix has f32 biases); a row of w that
// is not f32 is converted into `row` [in] first. Each element of y is computed the same way
// whatever rows, o0 and o1 are, so a decode batch gives each slot the bits it gets alone.
void linear_rows(const float* x, int rows, std::int64_t ldx, int in, const void* w, DType type,
                 DType bias_type, const void* bias, int o0, int o1, float* y, std::int64_t ldy,
                 bool accumulate, float* row);

// dst [rows][in] = rows of a matrix in GGUF blocks of ggml type `blocks`
// (model/checkpoint/ggml_blocks.hpp), the first at `src`, each in / block elements blocks. The
// reference's arithmetic: every product in it is exact in f32 (at most 11 + 6 + 5 significant
// bits) or a lone rounding, so a fused multiply-add gives the same bits and every level does.
void dequantize_rows(std::uint32_t blocks, const void* src, int rows, int in, float* dst);

// linear_rows for w [out][in] in GGUF blocks of type `blocks`, bias [out] (or null) in
// `bias_type`: each row dequantized into `row` [in] (dequantize_rows), then dot() with every x
// row, so every element of y has the bits the row expanded to f32 gives.
void linear_rows_blocks(const float* x, int rows, std::int64_t ldx, int in, const void* w,
                        std::uint32_t blocks, DType bias_type, const void* bias, int o0, int o1,
                        float* y, std::int64_t ldy, bool accumulate, float* row);

// linear_rows for f16 and bf16 w, with AVX-512 intrinsics (model/host/host_blocks_avx512.cpp):
// the same bits where dot() is built in target clones (GCC; linear_rows uses it only there), each
// 16 weights widened in a register and multiplied into up to 8 x rows at once, so w is read once
// per 8 rows instead of being converted into `row` and read again. Returns false, doing nothing,
// for another type or `in` not a multiple of 16. REQUIRES: have_avx512().
bool linear_rows_avx512(const float* x, int rows, std::int64_t ldx, int in, const void* w,
                        DType type, DType bias_type, const void* bias, int o0, int o1, float* y,
                        std::int64_t ldy, bool accumulate);

// to_f32 for f16 with vcvtph2ps (model/host/host_blocks_avx512.cpp): the same values (a NaN
// stays a NaN, quieted). Returns false, doing nothing, where the build has no AVX-512 kernels.
// REQUIRES: have_avx512().
bool f16_to_f32_avx512(const void* src, std::int64_t count, float* dst);

// linear_rows_blocks for one x row, with AVX-512 intrinsics (model/host/host_blocks_avx512.cpp):
// the same bits where dot() is built in target clones (GCC; linear_rows_blocks uses it only
// there), each block dequantized in registers. Returns false, doing nothing, for a type it does
// not serve (Q5_K). REQUIRES: have_avx512().
bool linear_row_blocks_avx512(const float* x, int in, const void* w, std::uint32_t blocks,
                              DType bias_type, const void* bias, int o0, int o1, float* y,
                              bool accumulate);

// Decoding rows against GGUF blocks with the activations quantized to 8 bits ("q8 activations",
// model/host/host_blocks_q8.cpp), for Q8_0, Q4_0, Q4_1, Q4_K and Q6_K weights: the x row is
// quantized once (quantize_activation_q8: per 32 elements for the 32-element types, per 256 for
// the K types, x = d * q, q in [-127, 127], d = max |x| / 127), then each block's integer products
// are summed exactly and scaled in f32. Not the bits of the expanded row: the result is the dot
// product of the weights with the quantized row (dequantize_activation_q8), rounded in f32 once per
// block; what quantizing x costs is bounded by sum |w| * d / 2 per group.
bool q8_activations_serve(std::uint32_t blocks);
// Bytes of a quantized row of `in` elements (in a multiple of the type's block): d [in / 32]
// (at most), sums [in / 16] (at most), q [in].
inline std::size_t q8_activation_bytes(int in) {
  return static_cast<std::size_t>(in / 32) * 4 + static_cast<std::size_t>(in / 16) * 4 +
         static_cast<std::size_t>(in);
}
// "AVX512-VNNI" where the CPU has it, else "portable" (plain loops).
const char* q8_activation_kernel();
// `portable`: the plain loops even where the CPU has VNNI (tests; the same bytes).
void quantize_activation_q8(std::uint32_t blocks, const float* x, int in, void* dst,
                            bool portable = false);
// The quantizer itself: x [in] by groups of `group` elements (x = d q, q in [-127, 127] rounded to
// nearest even, d = max |x| / 127, a NaN to -127) into d [in / group], q [in] (in Q4_K's decode
// order with `k4_order`) and the sums of q over each `sum_group` elements, sums [in / sum_group].
void quantize_q8_groups(const float* x, int in, int group, int sum_group, bool k4_order, float* d,
                        std::int32_t* sums, std::int8_t* q, bool portable = false);
// x [in] = the values a quantized row stands for (tests).
void dequantize_activation_q8(std::uint32_t blocks, const void* src, int in, float* x);
// y[o] = (row o of w) . (the quantized row xq) + bias[o] (added to y[o] when `accumulate`), o in
// [o0, o1); `portable`: the plain loops even where the CPU has VNNI (tests).
void linear_row_blocks_q8(const void* xq, int in, const void* w, std::uint32_t blocks,
                          DType bias_type, const void* bias, int o0, int o1, float* y,
                          bool accumulate, bool portable = false);

// Decode attention's kernels (offload/attend/attend_keys.hpp), by the names the model's code uses.
using attend::attend_keys;
using attend::attend_keys_avx512;
using attend::have_avx512;
using attend::KeyRows;
using attend::kKeyBlock;
// AVX-512 with VNNI (vpdpbusd), where this build has code for it (the q8 activation kernels).
bool have_avx512_vnni();

// One key block of the blocked prefill attention: s [rows][lds] holds the (scaled, and
// soft-capped where the model caps) scores of `rows` query rows against keys [key0, key0 + keys);
// row i sees keys [first[i], last[i]]. The
// visible scores become exp(score - running max) and the others 0; state[i] moves on, and o [rows]
// [head_dim], the row's accumulated values, is rescaled to the new max.
void softmax_block(float* s, int rows, int keys, std::int64_t lds, int key0, const int* first,
                   const int* last, SoftmaxState* state, float* o, int head_dim);

}  // namespace kvo::model::kernels
