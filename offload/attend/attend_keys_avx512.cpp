// attend_keys written with AVX-512 intrinsics, for CPUs that have it (picked at run time). The
// portable version converts each block of K and V into an f32 buffer and spends its time on
// horizontal sums and on re-reading that buffer from L2 for each query row; this one reads the
// cache rows in place, lets 4 query rows of a group share each converted K and V vector, sums 16
// dot products at once with one transposing tree, and prefetches the rows of the next block of
// keys a few lines at a time between its multiply-adds.
#include <algorithm>
#include <cstring>

#include "offload/attend/attend_keys.hpp"
#include "offload/util/element_types.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVO_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c")))
#define KVO_AVX512_INLINE KVO_AVX512 __attribute__((always_inline)) inline

namespace kvo::attend {
namespace {

static_assert(kKeyBlock == 16, "one score per lane of a 512-bit vector");

// 16 f32 from 16 elements of type T at p.
template <DType T>
KVO_AVX512 inline __m512 load16(const void* p) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(p);
  } else if constexpr (T == DType::kInt8) {  // before the row's scale
    return _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))));
  } else {
    const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
    if constexpr (T == DType::kF16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// 32 bf16 at p as f32: the even elements (lane i: element 2i) and the odd ones (2i + 1), one
// load and one operation each, where converting in order takes a widening shuffle per 16.
KVO_AVX512_INLINE void load_pairs(const void* p, __m512* even, __m512* odd) {
  const __m512i x = _mm512_loadu_si512(p);
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(x, 16));
  *odd = _mm512_castsi512_ps(_mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
}

// Rows [0, rows) of x [rows][d] to the even-odd layout of load_pairs, each 32 elements in turn
// (to_pairs), or back (from_pairs).
KVO_AVX512_INLINE void to_pairs(const float* x, int rows, int d, float* out) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(rows) * d; i += 32) {
    const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
    const __m512 e = _mm512_permutex2var_ps(a, even, b), o = _mm512_permutex2var_ps(a, odd, b);
    _mm512_storeu_ps(out + i, e);
    _mm512_storeu_ps(out + i + 16, o);
  }
}
KVO_AVX512_INLINE void from_pairs(float* x, int rows, int d) {
  const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  for (std::int64_t i = 0; i < static_cast<std::int64_t>(rows) * d; i += 32) {
    const __m512 e = _mm512_loadu_ps(x + i), o = _mm512_loadu_ps(x + i + 16);
    _mm512_storeu_ps(x + i, _mm512_permutex2var_ps(e, lo, o));
    _mm512_storeu_ps(x + i + 16, _mm512_permutex2var_ps(e, hi, o));
  }
}

// out lane j = the sum of the lanes of a[j], j < 16.
KVO_AVX512 inline __m512 sum_each(const __m512 (&a)[kKeyBlock]) {
  __m512 b[8], c[4], e[2];
  for (int p = 0; p < 8; ++p) {
    b[p] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * p], a[2 * p + 1]),
                         _mm512_unpackhi_ps(a[2 * p], a[2 * p + 1]));
  }
  for (int p = 0; p < 4; ++p) {
    c[p] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * p], b[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(b[2 * p], b[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  for (int p = 0; p < 2; ++p) {
    e[p] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(c[2 * p], c[2 * p + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(e[0], e[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// exp of 16 lanes, the same polynomial as the portable exp_value.
KVO_AVX512 inline __m512 exp16(__m512 x) {
  const __m512 lo = _mm512_set1_ps(-87.33654f), hi = _mm512_set1_ps(88.72283f);
  const __m512 clamped = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(clamped, _mm512_set1_ps(1.44269504088896341f)),
                           _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), clamped);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i e =
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  const __m512 result = _mm512_mul_ps(p, _mm512_castsi512_ps(e));
  const __m512 in_range = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(x, lo, _CMP_GE_OQ), result);
  return _mm512_mask_mov_ps(in_range, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);  // NaN stays
}

constexpr int kRows = 4;  // query rows of a group that share each K and V load
// Each head's rows are prefetched one block of keys ahead, interleaved with the work on the same
// head's rows of this block: the key rows of keys j..j+3 ahead as the scores of keys j..j+3 start,
// the value row of key j ahead as value j is added. Issued all at once per head (128 lines), the
// prefetches filled the line buffers and the core waited for them, so the memory time added to the
// compute time instead of hiding behind it: 0.61-0.64 of the streaming read at 32K-128K keys (2
// threads, Llama-3-8B layer), against 0.75-0.84 interleaved (medians of 5 alternating runs,
// bench/results/host-path-b170e22.md).
// Two blocks ahead, into L2 (_MM_HINT_T1): one block ahead into L1 (T0), as measured best on an
// earlier machine, read at 0.43-0.44 of the streaming read on this one (2 cores of an AVX-512
// EPYC), T1 at 1 block ahead 0.68-0.73, at 2 blocks about the same; one thread from memory
// (bf16, 32K keys): T0 7.3 GB/s, T1 10.7-11.2, T2 10.4-11.1, NTA 6.8-7.3 (bench/results/
// host-attention-*.json, the commit's).
constexpr int kPrefetchBlocks = 2;

// Prefetches elements [e0, e0 + n) of keys [j0, j0 + nb) of kv head g, all of their lines.
template <DType T>
KVO_AVX512_INLINE void prefetch_rows(const KeyRows& from, int g, int e0, int n, int j0, int nb) {
  constexpr auto elem = static_cast<std::int64_t>(element_bytes(T));
  const char* base = static_cast<const char*>(from.base);
  for (int j = 0; j < nb; ++j) {
    const char* row = base + ((j0 + j) * from.token_stride + g * from.head_stride + e0) * elem;
    for (std::int64_t b = 0; b < n * elem; b += 64) _mm_prefetch(row + b, _MM_HINT_T1);
  }
}

template <DType T>
KVO_AVX512_INLINE const char* row_at(const KeyRows& from, int j, int g) {
  constexpr auto elem = static_cast<std::int64_t>(element_bytes(T));
  return static_cast<const char*>(from.base) +
         (j * from.token_stride + g * from.head_stride) * elem;
}

// The scales of kv head g of keys [j0, j0 + 16) of int8 rows (keys past nb repeat the last).
KVO_AVX512_INLINE __m512 row_scales(const KeyRows& from, int g, int j0, int nb) {
  alignas(64) float scales[kKeyBlock];
  const char* base = static_cast<const char*>(from.base) + from.scale_offset + 4 * g;
  for (int j = 0; j < kKeyBlock; ++j) {
    std::memcpy(&scales[j], base + (j0 + std::min(j, nb - 1)) * from.token_stride, 4);
  }
  return _mm512_load_ps(scales);
}

// rows[r] = the scores of query row r (q [kRows][d], kv head g) against keys [j0, j0 + 16)
// (those past nb are not read; their scores are garbage the caller masks). They stay in registers:
// a vector stored and read back in pieces would wait for the store to reach the cache. Prefetches
// the key rows of the first `ahead` keys of the block kPrefetchBlocks ahead.
template <DType T, bool Paired>
KVO_AVX512_INLINE void block_scores(const float* const* q, const KeyRows& k, int g, int d, int j0,
                                    int nb, int ahead, __m512 (&out)[kRows]) {
  static_assert(kRows == 4, "4 rows x 4 keys a vector");
  __m512 t[4];  // t[j4 / 4] lane r * 4 + jj: row r, key j4 + jj
  constexpr auto elem = static_cast<std::int64_t>(element_bytes(T));
  for (int j4 = 0; j4 < kKeyBlock; j4 += 4) {
    __m512 acc[kRows * 4];
#pragma GCC unroll 16
    for (int i = 0; i < kRows * 4; ++i) acc[i] = _mm512_setzero_ps();
    const char* rows[4];
    for (int jj = 0; jj < 4; ++jj) rows[jj] = row_at<T>(k, j0 + std::min(j4 + jj, nb - 1), g);
    prefetch_rows<T>(k, g, 0, d, j0 + kPrefetchBlocks * kKeyBlock + j4,
                     std::max(0, std::min(4, ahead - j4)));
    if constexpr (Paired) {  // 32 bf16 a load: even elements, then odd (q is laid out so)
      for (int e = 0; e < d; e += 32) {
        __m512 even[4], odd[4];
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; ++jj) load_pairs(rows[jj] + e * elem, &even[jj], &odd[jj]);
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
          const __m512 qe = _mm512_loadu_ps(q[r] + e);
          const __m512 qo = _mm512_loadu_ps(q[r] + e + 16);
#pragma GCC unroll 4
          for (int jj = 0; jj < 4; ++jj) {
            acc[r * 4 + jj] = _mm512_fmadd_ps(qe, even[jj], acc[r * 4 + jj]);
            acc[r * 4 + jj] = _mm512_fmadd_ps(qo, odd[jj], acc[r * 4 + jj]);
          }
        }
      }
    } else {
      for (int e = 0; e < d; e += 16) {
        __m512 kj[4];
#pragma GCC unroll 4
        for (int jj = 0; jj < 4; ++jj) kj[jj] = load16<T>(rows[jj] + e * elem);
#pragma GCC unroll 4
        for (int r = 0; r < kRows; ++r) {
          const __m512 qr = _mm512_loadu_ps(q[r] + e);
#pragma GCC unroll 4
          for (int jj = 0; jj < 4; ++jj)
            acc[r * 4 + jj] = _mm512_fmadd_ps(qr, kj[jj], acc[r * 4 + jj]);
        }
      }
    }
    t[j4 / 4] = sum_each(acc);
  }
  // A 4 x 4 transpose of 128-bit lanes: row r's keys j4 + jj from lane r of each t.
  const __m512 u0 = _mm512_shuffle_f32x4(t[0], t[1], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 u1 = _mm512_shuffle_f32x4(t[0], t[1], _MM_SHUFFLE(3, 2, 3, 2));
  const __m512 u2 = _mm512_shuffle_f32x4(t[2], t[3], _MM_SHUFFLE(1, 0, 1, 0));
  const __m512 u3 = _mm512_shuffle_f32x4(t[2], t[3], _MM_SHUFFLE(3, 2, 3, 2));
  out[0] = _mm512_shuffle_f32x4(u0, u2, _MM_SHUFFLE(2, 0, 2, 0));
  out[1] = _mm512_shuffle_f32x4(u0, u2, _MM_SHUFFLE(3, 1, 3, 1));
  out[2] = _mm512_shuffle_f32x4(u1, u3, _MM_SHUFFLE(2, 0, 2, 0));
  out[3] = _mm512_shuffle_f32x4(u1, u3, _MM_SHUFFLE(3, 1, 3, 1));
  if constexpr (T == DType::kInt8) {  // each key's scale, once per score
    const __m512 scales = row_scales(k, g, j0, nb);
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) out[r] = _mm512_mul_ps(out[r], scales);
  }
}

// acc[r] [e0, e0 + 16 W) += sum over keys j < nb of p[r][j] * value j of kv head g, r < rows.
// Prefetches the same columns of the value rows of the first `ahead` keys a block ahead.
template <DType T, int W, bool Paired>
KVO_AVX512_INLINE void accumulate_values(const float* p, int rows, const KeyRows& v, int g, int j0,
                                         int nb, int ahead, int e0, float* const* acc) {
  constexpr auto elem = static_cast<std::int64_t>(element_bytes(T));
  __m512 sums[kRows][W];
#pragma GCC unroll 4
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < W; ++c) sums[r][c] = _mm512_loadu_ps(acc[r] + e0 + 16 * c);
  }
  for (int j = 0; j < nb; ++j) {
    // The same columns of the value row a block ahead.
    if (j < ahead) prefetch_rows<T>(v, g, e0, 16 * W, j0 + kPrefetchBlocks * kKeyBlock + j, 1);
    const char* row = row_at<T>(v, j0 + j, g) + e0 * elem;
    __m512 vj[W];
    if constexpr (Paired) {  // acc laid out as q: each 32 elements, the even then the odd
      static_assert(W % 2 == 0, "whole loads of 32");
#pragma GCC unroll 2
      for (int c = 0; c < W; c += 2) load_pairs(row + 16 * c * elem, &vj[c], &vj[c + 1]);
    } else {
#pragma GCC unroll 4
      for (int c = 0; c < W; ++c) vj[c] = load16<T>(row + 16 * c * elem);
    }
#pragma GCC unroll 4
    for (int r = 0; r < kRows; ++r) {
      const __m512 pr = _mm512_set1_ps(p[r * kKeyBlock + j]);
#pragma GCC unroll 4
      for (int c = 0; c < W; ++c) sums[r][c] = _mm512_fmadd_ps(pr, vj[c], sums[r][c]);
    }
  }
  for (int r = 0; r < rows; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < W; ++c) _mm512_storeu_ps(acc[r] + e0 + 16 * c, sums[r][c]);
  }
}

// The query rows of each group are taken kRows at a time (a group of 3 pads with its last row);
// K and V are read straight from the cache rows, each element converted once per pass. Paired:
// bf16 rows read 32 elements at a time as their even and odd halves (load_pairs), with q and acc
// in that layout.
template <DType T, bool Paired>
KVO_AVX512 void attend(const float* q, int kv_heads, int group, int d, const KeyRows& k,
                       const KeyRows& v, int keys, SoftmaxState* state, float* acc, float softcap) {
  for (int j0 = 0; j0 < keys; j0 += kKeyBlock) {
    const int nb = std::min(kKeyBlock, keys - j0);
    const __mmask16 valid = static_cast<__mmask16>((1u << nb) - 1);
    // Keys of the block kPrefetchBlocks ahead that exist.
    const int ahead = std::max(0, std::min(kKeyBlock, keys - (j0 + kPrefetchBlocks * kKeyBlock)));
    for (int g = 0; g < kv_heads; ++g) {
      for (int r0 = 0; r0 < group; r0 += kRows) {
        // The first pass over the head's rows prefetches the same head's rows a block ahead.
        const int fetch = r0 == 0 ? ahead : 0;
        const int rows = std::min(kRows, group - r0);
        const float* qs[kRows];
        float* accs[kRows];
        for (int r = 0; r < kRows; ++r) {
          const int row = g * group + r0 + std::min(r, rows - 1);
          qs[r] = q + static_cast<std::int64_t>(row) * d;
          accs[r] = acc + static_cast<std::int64_t>(row) * d;
        }
        __m512 scores[kRows];
        block_scores<T, Paired>(qs, k, g, d, j0, nb, fetch, scores);
        if (softcap > 0) {  // scalar tanh, as attend_keys takes it
          alignas(64) float capped[kKeyBlock];
          for (int r = 0; r < rows; ++r) {
            _mm512_store_ps(capped, scores[r]);
            for (int j = 0; j < nb; ++j) capped[j] = soft_cap_value(capped[j], softcap);
            scores[r] = _mm512_load_ps(capped);
          }
        }
        alignas(64) float s[kRows * kKeyBlock];  // the weights, for the values' broadcasts
        for (int r = 0; r < rows; ++r) {
          SoftmaxState& st = state[g * group + r0 + r];
          const __m512 sr = _mm512_mask_mov_ps(_mm512_set1_ps(-INFINITY), valid, scores[r]);
          const float factor = softmax_block_rescale(st, _mm512_reduce_max_ps(sr));
          const __m512 p = exp16(_mm512_sub_ps(sr, _mm512_set1_ps(st.max)));
          st.sum = st.sum * factor + _mm512_reduce_add_ps(p);
          _mm512_store_ps(s + r * kKeyBlock, p);
          if (factor != 1.0f) {
            const __m512 f = _mm512_set1_ps(factor);
            for (int e = 0; e < d; e += 16) {
              _mm512_storeu_ps(accs[r] + e, _mm512_mul_ps(_mm512_loadu_ps(accs[r] + e), f));
            }
          }
        }
        for (int r = rows; r < kRows; ++r) {  // padding rows: weight 0
          _mm512_store_ps(s + r * kKeyBlock, _mm512_setzero_ps());
        }
        if constexpr (T == DType::kInt8) {  // each value's scale, once per weight
          const __m512 scales = row_scales(v, g, j0, nb);
          for (int r = 0; r < rows; ++r) {
            _mm512_store_ps(s + r * kKeyBlock,
                            _mm512_mul_ps(_mm512_load_ps(s + r * kKeyBlock), scales));
          }
        }
        int e0 = 0;
        for (; e0 + 64 <= d; e0 += 64)
          accumulate_values<T, 4, Paired>(s, rows, v, g, j0, nb, fetch, e0, accs);
        if constexpr (!Paired) {
          for (; e0 < d; e0 += 16)
            accumulate_values<T, 1, false>(s, rows, v, g, j0, nb, fetch, e0, accs);
        }
      }
    }
  }
}

}  // namespace

KVO_AVX512 void attend_keys_avx512(const float* q, int kv_heads, int group, int d, KeyRows k,
                                   KeyRows v, int keys, SoftmaxState* state, float* acc, float* kv,
                                   float*, float softcap) {
  const int rows = kv_heads * group;
  // bf16 rows of whole 64s, with q's rows fitting kv's scratch: paired (q and acc laid out so
  // for the call; acc back in order at its end).
  if (avx512_pairs(k.type, d, group)) {
    to_pairs(q, rows, d, kv);
    to_pairs(acc, rows, d, acc);
    attend<DType::kBF16, true>(kv, kv_heads, group, d, k, v, keys, state, acc, softcap);
    from_pairs(acc, rows, d);
    return;
  }
  // f32, f16, bf16 and int8 rows (the caller dequantizes fp8 rows)
  visit(
      k.type,
      [&](auto t) {
        constexpr auto kType = static_cast<DType>(decltype(t)::value);
        if constexpr (kType == DType::kF32 || kType == DType::kF16 || kType == DType::kInt8) {
          attend<kType, false>(q, kv_heads, group, d, k, v, keys, state, acc, softcap);
        } else {
          attend<DType::kBF16, false>(q, kv_heads, group, d, k, v, keys, state, acc, softcap);
        }
      },
      [] {});
}

bool have_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  return yes;
}

}  // namespace kvo::attend

#else

namespace kvo::attend {

// Not built for this machine: have_avx512() says so, and nothing calls the kernel.
void attend_keys_avx512(const float*, int, int, int, KeyRows, KeyRows, int, SoftmaxState*, float*,
                        float*, float*, float) {}

bool have_avx512() {
  return false;
}

}  // namespace kvo::attend

#endif
