#include "model/host/host_kernels.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/checkpoint/ggml_blocks.hpp"
#include "offload/attend/row_math.hpp"
#include "offload/util/element_types.hpp"

namespace kvo::model::kernels {

using namespace attend::rows;  // the row helpers (offload/attend/row_math.hpp)

KVO_VECTOR_CLONES
void to_f32(const void* src, DType type, std::int64_t count, float* dst) {
  // f16 through vcvtph2ps where the CPU has AVX-512: the portable loop spends about ten
  // instructions on each 16 elements, which a prefill GEMM over a kept f16 matrix paid per tile.
  if (type == DType::kF16 && have_avx512() && f16_to_f32_avx512(src, count, dst)) return;
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
                 DType bias_type, const void* bias, int o0, int o1, float* y, std::int64_t ldy,
                 bool accumulate, float* row) {
  if (KVO_DOT_FUSES_ON_AVX512 && type != DType::kF32 && have_avx512() &&
      linear_rows_avx512(x, rows, ldx, in, w, type, bias_type, bias, o0, o1, y, ldy, accumulate)) {
    return;
  }
  const std::size_t elem = element_bytes(type);
  for (int o = o0; o < o1; ++o) {
    const void* wo = static_cast<const char*>(w) + static_cast<std::size_t>(o) * in * elem;
    const float* wf = static_cast<const float*>(wo);
    if (type != DType::kF32) {
      convert_row(wo, type, in, row);
      wf = row;
    }
    const float b = bias != nullptr ? load_elem(bias, o, bias_type) : 0.0f;
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
