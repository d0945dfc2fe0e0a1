// One decoding row against a matrix in GGUF blocks, with AVX-512 intrinsics: each 16 weights are
// dequantized in a register (the block's bytes widened, masked and shifted, converted, scaled)
// and multiplied into 16 partial sums with the same fused multiply-add that dot() compiles to at
// this level, in the same order, so every output has the bits of the row expanded to f32
// (linear_rows_blocks' contract). Every product inside a block's formula is exact in f32 or a
// lone rounding (model/checkpoint/ggml_blocks.hpp), so fusing the scale and the offset
// (d * q + m, ds * q - dm) gives the reference's weights too. The row is read once, at memory
// speed, instead of being written out as f32 and read back. f16 and bf16 rows likewise
// (linear_rows_avx512): each 16 weights widened in a register, exactly, for up to 8 x rows.
#include <cstring>

#include "model/checkpoint/ggml_blocks.hpp"
#include "model/host/host_kernels.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVO_AVX512 __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,fma,f16c")))
#define KVO_AVX512_INLINE KVO_AVX512 __attribute__((always_inline)) inline

namespace kvo::model::kernels {
namespace {

// 16 bytes widened to 16 int32 lanes.
KVO_AVX512_INLINE __m512i bytes16(const std::uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

KVO_AVX512_INLINE float half(const std::uint8_t* p) {
  return blocks::half_to_float(blocks::u16_at(p));
}

// acc += x[0, 16) * w16, lane by lane (dot()'s fused multiply-add).
KVO_AVX512_INLINE __m512 madd(const float* x, __m512 w16, __m512 acc) {
  return _mm512_fmadd_ps(_mm512_loadu_ps(x), w16, acc);
}

KVO_AVX512_INLINE __m512 q8_0(const std::uint8_t* b, const float* x, __m512 acc) {
  const __m512 d = _mm512_set1_ps(half(b));
  for (int i = 0; i < 32; i += 16) {
    const __m512i q =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2 + i)));
    acc = madd(x + i, _mm512_mul_ps(_mm512_cvtepi32_ps(q), d), acc);
  }
  return acc;
}

KVO_AVX512_INLINE __m512 q4_0(const std::uint8_t* b, const float* x, __m512 acc) {
  const __m512 d = _mm512_set1_ps(half(b));
  const __m512i bytes = bytes16(b + 2);
  const __m512i eight = _mm512_set1_epi32(8);
  const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(bytes, _mm512_set1_epi32(15)), eight);
  const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(bytes, 4), eight);
  acc = madd(x, _mm512_mul_ps(d, _mm512_cvtepi32_ps(lo)), acc);
  return madd(x + 16, _mm512_mul_ps(d, _mm512_cvtepi32_ps(hi)), acc);
}

KVO_AVX512_INLINE __m512 q4_1(const std::uint8_t* b, const float* x, __m512 acc) {
  const __m512 d = _mm512_set1_ps(half(b));
  const __m512 m = _mm512_set1_ps(half(b + 2));
  const __m512i bytes = bytes16(b + 4);
  const __m512i lo = _mm512_and_si512(bytes, _mm512_set1_epi32(15));
  const __m512i hi = _mm512_srli_epi32(bytes, 4);
  acc = madd(x, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(lo), m), acc);
  return madd(x + 16, _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(hi), m), acc);
}

KVO_AVX512_INLINE __m512 q4_k(const std::uint8_t* b, const float* x, __m512 acc) {
  const float d = half(b);
  const float dmin = half(b + 2);
  const std::uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    int sc = 0, m = 0;
    blocks::scale_min_k4(j, b + 4, &sc, &m);
    const __m512 ds = _mm512_set1_ps(d * static_cast<float>(sc));
    const __m512 dm = _mm512_set1_ps(dmin * static_cast<float>(m));
    const std::uint8_t* q = qs + 32 * (j / 2);
    for (int l = 0; l < 32; l += 16) {
      __m512i v = bytes16(q + l);
      v = (j % 2 == 0) ? _mm512_and_si512(v, _mm512_set1_epi32(15)) : _mm512_srli_epi32(v, 4);
      acc = madd(x + 32 * j + l, _mm512_fmsub_ps(ds, _mm512_cvtepi32_ps(v), dm), acc);
    }
  }
  return acc;
}

KVO_AVX512_INLINE __m512 q6_k(const std::uint8_t* b, const float* x, __m512 acc) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* scales = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = half(b + 208);
  for (int h = 0; h < 2; ++h) {
    for (int k = 0; k < 4; ++k) {
      const std::uint8_t* low = ql + 64 * h + 32 * (k % 2);
      for (int l = 0; l < 32; l += 16) {
        const __m512 ds = _mm512_set1_ps(d * static_cast<float>(scales[8 * h + 2 * k + l / 16]));
        const __m512i nibble = _mm512_and_si512(_mm512_srli_epi32(bytes16(low + l), 4 * (k / 2)),
                                                _mm512_set1_epi32(15));
        const __m512i high = _mm512_and_si512(_mm512_srli_epi32(bytes16(qh + 32 * h + l), 2 * k),
                                              _mm512_set1_epi32(3));
        const __m512i q = _mm512_sub_epi32(_mm512_or_si512(nibble, _mm512_slli_epi32(high, 4)),
                                           _mm512_set1_epi32(32));
        acc = madd(x + 128 * h + 32 * k + l, _mm512_mul_ps(ds, _mm512_cvtepi32_ps(q)), acc);
      }
    }
  }
  return acc;
}

template <std::uint32_t kType>
KVO_AVX512_INLINE __m512 block_madd(const std::uint8_t* b, const float* x, __m512 acc) {
  if constexpr (kType == blocks::kQ8_0) return q8_0(b, x, acc);
  if constexpr (kType == blocks::kQ4_0) return q4_0(b, x, acc);
  if constexpr (kType == blocks::kQ4_1) return q4_1(b, x, acc);
  if constexpr (kType == blocks::kQ4_K) return q4_k(b, x, acc);
  if constexpr (kType == blocks::kQ6_K) return q6_k(b, x, acc);
  return acc;
}

// dot()'s end for one row's 16 partial sums: the lanes summed pairwise, halves first, then + 0
// for the (empty) tail, then the bias.
KVO_AVX512_INLINE float end_sum(__m512 acc, float bias) {
  alignas(64) float a[16];
  _mm512_store_ps(a, acc);
  for (int width = 8; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) a[j] += a[j + width];
  }
  const float tail = 0;
  return (a[0] + tail) + bias;
}

// kOut rows of w from o, block by block: their sums are independent chains, so the core overlaps
// one row's dequantization and multiply-adds with another's. One row at a time, the random
// 8-layer models of bench/gguf_vs_llama_cpp.py decoded at 13.5 (Q4_K), 15.4 (Q8_0) and 15.3
// (Q4_0) tokens/s on 2 cores; with these counts at 20.2, 16.4 and 19.3 (Q6_K: 17.2 either way;
// measured for 7ec368b on a 2-core Intel Xeon VM).
template <std::uint32_t kType, int kOut>
KVO_AVX512_INLINE void block_tile(const float* x, int in, const std::uint8_t* w,
                                  std::size_t row_bytes, DType bias_type, const void* bias, int o,
                                  float* y, bool accumulate) {
  const int per_block = blocks::block_elements(kType);
  const int block_bytes = blocks::block_bytes(kType);
  __m512 acc[kOut];
  for (int c = 0; c < kOut; ++c) acc[c] = _mm512_setzero_ps();
  const std::uint8_t* b = w + static_cast<std::size_t>(o) * row_bytes;
  for (int at = 0; at < in; at += per_block, b += block_bytes) {
    for (int c = 0; c < kOut; ++c) acc[c] = block_madd<kType>(b + c * row_bytes, x + at, acc[c]);
  }
  for (int c = 0; c < kOut; ++c) {
    const float value = end_sum(acc[c], bias != nullptr ? load_elem(bias, o + c, bias_type) : 0.0f);
    y[o + c] = accumulate ? y[o + c] + value : value;
  }
}

template <std::uint32_t kType>
KVO_AVX512 void rows_of(const float* x, int in, const std::uint8_t* w, DType bias_type,
                        const void* bias, int o0, int o1, float* y, bool accumulate) {
  // Rows at once, per type as measured: Q6_K's block keeps many registers live, so it takes one.
  constexpr int kOut = kType == blocks::kQ6_K                             ? 1
                       : kType == blocks::kQ4_K || kType == blocks::kQ8_0 ? 4
                                                                          : 2;
  const std::size_t row_bytes = static_cast<std::size_t>(in / blocks::block_elements(kType)) *
                                static_cast<std::size_t>(blocks::block_bytes(kType));
  int o = o0;
  for (; o + kOut <= o1; o += kOut) {
    block_tile<kType, kOut>(x, in, w, row_bytes, bias_type, bias, o, y, accumulate);
  }
  for (; o < o1; ++o) block_tile<kType, 1>(x, in, w, row_bytes, bias_type, bias, o, y, accumulate);
}

// 16 f16 or bf16 weights widened to f32, exactly (vcvtph2ps; bf16: the bits shifted up).
template <DType kType>
KVO_AVX512_INLINE __m512 widen16(const std::uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if constexpr (kType == DType::kBF16) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  } else {
    return _mm512_cvtph_ps(h);
  }
}

// kRows x rows against kOut rows of w [out][in] (f16 or bf16) from o: each 16 weights widened
// once and multiplied into every x row's 16 partial sums. The kRows x kOut sums are independent
// chains of multiply-adds, so the core overlaps them; each is one (x row, w row) pair's sum in
// dot()'s order.
template <DType kType, int kRows, int kOut>
KVO_AVX512_INLINE void half_tile(const float* x, std::int64_t ldx, int in, const std::uint16_t* w,
                                 DType bias_type, const void* bias, int o, float* y,
                                 std::int64_t ldy, bool accumulate) {
  __m512 acc[kOut][kRows];
  for (int c = 0; c < kOut; ++c) {
    for (int r = 0; r < kRows; ++r) acc[c][r] = _mm512_setzero_ps();
  }
  const std::uint16_t* wo = w + static_cast<std::size_t>(o) * static_cast<std::size_t>(in);
  for (int i = 0; i < in; i += 16) {
    for (int c = 0; c < kOut; ++c) {
      const __m512 w16 = widen16<kType>(wo + static_cast<std::size_t>(c) * in + i);
      for (int r = 0; r < kRows; ++r) acc[c][r] = madd(x + r * ldx + i, w16, acc[c][r]);
    }
  }
  for (int c = 0; c < kOut; ++c) {
    const float b = bias != nullptr ? load_elem(bias, o + c, bias_type) : 0.0f;
    for (int r = 0; r < kRows; ++r) {
      const float value = end_sum(acc[c][r], b);
      float& dst = y[r * ldy + o + c];
      dst = accumulate ? dst + value : value;
    }
  }
}

// kRows x rows against rows [o0, o1) of w: kOut rows of w at a time (about 8 chains in flight).
template <DType kType, int kRows>
KVO_AVX512 void half_rows(const float* x, std::int64_t ldx, int in, const std::uint16_t* w,
                          DType bias_type, const void* bias, int o0, int o1, float* y,
                          std::int64_t ldy, bool accumulate) {
  constexpr int kOut = kRows == 1 ? 8 : kRows == 2 ? 4 : kRows <= 4 ? 2 : 1;
  int o = o0;
  for (; o + kOut <= o1; o += kOut) {
    half_tile<kType, kRows, kOut>(x, ldx, in, w, bias_type, bias, o, y, ldy, accumulate);
  }
  for (; o < o1; ++o) {
    half_tile<kType, kRows, 1>(x, ldx, in, w, bias_type, bias, o, y, ldy, accumulate);
  }
}

// Passes of kRows x rows over w (8 at most: 8 sums, a widened weight and an x load stay in
// registers), then the rows left, fewer than kRows, with fewer rows a pass.
template <DType kType, int kRows = 8>
KVO_AVX512 void half_rows_any(const float* x, int rows, std::int64_t ldx, int in,
                              const std::uint16_t* w, DType bias_type, const void* bias, int o0,
                              int o1, float* y, std::int64_t ldy, bool accumulate) {
  int t = 0;
  for (; t + kRows <= rows; t += kRows) {
    half_rows<kType, kRows>(x + t * ldx, ldx, in, w, bias_type, bias, o0, o1, y + t * ldy, ldy,
                            accumulate);
  }
  if constexpr (kRows > 1) {
    if (t < rows) {
      half_rows_any<kType, kRows - 1>(x + t * ldx, rows - t, ldx, in, w, bias_type, bias, o0, o1,
                                      y + t * ldy, ldy, accumulate);
    }
  }
}

}  // namespace

bool linear_rows_avx512(const float* x, int rows, std::int64_t ldx, int in, const void* w,
                        DType type, DType bias_type, const void* bias, int o0, int o1, float* y,
                        std::int64_t ldy, bool accumulate) {
  if (in % 16 != 0) return false;  // dot()'s scalar tail: left to linear_rows
  const auto* h = static_cast<const std::uint16_t*>(w);
  if (type == DType::kBF16) {
    half_rows_any<DType::kBF16>(x, rows, ldx, in, h, bias_type, bias, o0, o1, y, ldy, accumulate);
    return true;
  }
  if (type == DType::kF16) {
    half_rows_any<DType::kF16>(x, rows, ldx, in, h, bias_type, bias, o0, o1, y, ldy, accumulate);
    return true;
  }
  return false;
}

KVO_AVX512 bool f16_to_f32_avx512(const void* src, std::int64_t count, float* dst) {
  const auto* h = static_cast<const std::uint16_t*>(src);
  std::int64_t i = 0;
  for (; i + 16 <= count; i += 16) _mm512_storeu_ps(dst + i, widen16<DType::kF16>(h + i));
  if (i < count) {  // the last few through a masked load: the same conversion
    const auto mask = static_cast<__mmask16>((1u << (count - i)) - 1u);
    const __m256i part = _mm256_maskz_loadu_epi16(mask, h + i);
    _mm512_mask_storeu_ps(dst + i, mask, _mm512_cvtph_ps(part));
  }
  return true;
}

bool linear_row_blocks_avx512(const float* x, int in, const void* w, std::uint32_t type,
                              DType bias_type, const void* bias, int o0, int o1, float* y,
                              bool accumulate) {
  const auto* bytes = static_cast<const std::uint8_t*>(w);
  return visit_blocks(
      type,
      [&](auto t) {
        constexpr std::uint32_t kType = blocks::kGgml<decltype(t)>;
        if constexpr (kType == blocks::kQ5_K) {
          return false;  // no register kernel: the caller's block loops serve it
        } else {
          rows_of<kType>(x, in, bytes, bias_type, bias, o0, o1, y, accumulate);
          return true;
        }
      },
      [] { return false; });
}

}  // namespace kvo::model::kernels

#else

namespace kvo::model::kernels {

bool linear_rows_avx512(const float*, int, std::int64_t, int, const void*, DType, DType,
                        const void*, int, int, float*, std::int64_t, bool) {
  return false;
}

bool f16_to_f32_avx512(const void*, std::int64_t, float*) {
  return false;
}

bool linear_row_blocks_avx512(const float*, int, const void*, std::uint32_t, DType, const void*,
                              int, int, float*, bool) {
  return false;
}

}  // namespace kvo::model::kernels

#endif
