#include "model/host/host_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/checkpoint/ggml_blocks.hpp"
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

namespace kvo::model::kernels {
namespace {

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

}  // namespace

KVO_VECTOR_CLONES
void to_f32(const void* src, DType type, std::int64_t count, float* dst) {
  convert_row(src, type, count, dst);
}

KVO_VECTOR_CLONES
void from_f32(const float* src, std::int64_t count, DType type, void* dst) {
  if (type == DType::kF32) {
    std::memcpy(dst, src, static_cast<std::size_t>(count) * sizeof(float));
  } else if (type == DType::kBF16) {
    auto* h = static_cast<std::uint16_t*>(dst);
    for (std::int64_t i = 0; i < count; ++i) h[i] = bf16_of(src[i]);
  } else {
    auto* h = static_cast<std::uint16_t*>(dst);
    for (std::int64_t i = 0; i < count; ++i) h[i] = float_to_f16(src[i]);
  }
}

KVO_VECTOR_CLONES
void swiglu(float* gate, const float* up, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + exp_value(-g)) * up[i];
  }
}

void geglu_tanh(float* gate, const float* up, std::int64_t count) {
  for (std::int64_t i = 0; i < count; ++i) gate[i] = gelu_tanh(gate[i]) * up[i];
}

KVO_VECTOR_CLONES
void add(float* x, const float* y, std::int64_t count, float scale) {
  if (scale == 1) {
    for (std::int64_t i = 0; i < count; ++i) x[i] += y[i];
    return;
  }
  for (std::int64_t i = 0; i < count; ++i) {
    const float scaled = y[i] * scale;  // rounded, then added: as transformers takes it
    x[i] += scaled;
  }
}

void scale(float* x, std::int64_t count, float factor) {
  for (std::int64_t i = 0; i < count; ++i) x[i] *= factor;
}

void soft_cap(float* x, std::int64_t count, float cap) {
  for (std::int64_t i = 0; i < count; ++i) x[i] = soft_cap_value(x[i], cap);
}

KVO_VECTOR_CLONES
void rms_norm_rows(const float* x, int rows, int h, const float* w, float eps, float* out) {
  constexpr int kPartials = 8;
  for (int t = 0; t < rows; ++t) {
    const float* xt = x + static_cast<std::int64_t>(t) * h;
    double acc[kPartials] = {};
    int i = 0;
    for (; i + kPartials <= h; i += kPartials) {
      for (int j = 0; j < kPartials; ++j) {
        acc[j] += static_cast<double>(xt[i + j]) * static_cast<double>(xt[i + j]);
      }
    }
    double sum = 0;
    for (; i < h; ++i) sum += static_cast<double>(xt[i]) * static_cast<double>(xt[i]);
    for (int j = 0; j < kPartials; ++j) sum += acc[j];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum / h + static_cast<double>(eps)));
    float* ot = out + static_cast<std::int64_t>(t) * h;
    for (int j = 0; j < h; ++j) ot[j] = w[j] * (xt[j] * scale);
  }
}

KVO_VECTOR_CLONES
void linear_rows(const float* x, int rows, std::int64_t ldx, int in, const void* w, DType type,
                 const void* bias, int o0, int o1, float* y, std::int64_t ldy, bool accumulate,
                 float* row) {
  const std::size_t elem = element_bytes(type);
  for (int o = o0; o < o1; ++o) {
    const void* wo = static_cast<const char*>(w) + static_cast<std::size_t>(o) * in * elem;
    const float* wf = static_cast<const float*>(wo);
    if (type != DType::kF32) {
      convert_row(wo, type, in, row);
      wf = row;
    }
    const float b = bias != nullptr ? load_elem(bias, o, type) : 0.0f;
    for (int t = 0; t < rows; ++t) {
      const float value = dot(x + t * ldx, wf, in) + b;
      float& dst = y[t * ldy + o];
      dst = accumulate ? dst + value : value;
    }
  }
}

// The blocks of one type, fixed at compile time, so that the loops over a block's elements
// vectorize inside each level's clone.
template <std::uint32_t kType>
__attribute__((always_inline)) inline void dequantize_typed(const std::uint8_t* b,
                                                            std::int64_t count, float* dst) {
  const int per_block = blocks::block_elements(kType);
  const int block_bytes = blocks::block_bytes(kType);
  for (std::int64_t at = 0; at < count; at += per_block, b += block_bytes) {
    blocks::dequantize_block(kType, b, dst + at);
  }
}

// Each type's loops inlined into the level's clone with the type fixed, so that they vectorize.
KVO_VECTOR_CLONES
void dequantize_rows(std::uint32_t type, const void* src, int rows, int in, float* dst) {
  const auto* b = static_cast<const std::uint8_t*>(src);
  const std::int64_t count = static_cast<std::int64_t>(rows) * in;
  blocks::visit_ggml(
      type,
      [&](auto t)
          KVO_ELEMENT_LAMBDA { dequantize_typed<blocks::kGgml<decltype(t)>>(b, count, dst); },
      [] {});
}

// Each row of w dequantized into `row` (L1 or L2: at most a row of the widest input) by the
// vectorized block loops, then dot() with every x row: the bits of the row expanded to f32.
KVO_VECTOR_CLONES
void linear_rows_blocks(const float* x, int rows, std::int64_t ldx, int in, const void* w,
                        std::uint32_t type, DType bias_type, const void* bias, int o0, int o1,
                        float* y, std::int64_t ldy, bool accumulate, float* row) {
  if (KVO_DOT_FUSES_ON_AVX512 && rows == 1 && have_avx512() &&
      linear_row_blocks_avx512(x, in, w, type, bias_type, bias, o0, o1, y, accumulate)) {
    return;
  }
  const std::size_t row_bytes = static_cast<std::size_t>(in / blocks::block_elements(type)) *
                                static_cast<std::size_t>(blocks::block_bytes(type));
  for (int o = o0; o < o1; ++o) {
    dequantize_rows(type, static_cast<const char*>(w) + static_cast<std::size_t>(o) * row_bytes, 1,
                    in, row);
    const float b = bias != nullptr ? load_elem(bias, o, bias_type) : 0.0f;
    for (int t = 0; t < rows; ++t) {
      const float value = dot(x + t * ldx, row, in) + b;
      float& dst = y[t * ldy + o];
      dst = accumulate ? dst + value : value;
    }
  }
}

KVO_VECTOR_CLONES
void attend_keys(const float* q, int kv_heads, int group, int head_dim, KeyRows k, KeyRows v,
                 int keys, SoftmaxState* state, float* acc, float* kv, float* scores,
                 float softcap) {
  const int d = head_dim;
  const int rows = kv_heads * group;
  const auto elem = static_cast<std::int64_t>(element_bytes(k.type));
  // Keys [j0, j0 + nb) of every head as f32: kv [j][g][d].
  auto convert_block = [&](const KeyRows& from, int j0, int nb) {
    for (int j = 0; j < nb; ++j) {
      for (int g = 0; g < kv_heads; ++g) {
        const std::int64_t at = (j0 + j) * from.token_stride + g * from.head_stride;
        convert_row(static_cast<const char*>(from.base) + at * elem, from.type, d,
                    kv + (static_cast<std::int64_t>(j) * kv_heads + g) * d);
      }
    }
  };
  for (int j0 = 0; j0 < keys; j0 += kKeyBlock) {
    const int nb = std::min(kKeyBlock, keys - j0);
    convert_block(k, j0, nb);
    for (int row = 0; row < rows; ++row) {
      const int g = row / group;
      float* s = scores + row * kKeyBlock;
      for (int j = 0; j < nb; ++j) {
        s[j] = dot(q + static_cast<std::int64_t>(row) * d,
                   kv + (static_cast<std::int64_t>(j) * kv_heads + g) * d, d);
      }
      if (softcap > 0) {
        for (int j = 0; j < nb; ++j) s[j] = soft_cap_value(s[j], softcap);
      }
      const float factor = softmax_block_rescale(state[row], max_of(s, nb));
      if (factor != 1.0f) {
        float* a = acc + static_cast<std::int64_t>(row) * d;
        for (int e = 0; e < d; ++e) a[e] *= factor;
        state[row].sum *= factor;
      }
      for (int j = 0; j < nb; ++j) s[j] -= state[row].max;
      exp_row(s, nb);
      state[row].sum += sum_of(s, nb);
    }
    convert_block(v, j0, nb);
    for (int j = 0; j < nb; ++j) {
      for (int row = 0; row < rows; ++row) {
        const float p = scores[row * kKeyBlock + j];
        const float* vj = kv + (static_cast<std::int64_t>(j) * kv_heads + row / group) * d;
        float* a = acc + static_cast<std::int64_t>(row) * d;
        for (int e = 0; e < d; ++e) a[e] += p * vj[e];
      }
    }
  }
}

KVO_VECTOR_CLONES
void softmax_block(float* s, int rows, int keys, std::int64_t lds, int key0, const int* first,
                   const int* last, SoftmaxState* state, float* o, int head_dim) {
  for (int i = 0; i < rows; ++i) {
    float* si = s + i * lds;
    const int a = std::clamp(first[i] - key0, 0, keys);
    const int b = std::clamp(last[i] - key0 + 1, 0, keys);
    const float factor = softmax_block_rescale(state[i], a < b ? max_of(si + a, b - a) : -INFINITY);
    if (factor != 1.0f) {
      float* oi = o + static_cast<std::int64_t>(i) * head_dim;
      for (int e = 0; e < head_dim; ++e) oi[e] *= factor;
      state[i].sum *= factor;
    }
    if (a >= b) {
      std::fill(si, si + keys, 0.0f);
      continue;
    }
    const float m = state[i].max;
    for (int j = 0; j < keys; ++j) si[j] = j >= a && j < b ? si[j] - m : -INFINITY;
    exp_row(si, keys);
    state[i].sum += sum_of(si, keys);
  }
}

}  // namespace kvo::model::kernels
