// Plain loops over rows of floats that the host's kernels share: element conversions written
// without branches, and sums, maxima and exponentials over kLanes partial results in an order
// fixed by the source, so that every x86-64 level (each a clone of its caller, KVO_VECTOR_CLONES)
// vectorizes them to the same bits up to whether a multiply-add is fused.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "offload/util/element_types.hpp"

// Runtime dispatch by CPU level (GCC's function multiversioning, resolved once at load time).
// Where the clones exist, dot() at the AVX-512 level sums with fused multiply-adds, as the
// register kernel of GGUF blocks does (host_blocks_avx512.cpp); elsewhere (clang builds, other
// targets) dot() is one baseline build without them, and that kernel would not give its bits.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVO_VECTOR_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define KVO_DOT_FUSES_ON_AVX512 1
#else
#define KVO_VECTOR_CLONES
#define KVO_DOT_FUSES_ON_AVX512 0
#endif

namespace kvo::attend::rows {

constexpr int kLanes = 16;

inline float as_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline std::uint32_t as_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// The same values as bf16_to_float / f16_to_float, written without branches so that a loop of
// them vectorizes.
inline float bf16_value(std::uint16_t h) {
  return as_float(static_cast<std::uint32_t>(h) << 16);
}

inline float f16_value(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t magnitude = h & 0x7fffu;                     // exponent and mantissa
  std::uint32_t normal = (magnitude << 13) + (112u << 23);         // rebias 15 -> 127
  normal = magnitude >= 0x7c00u ? normal + (112u << 23) : normal;  // inf, NaN: 31 -> 255
  // exponent 0: zero or subnormal, mantissa * 2^-24 (exact in float)
  const float small =
      static_cast<float>(static_cast<std::int32_t>(magnitude)) * 5.9604644775390625e-8f;
  const std::uint32_t bits = magnitude < 0x400u ? as_bits(small) : normal;
  return as_float(bits | sign);
}

inline std::uint16_t bf16_of(float x) {
  const std::uint32_t u = as_bits(x);
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (u >> 16) | 0x40u;
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

inline void convert_row(const void* src, DType type, std::int64_t count, float* dst) {
  if (type == DType::kF32) {
    std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(float));
  } else if (type == DType::kBF16) {
    const auto* h = static_cast<const std::uint16_t*>(src);
    for (std::int64_t i = 0; i < count; ++i) dst[i] = bf16_value(h[i]);
  } else {
    const auto* h = static_cast<const std::uint16_t*>(src);
    for (std::int64_t i = 0; i < count; ++i) dst[i] = f16_value(h[i]);
  }
}

// kLanes partial sums, combined pairwise: vectorizes at every level with the same order.
inline float dot(const float* a, const float* b, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float tail = 0;
  for (; i < n; ++i) tail += a[i] * b[i];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0] + tail;
}

// exp(x): x = n ln2 + r with |r| <= ln2/2, e^r by a degree-6 polynomial (the Cephes expf
// coefficients), 2^n put into the exponent bits. Branch-free, so loops of it vectorize.
inline float exp_value(float x) {
  constexpr float kMax = 88.72283f;   // above: inf
  constexpr float kMin = -87.33654f;  // below: 0 (results that would be subnormal included)
  const float clamped = x > kMin ? (x < kMax ? x : kMax) : kMin;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (clamped * 1.44269504088896341f + kRound) - kRound;
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const std::int32_t e = static_cast<std::int32_t>(n) + 127;
  const float scale = as_float(static_cast<std::uint32_t>(e) << 23);
  float result = p * scale;
  result = x < kMin ? 0.0f : result;
  result = x > kMax ? as_float(0x7f800000u) : result;
  return x != x ? x : result;  // NaN stays NaN
}

inline void exp_row(float* x, int n) {
  for (int i = 0; i < n; ++i) x[i] = exp_value(x[i]);
}

// Sum and max of x [n] over kLanes partial results: vectorizable, in a fixed order.
inline float sum_of(const float* x, int n) {
  float acc[kLanes] = {};
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] += x[i + j];
  }
  float tail = 0;
  for (; i < n; ++i) tail += x[i];
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int j = 0; j < width; ++j) acc[j] += acc[j + width];
  }
  return acc[0] + tail;
}

inline float max_of(const float* x, int n) {
  float acc[kLanes];
  for (int j = 0; j < kLanes; ++j) acc[j] = -INFINITY;
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) acc[j] = x[i + j] > acc[j] ? x[i + j] : acc[j];
  }
  float m = -INFINITY;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (int j = 0; j < kLanes; ++j) m = acc[j] > m ? acc[j] : m;
  return m;
}

}  // namespace kvo::attend::rows
