// One decoding row against a matrix in GGUF blocks, with AVX-512 intrinsics: each 16 weights are
// dequantized in a register (the block's bytes widened, masked and shifted, converted, scaled)
// and multiplied into 16 partial sums with the same fused multiply-add that dot() compiles to at
// this level, in the same order, so every output has the bits of the row expanded to f32
// (linear_rows_blocks' contract). Every product inside a block's formula is exact in f32 or a
// lone rounding (model/checkpoint/ggml_blocks.hpp), so fusing the scale and the offset
// (d * q + m, ds * q - dm) gives the reference's weights too. The row is read once, at memory
// speed, instead of being written out as f32 and read back.
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

template <std::uint32_t kType>
KVO_AVX512 void rows_of(const float* x, int in, const std::uint8_t* w, DType bias_type,
                        const void* bias, int o0, int o1, float* y, bool accumulate) {
  const int per_block = blocks::block_elements(kType);
  const int block_bytes = blocks::block_bytes(kType);
  const std::size_t row_bytes =
      static_cast<std::size_t>(in / per_block) * static_cast<std::size_t>(block_bytes);
  for (int o = o0; o < o1; ++o) {
    const std::uint8_t* b = w + static_cast<std::size_t>(o) * row_bytes;
    __m512 acc = _mm512_setzero_ps();
    for (int at = 0; at < in; at += per_block, b += block_bytes) {
      acc = block_madd<kType>(b, x + at, acc);
    }
    // dot()'s end: the lanes summed pairwise, halves first, then + 0 for the (empty) tail.
    alignas(64) float a[16];
    _mm512_store_ps(a, acc);
    for (int width = 8; width > 0; width /= 2) {
      for (int j = 0; j < width; ++j) a[j] += a[j + width];
    }
    const float tail = 0;
    const float value = (a[0] + tail) + (bias != nullptr ? load_elem(bias, o, bias_type) : 0.0f);
    y[o] = accumulate ? y[o] + value : value;
  }
}

}  // namespace

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

bool linear_row_blocks_avx512(const float*, int, const void*, std::uint32_t, DType, const void*,
                              int, int, float*, bool) {
  return false;
}

}  // namespace kvo::model::kernels

#endif
