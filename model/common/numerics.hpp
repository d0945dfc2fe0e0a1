// Plain arithmetic shared by the host path and the CUDA kernels: element conversions, rotary
// angles (with Llama 3 frequency scaling), the seeded values of synthetic weights, and the online
// softmax (offload/attend/softmax.hpp's, by the names the model uses). Everything here is
// __host__ __device__, so the CPU tests cover what the kernels compute.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kvoffload/quant.hpp"
#include "offload/attend/softmax.hpp"
#include "offload/util/element_types.hpp"

#if defined(__CUDACC__)
#define KVO_HD __host__ __device__ __forceinline__
#else
#define KVO_HD inline
#endif

namespace kvo::model {

// The online softmax (offload/attend/softmax.hpp), by the names the model's code uses.
using attend::lse_merge;
using attend::LseMerge;
using attend::MergeScales;
using attend::soft_cap_value;
using attend::softmax_block_rescale;
using attend::softmax_lse2;
using attend::softmax_merge;
using attend::SoftmaxState;

// ---- element conversions (round to nearest even, as torch does) ----------------------------

KVO_HD float bf16_to_float(std::uint16_t h) {
  return quant::float_of(static_cast<std::uint32_t>(h) << 16);
}

KVO_HD std::uint16_t float_to_bf16(float x) {
  const std::uint32_t u = quant::bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40u);  // NaN
  const std::uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>((u + rounding) >> 16);
}

KVO_HD float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1fu;
  std::uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) return quant::float_of(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent != 0) return quant::float_of(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  if (mantissa == 0) return quant::float_of(sign);
  // subnormal half: value = mantissa * 2^-24
  const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
  return sign != 0 ? -magnitude : magnitude;
}

KVO_HD std::uint16_t float_to_f16(float x) {
  const std::uint32_t u = quant::bits_of(x);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {
    // subnormal or zero half: round abs / 2^-24 to nearest even
    const float scaled = quant::float_of(abs) * 16777216.0f;  // exact: power of two
    const std::uint32_t below = static_cast<std::uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(below);
    std::uint32_t m = below;
    if (rest > 0.5f || (rest == 0.5f && (below & 1u) != 0)) m += 1;
    return static_cast<std::uint16_t>(sign | m);
  }
  // normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even
  const std::uint32_t rebased = abs - (112u << 23);
  const std::uint32_t rounding = 0xfffu + ((rebased >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rebased + rounding) >> 13));
}

// Elements by kvo::DType, the one element-type vocabulary of the host path, the kernels and the
// public API (kvoffload/types.hpp). kFP8E4M3 and kInt8 are the bytes of quantized K/V rows
// (kvoffload/quant.hpp, which has is_quantized): load_elem gives their value before the row's
// scale for the head, which kv_scale reads.

// One element of dtype kType at base[index], as f32 (quantized K/V: before its scale).
template <ElementType kType>
KVO_HD float load_as(const void* base, std::int64_t index) {
  if constexpr (kType == ElementType::kF32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kType == ElementType::kF16) {
    return f16_to_float(static_cast<const std::uint16_t*>(base)[index]);
  } else if constexpr (kType == ElementType::kBF16) {
    return bf16_to_float(static_cast<const std::uint16_t*>(base)[index]);
  } else if constexpr (kType == ElementType::kFP8E4M3) {
    return quant::e4m3_to_float(static_cast<const std::uint8_t*>(base)[index]);
  } else {
    static_assert(kType == ElementType::kInt8, "load_as serves the dtypes");
    return static_cast<float>(static_cast<const std::int8_t*>(base)[index]);
  }
}

KVO_HD float load_elem(const void* base, std::int64_t index, DType type) {
  return visit(
      type, [&](auto t) KVO_ELEMENT_LAMBDA { return load_as<decltype(t)::value>(base, index); },
      [] { return 0.0f; });
}

// The scale of kv head `head` in the quantized row that starts at byte `row` of `base`, whose
// scales start `scale_offset` bytes into it.
KVO_HD float kv_scale(const void* base, std::int64_t row, std::int64_t scale_offset, int head) {
  return *reinterpret_cast<const float*>(static_cast<const std::uint8_t*>(base) + row +
                                         scale_offset + 4 * static_cast<std::int64_t>(head));
}

// value stored as one element of dtype kType at base[index]; quantized rows are written whole,
// by quantize_row, so their dtypes store nothing here.
template <ElementType kType>
KVO_HD void store_as(void* base, std::int64_t index, float value) {
  if constexpr (kType == ElementType::kF32) {
    static_cast<float*>(base)[index] = value;
  } else if constexpr (kType == ElementType::kF16) {
    static_cast<std::uint16_t*>(base)[index] = float_to_f16(value);
  } else if constexpr (kType == ElementType::kBF16) {
    static_cast<std::uint16_t*>(base)[index] = float_to_bf16(value);
  }
}

KVO_HD void store_elem(void* base, std::int64_t index, DType type, float value) {
  visit(
      type, [&](auto t) KVO_ELEMENT_LAMBDA { store_as<decltype(t)::value>(base, index, value); },
      [] {});
}

// ---- rotary position embedding ---------------------------------------------------------------

// Rotates one head in place, pairs (i, i + head_dim/2) as Hugging Face's rotate_half does.
// x [head_dim]; inv_freq [head_dim/2].
KVO_HD void rope_rotate(float* x, int head_dim, const float* inv_freq, int position) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    const float angle = static_cast<float>(position) * inv_freq[i];
    const float c = cosf(angle);
    const float s = sinf(angle);
    const float a = x[i];
    const float b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

// ---- Gemma's nonlinearities ------------------------------------------------------------------

// GeLU with the tanh approximation, as torch's gelu(approximate="tanh") evaluates it in float32:
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
KVO_HD float gelu_tanh(float x) {
  const float beta = 0.7978845608028654f;  // sqrt(2 / pi)
  const float inner = beta * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

// ---- seeded synthetic values ----------------------------------------------------------------

KVO_HD std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [-1, 1), a pure function of (seed, stream, index): the same on CPU and GPU.
KVO_HD float seeded_uniform(std::uint64_t seed, std::uint64_t stream, std::uint64_t index) {
  const std::uint64_t bits = splitmix64(splitmix64(seed ^ splitmix64(stream)) + index);
  return static_cast<float>(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// ---- sampling ---------------------------------------------------------------------------------

// The uniform draw in [0, 1) that decides draw number `draw` of `slot`: a pure function of its
// arguments (counter-based), so the host sampler and the device sampler pick the same token.
KVO_HD float sampling_uniform(std::uint64_t seed, std::uint64_t slot, std::uint64_t draw) {
  const std::uint64_t bits = splitmix64(splitmix64(seed ^ splitmix64(slot)) + draw);
  return static_cast<float>(bits >> 40) * (1.0f / 16777216.0f);
}

// A key with the order of the floats (NaN aside): a < b exactly when order_key(a) <
// order_key(b). The device sampler bisects these keys to find top-k and top-p thresholds.
KVO_HD std::uint32_t order_key(float x) {
  const std::uint32_t u = quant::bits_of(x == 0.0f ? 0.0f : x);  // -0 as +0
  return (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
}

}  // namespace kvo::model
