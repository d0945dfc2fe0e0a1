// Decoding rows against GGUF blocks with the activations quantized to 8 bits (host_kernels.hpp,
// "q8 activations"): the integer products of a block are summed exactly (AVX512-VNNI's
// vpdpbusd where the CPU has it, plain loops otherwise) and scaled once per block in f32.
//
// The activation row is quantized per group of 32 elements for the 32-element weight types
// (Q8_0, Q4_0, Q4_1) and per 256 for the K types (Q4_K, Q6_K), as x = d * q with q in [-127, 127]
// and d = max |x| / 127, beside the sums of q over each 32 (or 16, for the K types) elements, which
// the weights' offsets (Q4_0's - 8, Q4_1's m, Q4_K's min, Q6_K's - 32) multiply. For Q4_K the q
// are stored in the order the weights' nibbles come in (two runs of 32 swapped in each 128), so
// that one 64-byte load of nibbles meets its 64 activations.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/checkpoint/ggml_blocks.hpp"
#include "model/host/host_kernels.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVO_Q8_HAVE_VNNI_CODE 1
#define KVO_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma,f16c")))
#define KVO_VNNI_INLINE KVO_VNNI __attribute__((always_inline)) inline
#else
#define KVO_Q8_HAVE_VNNI_CODE 0
#endif

namespace kvo::model::kernels {
namespace {

bool is_k_type(std::uint32_t type) {
  return type == blocks::kQ4_K || type == blocks::kQ6_K;
}

int group_of(std::uint32_t type) {
  return is_k_type(type) ? 256 : 32;
}
int sum_group_of(std::uint32_t type) {
  return type == blocks::kQ6_K ? 16 : 32;
}

// The three arrays of a quantized row inside its buffer: d [in / group], sums [in / sum group],
// q [in], at offsets that depend on `in` alone (a row's bytes can be compared or copied).
struct Q8View {
  float* d;
  std::int32_t* sums;
  std::int8_t* q;
};

Q8View view(void* buffer, int in) {
  auto* base = static_cast<std::uint8_t*>(buffer);
  Q8View v{};
  v.d = reinterpret_cast<float*>(base);
  v.sums = reinterpret_cast<std::int32_t*>(base + static_cast<std::size_t>(in / 32) * 4);
  v.q = reinterpret_cast<std::int8_t*>(base + static_cast<std::size_t>(in / 32) * 4 +
                                       static_cast<std::size_t>(in / 16) * 4);
  return v;
}

struct Q8ConstView {
  const float* d;
  const std::int32_t* sums;
  const std::int8_t* q;
};

Q8ConstView view(const void* buffer, int in) {
  const Q8View v = view(const_cast<void*>(buffer), in);
  return {v.d, v.sums, v.q};
}

// Position in the stored order of element e of a Q4_K group (the middle two runs of 32 of each
// 128 swapped); the identity for the other types.
int stored_at(bool k4_order, int e) {
  if (!k4_order) return e;
  const int run = (e % 128) / 32;
  const int swapped = run == 1 ? 2 : (run == 2 ? 1 : run);
  return e - e % 128 + swapped * 32 + e % 32;
}

float weight_scale(const std::uint8_t* b) {
  return blocks::half_to_float(blocks::u16_at(b));
}

float finish(float value, DType bias_type, const void* bias, int o) {
  return value + (bias != nullptr ? load_elem(bias, o, bias_type) : 0.0f);
}

// The portable rows: exact integer sums per block, scaled in f32 block after block.
// Q5_K has no 8-bit kernel (q8_activations_serve): its rows are left to the caller's.
template <std::uint32_t type>
void rows_portable(const Q8ConstView x, int in, const std::uint8_t* w, DType bias_type,
                   const void* bias, int o0, int o1, float* y, bool accumulate) {
  if constexpr (type == blocks::kQ5_K) return;
  const int per_block = blocks::block_elements(type);
  const std::size_t block_bytes = static_cast<std::size_t>(blocks::block_bytes(type));
  const std::size_t row_bytes = static_cast<std::size_t>(in / per_block) * block_bytes;
  for (int o = o0; o < o1; ++o) {
    const std::uint8_t* row = w + static_cast<std::size_t>(o) * row_bytes;
    float acc = 0.0f;
    for (int blk = 0; blk < in / per_block; ++blk) {
      const std::uint8_t* b = row + static_cast<std::size_t>(blk) * block_bytes;
      const std::int8_t* xq = x.q + static_cast<std::ptrdiff_t>(blk) * per_block;
      if constexpr (type == blocks::kQ8_0) {
        std::int32_t s = 0;
        for (int i = 0; i < 32; ++i) s += static_cast<std::int8_t>(b[2 + i]) * xq[i];
        acc += (weight_scale(b) * x.d[blk]) * static_cast<float>(s);
      } else if constexpr (type == blocks::kQ4_0 || type == blocks::kQ4_1) {
        const int at = type == blocks::kQ4_0 ? 2 : 4;
        std::int32_t s = 0;
        for (int i = 0; i < 16; ++i) {
          s += (b[at + i] & 15) * xq[i] + (b[at + i] >> 4) * xq[i + 16];
        }
        const float dd = weight_scale(b) * x.d[blk];
        acc += dd * static_cast<float>(s);
        if (type == blocks::kQ4_0) {
          acc += dd * static_cast<float>(-8 * x.sums[blk]);
        } else {
          acc += (weight_scale(b + 2) * x.d[blk]) * static_cast<float>(x.sums[blk]);
        }
      } else if constexpr (type == blocks::kQ4_K) {
        std::int32_t s = 0, mins = 0;
        for (int j = 0; j < 8; ++j) {
          int sc = 0, m = 0;
          blocks::scale_min_k4(j, b + 4, &sc, &m);
          const std::uint8_t* qs = b + 16 + 32 * (j / 2);
          std::int32_t sj = 0;
          for (int l = 0; l < 32; ++l) {
            const int q = (j % 2 == 0) ? (qs[l] & 15) : (qs[l] >> 4);
            sj += q * xq[stored_at(true, 32 * j + l)];
          }
          s += sc * sj;
          mins += m * x.sums[8 * blk + j];
        }
        acc += (weight_scale(b) * x.d[blk]) * static_cast<float>(s);
        acc -= (weight_scale(b + 2) * x.d[blk]) * static_cast<float>(mins);
      } else if constexpr (type == blocks::kQ6_K) {
        const auto* scales = reinterpret_cast<const std::int8_t*>(b + 192);
        std::int32_t s = 0, offset = 0;
        for (int e = 0; e < 256; ++e) {
          const int h = e / 128, k = (e % 128) / 32, l = e % 32;
          const int nibble = (b[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 15;
          const int high = (b[128 + 32 * h + l] >> (2 * k)) & 3;
          s += scales[e / 16] * (nibble | (high << 4)) * xq[e];
        }
        for (int g = 0; g < 16; ++g) offset += scales[g] * x.sums[16 * blk + g];
        const float dd = weight_scale(b + 208) * x.d[blk];
        acc += dd * static_cast<float>(s);
        acc += dd * static_cast<float>(-32 * offset);
      }
    }
    const float value = finish(acc, bias_type, bias, o);
    y[o] = accumulate ? y[o] + value : value;
  }
}

#if KVO_Q8_HAVE_VNNI_CODE

KVO_VNNI_INLINE float hsum(__m512 v) {
  return _mm512_reduce_add_ps(v);
}

// weight_scale() with F16C: the same value for every half.
KVO_VNNI_INLINE float half_at(const std::uint8_t* b) {
  return _cvtsh_ss(blocks::u16_at(b));
}

// A Q4_K block's 8 scales and 8 mins (each a byte of a 64-bit word, sub-block 0 lowest), unpacked
// four at a time from the 12 bytes of scale_min_k4's layout, in registers (no store to reload).
KVO_VNNI_INLINE void scales_mins_k4(const std::uint8_t* s, __m128i* sc, __m128i* m) {
  std::uint32_t u[3];
  std::memcpy(u, s, sizeof u);
  const std::uint64_t low_sc = u[0] & 0x3f3f3f3fu;
  const std::uint64_t low_m = u[1] & 0x3f3f3f3fu;
  const std::uint64_t high_sc = (u[2] & 0x0f0f0f0fu) | (((u[0] >> 6) & 0x03030303u) << 4);
  const std::uint64_t high_m = ((u[2] >> 4) & 0x0f0f0f0fu) | (((u[1] >> 6) & 0x03030303u) << 4);
  *sc = _mm_cvtsi64_si128(static_cast<long long>(low_sc | (high_sc << 32)));
  *m = _mm_cvtsi64_si128(static_cast<long long>(low_m | (high_m << 32)));
}

// 32 words: a in the first 16, b in the last 16.
KVO_VNNI_INLINE __m512i pick_of(int a, int b) {
  return _mm512_mask_blend_epi16(0xffff0000u, _mm512_set1_epi16(static_cast<short>(a)),
                                 _mm512_set1_epi16(static_cast<short>(b)));
}

// The matrix is read front to back, faster than the hardware's prefetcher alone fetches it with
// two cores (measured: a 56 MiB Q4_K matrix, one thread, 27 -> 36 G weights/s): the lines of
// `bytes` from p on are asked for 4 KiB ahead.
KVO_VNNI_INLINE void prefetch_ahead(const std::uint8_t* p, int bytes) {
  constexpr int kAhead = 4096;
  for (int at = 0; at < bytes; at += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(p) + kAhead + at, _MM_HINT_T0);
  }
}

// 16 nibbles as 32 bytes: the low nibbles, then the high ones (a Q4_0/Q4_1 block's order).
KVO_VNNI_INLINE __m256i nibbles32(const std::uint8_t* p) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(15);
  const __m128i lo = _mm_and_si128(v, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), mask);
  return _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
}

template <std::uint32_t kType>
KVO_VNNI void rows_vnni(const Q8ConstView x, int in, const std::uint8_t* w, DType bias_type,
                        const void* bias, int o0, int o1, float* y, bool accumulate) {
  const int per_block = blocks::block_elements(kType);
  const std::size_t block_bytes = static_cast<std::size_t>(blocks::block_bytes(kType));
  const int count = in / per_block;
  const std::size_t row_bytes = static_cast<std::size_t>(count) * block_bytes;
  for (int o = o0; o < o1; ++o) {
    const std::uint8_t* row = w + static_cast<std::size_t>(o) * row_bytes;
    float scalar = 0.0f;
    float value = 0.0f;
    if constexpr (kType == blocks::kQ8_0 || kType == blocks::kQ4_0 || kType == blocks::kQ4_1) {
      // Two blocks a step, one in each half of the registers; a lone last block in the low half.
      __m512 acc = _mm512_setzero_ps();
      float offsets[2] = {0.0f, 0.0f};  // Q4_1's m * sum(x), two chains
      for (int blk = 0; blk < count; blk += 2) {
        const bool pair = blk + 1 < count;
        const std::uint8_t* b0 = row + static_cast<std::size_t>(blk) * block_bytes;
        const std::uint8_t* b1 = pair ? b0 + block_bytes : b0;
        prefetch_ahead(b0, 2 * blocks::block_bytes(kType));
        const __m512i xq = pair ? _mm512_loadu_si512(x.q + 32 * static_cast<std::ptrdiff_t>(blk))
                                : _mm512_castsi256_si512(_mm256_loadu_si256(
                                      reinterpret_cast<const __m256i*>(x.q + 32 * blk)));
        const float dd0 = half_at(b0) * x.d[blk];
        const float dd1 = pair ? half_at(b1) * x.d[blk + 1] : 0.0f;
        __m512i dot;
        if constexpr (kType == blocks::kQ8_0) {
          // |w| (at most 128, unsigned) against x carrying w's sign: the same products, signed.
          const __m512i q = _mm512_inserti64x4(
              _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b0 + 2))),
              _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b1 + 2)), 1);
          const __m512i sign = _mm512_movm_epi8(_mm512_movepi8_mask(q));  // -1 where w < 0
          const __m512i signed_x = _mm512_sub_epi8(_mm512_xor_si512(xq, sign), sign);
          dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(q), signed_x);
        } else {
          const int at = kType == blocks::kQ4_0 ? 2 : 4;
          const __m512i q =
              _mm512_inserti64x4(_mm512_castsi256_si512(nibbles32(b0 + at)), nibbles32(b1 + at), 1);
          dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, xq);
          if constexpr (kType == blocks::kQ4_0) {
            // sum (q - 8) x = sum q x - sum 8 x, both exact.
            dot = _mm512_sub_epi32(
                dot, _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), xq));
          } else {
            offsets[0] += (half_at(b0 + 2) * x.d[blk]) * static_cast<float>(x.sums[blk]);
            if (pair) {
              offsets[1] += (half_at(b1 + 2) * x.d[blk + 1]) * static_cast<float>(x.sums[blk + 1]);
            }
          }
        }
        const __m512 dd = _mm512_insertf32x8(_mm512_set1_ps(dd0), _mm256_set1_ps(dd1), 1);
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), dd, acc);
      }
      value = hsum(acc);
      scalar = offsets[0] + offsets[1];
    } else if constexpr (kType == blocks::kQ4_K) {
      // Words 0-15 of a 64-byte product of pairs belong to one sub-block, 16-31 to another: these
      // pick each word's sub-block scale out of the 8 scales widened to words.
      const __m512i pick[4] = {pick_of(0, 2), pick_of(1, 3), pick_of(4, 6), pick_of(5, 7)};
      const __m512i mask = _mm512_set1_epi8(15);
      __m512 acc = _mm512_setzero_ps();
      __m256 min_acc = _mm256_setzero_ps();
      for (int blk = 0; blk < count; ++blk) {
        const std::uint8_t* b = row + static_cast<std::size_t>(blk) * block_bytes;
        prefetch_ahead(b, 144);
        __m128i sc, m;
        scales_mins_k4(b + 4, &sc, &m);
        const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(sc));
        const __m256i mins = _mm256_mullo_epi32(
            _mm256_cvtepu8_epi32(m),
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.sums + 8 * blk)));
        const std::int8_t* xq = x.q + 256 * static_cast<std::ptrdiff_t>(blk);
        // Products of pairs in 16 bits (at most 2 * 15 * 127), times the scale and summed in
        // pairs into 32 bits: exact.
        __m512i sum = _mm512_setzero_si512();
        for (int p = 0; p < 2; ++p) {
          const __m512i v = _mm512_loadu_si512(b + 16 + 64 * p);
          const __m512i lo = _mm512_and_si512(v, mask);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), mask);
          const __m512i plo = _mm512_maddubs_epi16(lo, _mm512_loadu_si512(xq + 128 * p));
          const __m512i phi = _mm512_maddubs_epi16(hi, _mm512_loadu_si512(xq + 128 * p + 64));
          sum = _mm512_dpwssd_epi32(sum, plo, _mm512_permutexvar_epi16(pick[2 * p], scales));
          sum = _mm512_dpwssd_epi32(sum, phi, _mm512_permutexvar_epi16(pick[2 * p + 1], scales));
        }
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(half_at(b) * x.d[blk]), acc);
        min_acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mins),
                                  _mm256_set1_ps(-(half_at(b + 2) * x.d[blk])), min_acc);
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, min_acc);
      for (float lane : lanes) scalar += lane;
      value = hsum(acc);
    } else if constexpr (kType == blocks::kQ6_K) {
      // Lane i of the 64-byte product c of a block covers elements 64c + 4i .. + 3, whose scale is
      // scales[4c + i / 4].
      __m512i pick[4];
      for (int c = 0; c < 4; ++c) {
        pick[c] =
            _mm512_add_epi32(_mm512_set1_epi32(4 * c),
                             _mm512_set_epi32(3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0));
      }
      const __m512i mask = _mm512_set1_epi8(15);
      const __m256i two = _mm256_set1_epi8(3);
      __m512 acc = _mm512_setzero_ps();
      __m512 offset_acc = _mm512_setzero_ps();
      for (int blk = 0; blk < count; ++blk) {
        const std::uint8_t* b = row + static_cast<std::size_t>(blk) * block_bytes;
        prefetch_ahead(b, 210);
        const auto* sc8 = reinterpret_cast<const std::int8_t*>(b + 192);
        const __m512i scales =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc8)));
        const __m512i offset = _mm512_mullo_epi32(
            scales, _mm512_loadu_si512(x.sums + 16 * static_cast<std::ptrdiff_t>(blk)));
        const std::int8_t* xq = x.q + 256 * static_cast<std::ptrdiff_t>(blk);
        __m512i sum = _mm512_setzero_si512();
        for (int h = 0; h < 2; ++h) {
          const __m512i v = _mm512_loadu_si512(b + 64 * h);
          const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * h));
          const __m512i b01 =
              _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_and_si256(qh, two)),
                                 _mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 1);
          const __m512i b23 = _mm512_inserti64x4(
              _mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two)),
              _mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 1);
          const __m512i qa = _mm512_or_si512(_mm512_and_si512(v, mask), _mm512_slli_epi16(b01, 4));
          const __m512i qb = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), mask),
                                             _mm512_slli_epi16(b23, 4));
          const __m512i da =
              _mm512_dpbusd_epi32(_mm512_setzero_si512(), qa, _mm512_loadu_si512(xq + 128 * h));
          const __m512i db = _mm512_dpbusd_epi32(_mm512_setzero_si512(), qb,
                                                 _mm512_loadu_si512(xq + 128 * h + 64));
          sum = _mm512_add_epi32(
              sum, _mm512_mullo_epi32(da, _mm512_permutexvar_epi32(pick[2 * h], scales)));
          sum = _mm512_add_epi32(
              sum, _mm512_mullo_epi32(db, _mm512_permutexvar_epi32(pick[2 * h + 1], scales)));
        }
        const float dd = half_at(b + 208) * x.d[blk];
        acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(dd), acc);
        offset_acc =
            _mm512_fmadd_ps(_mm512_cvtepi32_ps(offset), _mm512_set1_ps(-32.0f * dd), offset_acc);
      }
      value = hsum(acc);
      scalar = hsum(offset_acc);
    }
    const float out = finish(value + scalar, bias_type, bias, o);
    y[o] = accumulate ? y[o] + out : out;
  }
}

// quantize_activation_q8's loops, 16 elements a step: the same bytes (the conversion rounds to
// nearest even, as nearbyint does in the default rounding mode).
KVO_VNNI void quantize_vnni(const float* x, int in, int group, int sum_group, bool k4_order,
                            const Q8View& v) {
  const __m512 limit = _mm512_set1_ps(127.0f);
  for (int g = 0; g < in / group; ++g) {
    const float* xg = x + static_cast<std::ptrdiff_t>(g) * group;
    __m512 amax = _mm512_setzero_ps();
    for (int i = 0; i < group; i += 16)
      amax = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(xg + i)), amax);
    const float d = _mm512_reduce_max_ps(amax) / 127.0f;
    const __m512 inverse = _mm512_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
    v.d[g] = d;
    std::int8_t* q = v.q + static_cast<std::ptrdiff_t>(g) * group;
    for (int i = 0; i < group; i += sum_group) {
      __m512i sum = _mm512_setzero_si512();
      for (int e = i; e < i + sum_group; e += 16) {
        __m512 scaled = _mm512_mul_ps(_mm512_loadu_ps(xg + e), inverse);
        // max and min return their second operand when one is NaN: a NaN becomes -127, as
        // std::max(-127, NaN) makes it in the plain loops.
        scaled =
            _mm512_min_ps(_mm512_max_ps(scaled, _mm512_sub_ps(_mm512_setzero_ps(), limit)), limit);
        const __m512i value = _mm512_cvtps_epi32(scaled);
        sum = _mm512_add_epi32(sum, value);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(q + stored_at(k4_order, e)),
                         _mm512_cvtsepi32_epi8(value));
      }
      v.sums[(static_cast<std::ptrdiff_t>(g) * group + i) / sum_group] =
          _mm512_reduce_add_epi32(sum);
    }
  }
}

#endif

bool have_vnni() {
  return have_avx512_vnni();
}

}  // namespace

bool have_avx512_vnni() {
#if KVO_Q8_HAVE_VNNI_CODE
  static const bool yes = have_avx512() && __builtin_cpu_supports("avx512vnni");
  return yes;
#else
  return false;
#endif
}

bool q8_activations_serve(std::uint32_t type) {
  return type == blocks::kQ8_0 || type == blocks::kQ4_0 || type == blocks::kQ4_1 ||
         type == blocks::kQ4_K || type == blocks::kQ6_K;
}

const char* q8_activation_kernel() {
  return have_vnni() ? "AVX512-VNNI" : "portable";
}

void quantize_q8_groups(const float* x, int in, int group, int sum_group, bool k4_order, float* d,
                        std::int32_t* sums, std::int8_t* q, bool portable) {
  const Q8View v{d, sums, q};
#if KVO_Q8_HAVE_VNNI_CODE
  if (!portable && have_vnni()) return quantize_vnni(x, in, group, sum_group, k4_order, v);
#endif
  for (int g = 0; g < in / group; ++g) {
    const float* xg = x + static_cast<std::ptrdiff_t>(g) * group;
    float amax = 0.0f;
    for (int i = 0; i < group; ++i) amax = std::max(amax, std::fabs(xg[i]));
    const float dg = amax / 127.0f;
    const float inverse = dg > 0.0f ? 1.0f / dg : 0.0f;
    v.d[g] = dg;
    std::int8_t* qg = v.q + static_cast<std::ptrdiff_t>(g) * group;
    for (int i = 0; i < group; i += sum_group) {
      std::int32_t sum = 0;
      for (int e = i; e < i + sum_group; ++e) {
        const float scaled = std::min(127.0f, std::max(-127.0f, std::nearbyint(xg[e] * inverse)));
        const auto value = static_cast<std::int8_t>(scaled);
        qg[stored_at(k4_order, e)] = value;
        sum += value;
      }
      v.sums[(static_cast<std::ptrdiff_t>(g) * group + i) / sum_group] = sum;
    }
  }
}

void quantize_activation_q8(std::uint32_t type, const float* x, int in, void* dst, bool portable) {
  const Q8View v = view(dst, in);
  quantize_q8_groups(x, in, group_of(type), sum_group_of(type), type == blocks::kQ4_K, v.d, v.sums,
                     v.q, portable);
}

void dequantize_activation_q8(std::uint32_t type, const void* src, int in, float* x) {
  const Q8ConstView v = view(src, in);
  const int group = group_of(type);
  for (int e = 0; e < in; ++e) {
    const int g = e / group;
    x[e] = v.d[g] * static_cast<float>(v.q[static_cast<std::ptrdiff_t>(g) * group +
                                           stored_at(type == blocks::kQ4_K, e % group)]);
  }
}

void linear_row_blocks_q8(const void* xq, int in, const void* w, std::uint32_t type,
                          DType bias_type, const void* bias, int o0, int o1, float* y,
                          bool accumulate, bool portable) {
  const Q8ConstView x = view(xq, in);
  const auto* bytes = static_cast<const std::uint8_t*>(w);
#if KVO_Q8_HAVE_VNNI_CODE
  if (!portable && have_vnni() && q8_activations_serve(type)) {
    return visit_blocks(
        type,
        [&](auto t) {
          constexpr std::uint32_t kType = blocks::kGgml<decltype(t)>;
          if constexpr (kType != blocks::kQ5_K) {
            rows_vnni<kType>(x, in, bytes, bias_type, bias, o0, o1, y, accumulate);
          }
        },
        [] {});
  }
#endif
  visit_blocks(
      type,
      [&](auto t) {
        rows_portable<blocks::kGgml<decltype(t)>>(x, in, bytes, bias_type, bias, o0, o1, y,
                                                  accumulate);
      },
      [] {});
}

}  // namespace kvo::model::kernels
