// Quantized K/V rows (DType::kFP8E4M3 and DType::kInt8): the byte format the cache stores and
// moves, and the arithmetic that writes and reads it. Header-only, and __host__ __device__ under
// nvcc, so an engine's kernels and its host code quantize to the same bits.
//
// A quantized row holds one token of K (or V) for every kv head: the kv_heads x dim elements,
// one byte each, in the same head-major order as an unquantized row; then, from byte
// quant_scale_offset(kv_heads, dim) (the element bytes rounded up to 4), kv_heads f32 scales, one
// per head. Element e of head h reads as decode(byte) * scale[h]:
//   - int8: a signed byte q in [-127, 127]; scale = max|x| / 127.
//   - fp8: OCP E4M3 ("e4m3fn": 4 exponent bits with bias 7, 3 mantissa bits, no infinities,
//     0x7f/0xff NaN, largest finite 448); scale = max|x| / 448.
// Elements are x / scale rounded to nearest even (int8 clamped to +-127, fp8 saturating at 448);
// a head of zeros has scale 0 and zero bytes. One scale per (token, head) lets a row be quantized
// once, when it is appended, without reading or rewriting any row before it, and keeps a slot's
// valid prefix one contiguous range of bytes.
#pragma once

#include <cstdint>
#include <cstring>

#include "kvoffload/types.hpp"

#if defined(__CUDACC__)
#define KVO_QUANT_HD __host__ __device__ inline
#else
#define KVO_QUANT_HD inline
#endif

namespace kvo {

// True for the dtypes stored as quantized rows.
KVO_QUANT_HD bool is_quantized(DType dtype) {
  return dtype == DType::kFP8E4M3 || dtype == DType::kInt8;
}

// Byte offset of a quantized row's scales: kv_heads * dim rounded up to a multiple of 4.
KVO_QUANT_HD std::uint64_t quant_scale_offset(int kv_heads, int dim) {
  return (static_cast<std::uint64_t>(kv_heads) * static_cast<std::uint64_t>(dim) + 3u) & ~3ull;
}

// Bytes of one quantized row: the elements (padded to 4) and a 4-byte scale per head.
KVO_QUANT_HD std::uint64_t quant_row_bytes(int kv_heads, int dim) {
  return quant_scale_offset(kv_heads, dim) + 4u * static_cast<std::uint64_t>(kv_heads);
}

namespace quant {

KVO_QUANT_HD std::uint32_t bits_of(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof u);
  return u;
#endif
}

KVO_QUANT_HD float float_of(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float x;
  std::memcpy(&x, &u, sizeof x);
  return x;
#endif
}

KVO_QUANT_HD float round_even(float x) {
#if defined(__CUDA_ARCH__)
  return rintf(x);
#else
  return __builtin_rintf(x);  // the default rounding mode: to nearest, ties to even
#endif
}

// The largest magnitude an element encodes: 127 (int8) or 448 (fp8).
KVO_QUANT_HD float max_code(DType dtype) {
  return dtype == DType::kInt8 ? 127.0f : 448.0f;
}

// E4M3 byte to float, exactly.
KVO_QUANT_HD float e4m3_to_float(std::uint8_t b) {
  const std::uint32_t sign = static_cast<std::uint32_t>(b & 0x80u) << 24;
  const std::uint32_t exponent = (b >> 3) & 0xfu;
  const std::uint32_t mantissa = b & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u) return float_of(sign | 0x7fc00000u);  // NaN
  if (exponent == 0) {
    // subnormal: mantissa * 2^-9, exact in float
    return float_of(sign | bits_of(static_cast<float>(mantissa) * 0.001953125f));
  }
  return float_of(sign | ((exponent + 120u) << 23) | (mantissa << 20));
}

// Float to the nearest E4M3 byte (ties to even), saturating at +-448; NaN stays NaN.
KVO_QUANT_HD std::uint8_t float_to_e4m3(float x) {
  const std::uint32_t u = bits_of(x);
  const auto sign = static_cast<std::uint8_t>((u >> 24) & 0x80u);
  const std::uint32_t magnitude = u & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return static_cast<std::uint8_t>(sign | 0x7fu);  // NaN
  if (magnitude > 0x43e00000u) return static_cast<std::uint8_t>(sign | 0x7eu);  // > 448: 448
  if (magnitude < 0x3c800000u) {
    // below 2^-6, the smallest normal: a multiple of 2^-9 (8 rounds up to the smallest normal,
    // whose code is 8 too)
    const float steps = round_even(float_of(magnitude) * 512.0f);  // exact: a power of two
    return static_cast<std::uint8_t>(sign | static_cast<std::uint8_t>(steps));
  }
  std::uint32_t exponent = (magnitude >> 23) - 120u;  // E4M3's biased exponent, 1..15
  std::uint32_t mantissa = (magnitude >> 20) & 0x7u;
  const std::uint32_t rest = magnitude & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (mantissa & 1u) != 0)) {
    if (++mantissa == 8u) {
      mantissa = 0;
      ++exponent;
    }
  }
  return static_cast<std::uint8_t>(sign | (exponent << 3) | mantissa);
}

// One element's byte for x already divided by its scale.
KVO_QUANT_HD std::uint8_t encode(float scaled, DType dtype) {
  if (dtype == DType::kInt8) {
    if (!(scaled == scaled)) return 0;  // int8 has no NaN
    float q = round_even(scaled);
    q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
    return static_cast<std::uint8_t>(static_cast<std::int8_t>(q));
  }
  return float_to_e4m3(scaled);
}

// One element's value before its scale.
KVO_QUANT_HD float decode(std::uint8_t byte, DType dtype) {
  return dtype == DType::kInt8 ? static_cast<float>(static_cast<std::int8_t>(byte))
                               : e4m3_to_float(byte);
}

// The scale of a head whose largest magnitude is `amax`.
KVO_QUANT_HD float scale_for(float amax, DType dtype) {
  return amax / max_code(dtype);
}

// The byte of x in a head of scale `scale` (0 for every x when the scale is 0).
KVO_QUANT_HD std::uint8_t quantize(float x, float scale, DType dtype) {
  return scale > 0.0f ? encode(x / scale, dtype) : static_cast<std::uint8_t>(0);
}

}  // namespace quant

// Writes x [kv_heads][dim] (f32) as one quantized row at `row` (quant_row_bytes(kv_heads, dim)
// bytes, the scales 4-byte aligned when `row` is). REQUIRES: is_quantized(dtype).
KVO_QUANT_HD void quantize_row(const float* x, int kv_heads, int dim, DType dtype, void* row) {
  auto* bytes = static_cast<std::uint8_t*>(row);
  auto* scales = reinterpret_cast<float*>(bytes + quant_scale_offset(kv_heads, dim));
  for (int h = 0; h < kv_heads; ++h) {
    const float* xh = x + static_cast<std::int64_t>(h) * dim;
    float amax = 0.0f;
    for (int e = 0; e < dim; ++e) {
      const float a = xh[e] < 0.0f ? -xh[e] : xh[e];
      amax = a > amax ? a : amax;
    }
    const float scale = quant::scale_for(amax, dtype);
    scales[h] = scale;
    std::uint8_t* q = bytes + static_cast<std::int64_t>(h) * dim;
    for (int e = 0; e < dim; ++e) q[e] = quant::quantize(xh[e], scale, dtype);
  }
  // The padding between the elements and the scales is written too: a row's bytes are a
  // function of x alone.
  for (std::uint64_t i = static_cast<std::uint64_t>(kv_heads) * dim;
       i < quant_scale_offset(kv_heads, dim); ++i) {
    bytes[i] = 0;
  }
}

// out [kv_heads][dim] (f32) = the values of the quantized row at `row`.
KVO_QUANT_HD void dequantize_row(const void* row, int kv_heads, int dim, DType dtype, float* out) {
  const auto* bytes = static_cast<const std::uint8_t*>(row);
  const auto* scales = reinterpret_cast<const float*>(bytes + quant_scale_offset(kv_heads, dim));
  for (int h = 0; h < kv_heads; ++h) {
    const float scale = scales[h];
    for (int e = 0; e < dim; ++e) {
      const std::int64_t i = static_cast<std::int64_t>(h) * dim + e;
      out[i] = quant::decode(bytes[i], dtype) * scale;
    }
  }
}

}  // namespace kvo
