// The weight blocks of GGUF files (ggml's types) and their dequantization: the byte layout of each
// block and the arithmetic that turns it into f32, exactly as the format's reference gives it
// (tested bit for bit against the gguf package's gguf.quants.dequantize). Header-only and
// __host__ __device__ under nvcc, so the host path, the CUDA kernels and the tests read the same
// bits. Every product and sum is rounded on its own as the reference rounds it: on the device
// through the _rn intrinsics (never contracted into an FMA); on the host in code built for the
// x86-64 baseline, which has no FMA to contract into (do not include this in a file compiled
// with FMA enabled and expect the reference's bits).
//
// Block layouts (little-endian; f16 is IEEE half):
//   Q8_0  32 elements, 34 bytes: f16 d, int8 q[32]                 x = q * d
//   Q4_0  32 elements, 18 bytes: f16 d, u8 qs[16]                  x[j] = (lo(qs[j]) - 8) * d,
//                                                                  x[j + 16] = (hi(qs[j]) - 8) * d
//   Q4_1  32 elements, 20 bytes: f16 d, f16 m, u8 qs[16]           x = d * q + m (q as Q4_0's,
//                                                                  without the - 8)
//   Q4_K 256 elements, 144 bytes: f16 d, f16 dmin, u8 scales[12], u8 qs[128]: 8 sub-blocks of
//        32, each with a 6-bit scale sc and min m packed in scales; sub-block 2i holds the low
//        nibbles of qs[32i, 32i + 32), 2i + 1 the high ones; x = (d * sc) * q - (dmin * m)
//   Q5_K 256 elements, 176 bytes: f16 d, f16 dmin, u8 scales[12], u8 qh[32], u8 qs[128]: as
//        Q4_K, each q gaining bit j of qh[l] as its fifth bit in sub-block j
//   Q6_K 256 elements, 210 bytes: u8 ql[128], u8 qh[64], int8 scales[16], f16 d: two halves of
//        128, each 4 sub-blocks of 32 (low nibbles of ql[0, 32), of ql[32, 64), high nibbles of
//        ql[0, 32), of ql[32, 64) of the half's 64 bytes), bits 2k, 2k + 1 of the half's qh[l]
//        above them, q - 32 in [-32, 31]; x = (d * scales[e / 16]) * q
#pragma once

#include <cstdint>
#include <cstring>

#include "kvoffload/quant.hpp"
#include "offload/util/element_types.hpp"

#if defined(__CUDACC__)
#define KVO_BLOCKS_HD __host__ __device__ inline
#elif defined(__GNUC__)
// Inlined wherever used, so that a kernel compiled for several CPU levels (target_clones) gets the
// block loops vectorized at each level rather than one baseline copy called from all.
#define KVO_BLOCKS_HD inline __attribute__((always_inline))
#else
#define KVO_BLOCKS_HD inline
#endif

namespace kvo::model::blocks {

namespace quant = ::kvo::quant;

// ggml's type numbers for the types dequantized here, and for Q5_0 and Q5_1, which quantized
// weight plans fall back to (weight_formats.hpp).
enum : std::uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};
static_assert(kF32 == traits(ElementType::kF32).ggml && kF16 == traits(ElementType::kF16).ggml &&
                  kBF16 == traits(ElementType::kBF16).ggml &&
                  kQ8_0 == traits(ElementType::kQ8_0).ggml &&
                  kQ4_0 == traits(ElementType::kQ4_0).ggml &&
                  kQ4_1 == traits(ElementType::kQ4_1).ggml &&
                  kQ4_K == traits(ElementType::kQ4_K).ggml &&
                  kQ5_K == traits(ElementType::kQ5_K).ggml &&
                  kQ6_K == traits(ElementType::kQ6_K).ggml,
              "ggml's numbers are the element types' table's");

KVO_BLOCKS_HD float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
KVO_BLOCKS_HD float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
KVO_BLOCKS_HD float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}

KVO_BLOCKS_HD float float_of_bits(std::uint32_t u) {
  return quant::float_of(u);
}

// IEEE half to float, exactly (subnormals, infinities and NaN included).
KVO_BLOCKS_HD float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return float_of_bits(sign | 0x7f800000u | (mantissa << 13));
  if (exponent != 0) return float_of_bits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return float_of_bits(sign);
  // A subnormal half: normalize it (its value is mantissa x 2^-24).
  int shift = 0;
  while ((mantissa & 0x400u) == 0) {
    mantissa <<= 1;
    ++shift;
  }
  return float_of_bits(sign | (static_cast<std::uint32_t>(113 - shift) << 23) |
                       ((mantissa & 0x3ffu) << 13));
}

KVO_BLOCKS_HD float bf16_to_float(std::uint16_t b) {
  return float_of_bits(static_cast<std::uint32_t>(b) << 16);
}

KVO_BLOCKS_HD std::uint16_t u16_at(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}

// Q4_K's and Q5_K's 6-bit scale and min of sub-block j (0..7) from their 12 packed bytes: j < 4
// in the low 6 bits of bytes j and j + 4; j >= 4 in the nibbles of byte j + 4, with their two high
// bits in the top bits of bytes j - 4 and j.
KVO_BLOCKS_HD void scale_min_k4(int j, const std::uint8_t* s, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Elements a block of `type` holds, and its bytes; 0 for a type not dequantized here: the element
// types' table's (offload/util/element_types.hpp).
KVO_BLOCKS_HD int block_elements(std::uint32_t type) {
  return ggml_block_elements(type);
}
KVO_BLOCKS_HD int block_bytes(std::uint32_t type) {
  return ggml_block_bytes(type);
}

// One function per quantized type: out [block_elements] = the block at `b`, dequantized. Each
// loop writes consecutive elements from consecutive bytes, which vectorizes (`out` is declared
// not to overlap the block: bytes may alias anything, and the compiler must know they do not).
KVO_BLOCKS_HD void dequantize_q8_0(const std::uint8_t* __restrict__ b, float* __restrict__ out) {
  const float d = half_to_float(u16_at(b));
  for (int i = 0; i < 32; ++i)
    out[i] = mul(static_cast<float>(static_cast<std::int8_t>(b[2 + i])), d);
}
KVO_BLOCKS_HD void dequantize_q4_0(const std::uint8_t* __restrict__ b, float* __restrict__ out) {
  const float d = half_to_float(u16_at(b));
  for (int j = 0; j < 16; ++j) out[j] = mul(d, static_cast<float>((b[2 + j] & 0x0f) - 8));
  for (int j = 0; j < 16; ++j) out[j + 16] = mul(d, static_cast<float>((b[2 + j] >> 4) - 8));
}
KVO_BLOCKS_HD void dequantize_q4_1(const std::uint8_t* __restrict__ b, float* __restrict__ out) {
  const float d = half_to_float(u16_at(b));
  const float m = half_to_float(u16_at(b + 2));
  for (int j = 0; j < 16; ++j) out[j] = add(mul(d, static_cast<float>(b[4 + j] & 0x0f)), m);
  for (int j = 0; j < 16; ++j) out[j + 16] = add(mul(d, static_cast<float>(b[4 + j] >> 4)), m);
}
// Sub-block j (elements [32 j, 32 j + 32)) of a Q4_K (kFive false) or Q5_K (kFive true) block
// whose d and dmin are given.
template <bool kFive>
KVO_BLOCKS_HD void q45_k_part(const std::uint8_t* __restrict__ b, float d, float dmin, int j,
                              float* __restrict__ out) {
  const std::uint8_t* qh = b + 16;                 // Q5_K only
  const std::uint8_t* qs = b + (kFive ? 48 : 16);  // 128 bytes
  int sc = 0, m = 0;
  scale_min_k4(j, b + 4, &sc, &m);
  const float ds = mul(d, static_cast<float>(sc));
  const float dm = mul(dmin, static_cast<float>(m));
  const std::uint8_t* q = qs + 32 * (j / 2);
  const int shift = 4 * (j % 2);
  for (int l = 0; l < 32; ++l) {
    int v = (q[l] >> shift) & 0x0f;
    if (kFive) v |= ((qh[l] >> j) & 1) << 4;
    out[l] = sub(mul(ds, static_cast<float>(v)), dm);
  }
}
template <bool kFive>
KVO_BLOCKS_HD void dequantize_q45_k(const std::uint8_t* __restrict__ b, float* __restrict__ out) {
  const float d = half_to_float(u16_at(b));
  const float dmin = half_to_float(u16_at(b + 2));
  for (int j = 0; j < 8; ++j) q45_k_part<kFive>(b, d, dmin, j, out + 32 * j);
}
// Elements [32 p, 32 p + 32) of a Q6_K block whose d is given: half p / 4, sub-block p % 4 of it.
KVO_BLOCKS_HD void q6_k_part(const std::uint8_t* __restrict__ b, float d, int p,
                             float* __restrict__ out) {
  const int half = p / 4;
  const int k = p % 4;
  const auto* scales = reinterpret_cast<const std::int8_t*>(b + 192);
  const std::uint8_t* low = b + 64 * half + 32 * (k % 2);
  const std::uint8_t* high = b + 128 + 32 * half;
  const int shift = 4 * (k / 2);
  const float ds0 = mul(d, static_cast<float>(scales[8 * half + 2 * k]));
  const float ds1 = mul(d, static_cast<float>(scales[8 * half + 2 * k + 1]));
  for (int l = 0; l < 32; ++l) {
    const int q = (((low[l] >> shift) & 0x0f) | (((high[l] >> (2 * k)) & 3) << 4)) - 32;
    out[l] = mul(l < 16 ? ds0 : ds1, static_cast<float>(q));
  }
}
KVO_BLOCKS_HD void dequantize_q6_k(const std::uint8_t* __restrict__ b, float* __restrict__ out) {
  const float d = half_to_float(u16_at(b + 208));
  for (int half = 0; half < 2; ++half) {
    for (int k = 0; k < 4; ++k) q6_k_part(b, d, 4 * half + k, out + 128 * half + 32 * k);
  }
}

// ggml's number of the type a visit() hands over (its tag's type), as a compile-time constant.
template <typename Tag>
inline constexpr std::uint32_t kGgml = traits(Tag::value).ggml;

// visit() by ggml's number (element_types.hpp) over every type of the table that has one:
// f(ElementTag<type>()), or otherwise() for a number the table lacks.
KVO_ELEMENT_EITHER_SIDE
template <typename F, typename G>
KVO_ELEMENT_VISIT decltype(auto) visit_ggml(std::uint32_t ggml, F&& f, G&& otherwise) {
  ElementType type = ElementType::kF32;
  if (!element_type_of_ggml(ggml, &type)) return otherwise();
  return visit(type, f, otherwise);
}

// out [32] = elements [32 part, 32 part + 32) of a quantized block of type kType at `b` (part 0
// of a 32-element type; 0..7 of a K type): dequantize_block's values, a part at a time (the CUDA
// kernels give each thread one part).
template <ElementType kType>
KVO_BLOCKS_HD void dequantize_part_of(const std::uint8_t* b, int part, float* out) {
  using T = ElementType;
  if constexpr (kType == T::kQ8_0) {
    dequantize_q8_0(b, out);
  } else if constexpr (kType == T::kQ4_0) {
    dequantize_q4_0(b, out);
  } else if constexpr (kType == T::kQ4_1) {
    dequantize_q4_1(b, out);
  } else if constexpr (kType == T::kQ4_K || kType == T::kQ5_K) {
    q45_k_part<kType == T::kQ5_K>(b, half_to_float(u16_at(b)), half_to_float(u16_at(b + 2)), part,
                                  out);
  } else {
    static_assert(kType == T::kQ6_K, "dequantize_part_of serves the quantized block types");
    q6_k_part(b, half_to_float(u16_at(b + 208)), part, out);
  }
}
// As dequantize_part_of, the type by ggml's number; nothing for a type that is not a quantized
// block. REQUIRES: block_elements(type) is 32 or 256.
KVO_BLOCKS_HD void dequantize_part(std::uint32_t type, const std::uint8_t* b, int part,
                                   float* out) {
  visit_blocks(
      type,
      [&](auto t) KVO_ELEMENT_LAMBDA { dequantize_part_of<decltype(t)::value>(b, part, out); },
      [] {});
}

// Element l (0..31) of part `part` of a quantized block of type kType at `b`, alone:
// dequantize_part_of's out[l], bit for bit. What lane l of a CUDA warp computes when the warp
// walks a row a part at a time, so that its loads of the quants (and of the activations beside
// them) are one run of consecutive bytes; the scales are read by every lane (one broadcast).
template <ElementType kType>
KVO_BLOCKS_HD float part_element_of(const std::uint8_t* b, int part, int l) {
  using T = ElementType;
  if constexpr (kType == T::kQ8_0) {
    return mul(static_cast<float>(static_cast<std::int8_t>(b[2 + l])), half_to_float(u16_at(b)));
  } else if constexpr (kType == T::kQ4_0 || kType == T::kQ4_1) {
    const int at = kType == T::kQ4_0 ? 2 : 4;
    const int byte = b[at + (l & 15)];
    const int q = l < 16 ? (byte & 0x0f) : (byte >> 4);
    const float d = half_to_float(u16_at(b));
    if constexpr (kType == T::kQ4_0) {
      return mul(d, static_cast<float>(q - 8));
    } else {
      return add(mul(d, static_cast<float>(q)), half_to_float(u16_at(b + 2)));
    }
  } else if constexpr (kType == T::kQ4_K || kType == T::kQ5_K) {
    constexpr bool kFive = kType == T::kQ5_K;
    int sc = 0, m = 0;
    scale_min_k4(part, b + 4, &sc, &m);
    const float ds = mul(half_to_float(u16_at(b)), static_cast<float>(sc));
    const float dm = mul(half_to_float(u16_at(b + 2)), static_cast<float>(m));
    const std::uint8_t* q = b + (kFive ? 48 : 16) + 32 * (part / 2);
    int v = (q[l] >> (4 * (part % 2))) & 0x0f;
    if (kFive) v |= ((b[16 + l] >> part) & 1) << 4;
    return sub(mul(ds, static_cast<float>(v)), dm);
  } else {
    static_assert(kType == T::kQ6_K, "part_element_of serves the quantized block types");
    const int half = part / 4;
    const int k = part % 4;
    const auto* scales = reinterpret_cast<const std::int8_t*>(b + 192);
    const float d = half_to_float(u16_at(b + 208));
    const float ds = mul(d, static_cast<float>(scales[8 * half + 2 * k + (l < 16 ? 0 : 1)]));
    const int low = b[64 * half + 32 * (k % 2) + l];
    const int high = b[128 + 32 * half + l];
    const int q = (((low >> (4 * (k / 2))) & 0x0f) | (((high >> (2 * k)) & 3) << 4)) - 32;
    return mul(ds, static_cast<float>(q));
  }
}
// As part_element_of, the type by ggml's number; 0 for a type that is not a quantized block.
KVO_BLOCKS_HD float part_element(std::uint32_t type, const std::uint8_t* b, int part, int l) {
  return visit_blocks(
      type,
      [&](auto t) KVO_ELEMENT_LAMBDA { return part_element_of<decltype(t)::value>(b, part, l); },
      [] { return 0.0f; });
}

// The integer codes of part `part` of a quantized block (as dequantize_part numbers them): 32
// unsigned codes u, the scale of each half of 16 (equal but for Q6_K, whose scales are per 16)
// and an offset m, such that element l is mul(scale[l / 16], u[l] - code_offset(type)) + m with
// the sum rounded as dequantize_part rounds it (m = 0 adds nothing): the same bits. Integer
// products of activations with u are what the 8-bit GEMM sums (model/host/host_gemm_q8.hpp).
KVO_BLOCKS_HD int code_offset(std::uint32_t type) {
  return type == kQ8_0 ? 128 : (type == kQ4_0 ? 8 : (type == kQ6_K ? 32 : 0));
}
template <ElementType kType>
KVO_BLOCKS_HD void codes_part_of(const std::uint8_t* b, int part, std::uint8_t* u, float* scale,
                                 float* m) {
  using T = ElementType;
  *m = 0.0f;
  if constexpr (kType == T::kQ8_0) {
    scale[0] = scale[1] = half_to_float(u16_at(b));
    for (int l = 0; l < 32; ++l) u[l] = static_cast<std::uint8_t>(b[2 + l] ^ 0x80u);
  } else if constexpr (kType == T::kQ4_0 || kType == T::kQ4_1) {
    const int at = kType == T::kQ4_0 ? 2 : 4;
    scale[0] = scale[1] = half_to_float(u16_at(b));
    if (kType == T::kQ4_1) *m = half_to_float(u16_at(b + 2));
    for (int j = 0; j < 16; ++j) {
      u[j] = b[at + j] & 0x0f;
      u[j + 16] = b[at + j] >> 4;
    }
  } else if constexpr (kType == T::kQ4_K || kType == T::kQ5_K) {
    const bool five = kType == T::kQ5_K;
    int sc = 0, mn = 0;
    scale_min_k4(part, b + 4, &sc, &mn);
    scale[0] = scale[1] = mul(half_to_float(u16_at(b)), static_cast<float>(sc));
    *m = -mul(half_to_float(u16_at(b + 2)), static_cast<float>(mn));
    const std::uint8_t* q = b + (five ? 48 : 16) + 32 * (part / 2);
    const int shift = 4 * (part % 2);
    for (int l = 0; l < 32; ++l) {
      int v = (q[l] >> shift) & 0x0f;
      if (five) v |= ((b[16 + l] >> part) & 1) << 4;
      u[l] = static_cast<std::uint8_t>(v);
    }
  } else {
    static_assert(kType == T::kQ6_K, "codes_part_of serves the quantized block types");
    const int half = part / 4;
    const int k = part % 4;
    const auto* scales = reinterpret_cast<const std::int8_t*>(b + 192);
    const float d = half_to_float(u16_at(b + 208));
    scale[0] = mul(d, static_cast<float>(scales[8 * half + 2 * k]));
    scale[1] = mul(d, static_cast<float>(scales[8 * half + 2 * k + 1]));
    const std::uint8_t* low = b + 64 * half + 32 * (k % 2);
    const std::uint8_t* high = b + 128 + 32 * half;
    for (int l = 0; l < 32; ++l) {
      u[l] = static_cast<std::uint8_t>(((low[l] >> (4 * (k / 2))) & 0x0f) |
                                       (((high[l] >> (2 * k)) & 3) << 4));
    }
  }
}
KVO_BLOCKS_HD void codes_part(std::uint32_t type, const std::uint8_t* b, int part, std::uint8_t* u,
                              float* scale, float* m) {
  visit_blocks(
      type,
      [&](auto t) KVO_ELEMENT_LAMBDA { codes_part_of<decltype(t)::value>(b, part, u, scale, m); },
      [] {});
}

// out [block_elements] = the block of type kType at `b`, dequantized (one element for a scalar
// type).
template <ElementType kType>
KVO_BLOCKS_HD void dequantize_block_of(const std::uint8_t* b, float* out) {
  using T = ElementType;
  if constexpr (kType == T::kF32) {
    out[0] = float_of_bits(
        static_cast<std::uint32_t>(b[0]) | (static_cast<std::uint32_t>(b[1]) << 8) |
        (static_cast<std::uint32_t>(b[2]) << 16) | (static_cast<std::uint32_t>(b[3]) << 24));
  } else if constexpr (kType == T::kF16) {
    out[0] = half_to_float(u16_at(b));
  } else if constexpr (kType == T::kBF16) {
    out[0] = bf16_to_float(u16_at(b));
  } else if constexpr (kType == T::kQ4_K || kType == T::kQ5_K) {
    dequantize_q45_k<kType == T::kQ5_K>(b, out);
  } else if constexpr (kType == T::kQ6_K) {
    dequantize_q6_k(b, out);
  } else if constexpr (is_block_type(kType)) {
    dequantize_part_of<kType>(b, 0, out);  // a 32-element type is one part
  }
  // fp8 and int8 are K/V row bytes, never a GGUF tensor: nothing
}
// As dequantize_block_of, the type by ggml's number; nothing for a number the table lacks.
// REQUIRES: block_elements(type) > 0.
KVO_BLOCKS_HD void dequantize_block(std::uint32_t type, const std::uint8_t* b, float* out) {
  visit_ggml(
      type, [&](auto t) KVO_ELEMENT_LAMBDA { dequantize_block_of<decltype(t)::value>(b, out); },
      [] {});
}

}  // namespace kvo::model::blocks
