// The inner loop of decode attention on the host: a block of query rows of every kv head against
// keys read in place from the cache's rows, with an online softmax. A portable build (plain loops,
// cloned per x86-64 level) and one written with AVX-512 intrinsics, picked at run time.
#pragma once

#include <cstdint>

#include "offload/attend/softmax.hpp"
#include "offload/util/element_types.hpp"

namespace kvo::attend {

// Rows of K or V of one slot: token j, kv head g at `base` + j * token_stride + g * head_stride
// elements of `type`. int8 and fp8 rows (attend_keys_avx512 only): the elements are bytes, and row
// j's kv_heads float scales start scale_offset bytes into it (kvoffload/quant.hpp's rows).
struct KeyRows {
  const void* base = nullptr;
  std::int64_t token_stride = 0;
  std::int64_t head_stride = 0;
  DType type = DType::kF32;
  std::int64_t scale_offset = 0;
};

constexpr int kKeyBlock = 16;  // keys per step of attend_keys

// The online softmax of the query rows of every kv head, q [kv_heads * group][head_dim] (already
// scaled by 1/sqrt(head_dim); row g * group + r belongs to kv head g), over keys [0, keys): on
// return state[row] holds the max score and the sum of exp(score - max), and acc [row][head_dim]
// the values weighted by the same exponentials. Both start from "nothing seen" (state default,
// acc zero) and may continue a previous call. A block of keys is converted for all heads at once,
// so K and V are read front to back. softcap > 0: each score becomes soft_cap_value(score,
// softcap) first. Scratch: kv [kKeyBlock][kv_heads][head_dim], scores [kv_heads * group]
// [kKeyBlock].
void attend_keys(const float* q, int kv_heads, int group, int head_dim, KeyRows k, KeyRows v,
                 int keys, SoftmaxState* state, float* acc, float* kv, float* scores,
                 float softcap);

// attend_keys with AVX-512 intrinsics (attend_keys_avx512.cpp), the same results up
// to rounding; it also reads int8 and fp8 rows in place (each key's scale applied to its score,
// each value's to its weight; fp8 through f16, exactly, or with VBMI attend_keys_fp8_vbmi; int8
// with VNNI: attend_keys_int8_vnni).
// REQUIRES: have_avx512(), head_dim a multiple of 16.
void attend_keys_avx512(const float* q, int kv_heads, int group, int head_dim, KeyRows k, KeyRows v,
                        int keys, SoftmaxState* state, float* acc, float* kv, float* scores,
                        float softcap);
bool have_avx512();
bool have_avx512_vnni();

// attend_keys_avx512 for int8 rows with AVX-512 VNNI (attend_keys_vnni.cpp), which
// attend_keys_avx512 hands them to where avx512_vnni_rows holds: the products
// in 16-bit integers, summed exactly in int32 lanes. The query is rounded to 16 bits per row (steps
// of its largest element / 32767) and the weights to 16 bits per row and block of kKeyBlock keys
// (steps of the block's largest / 32767): each error at most half a step, 2^-16 of the largest
// where the rows' own rounding to int8 is 2^-8 of theirs. The query's 16-bit copy is kept in the kv
// scratch, the scales in `scores`. REQUIRES: avx512_vnni_rows(k.type, ...).
void attend_keys_int8_vnni(const float* q, int kv_heads, int group, int head_dim, KeyRows k,
                           KeyRows v, int keys, SoftmaxState* state, float* acc, float* kv,
                           float* scores, float softcap);
// Whether attend_keys_avx512 takes attend_keys_int8_vnni for these rows on this CPU: int8 rows
// whose head_dim is a multiple of 32 and at most 256 (the int32 sums of 16-bit products stay below
// 2^31), q's 16-bit rows fitting the kv scratch, and a CPU with VNNI.
inline bool avx512_vnni_rows(DType type, int head_dim, int group) {
  return type == DType::kInt8 && head_dim % 32 == 0 && head_dim <= 256 && group <= 2 * kKeyBlock &&
         have_avx512_vnni();
}
// attend_keys_avx512 for fp8 (e4m3) rows with AVX-512 VBMI (attend_keys_vbmi.cpp), which
// attend_keys_avx512 hands them to where avx512_vbmi_rows holds: each byte becomes the f32 of its
// code through two byte-table permutes (its bf16's high and low bytes) and one more placing them,
// 32 elements at a time; exact for every code, NaN's included. Scratch unused.
void attend_keys_fp8_vbmi(const float* q, int kv_heads, int group, int head_dim, KeyRows k,
                          KeyRows v, int keys, SoftmaxState* state, float* acc, float* kv,
                          float* scores, float softcap);
bool have_avx512_vbmi();
inline bool avx512_vbmi_rows(DType type) {
  return type == DType::kFP8E4M3 && have_avx512_vbmi();
}
// Whether attend_keys_avx512 reads rows of `type` as even and odd halves (bf16 rows of whole 64s,
// a group of at most kKeyBlock rows: q's rows then fit the kv scratch).
inline bool avx512_pairs(DType type, int head_dim, int group) {
  return type == DType::kBF16 && head_dim % 64 == 0 && group <= kKeyBlock;
}

}  // namespace kvo::attend
