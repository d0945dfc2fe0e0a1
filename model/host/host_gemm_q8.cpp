#include "model/host/host_gemm_q8.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/checkpoint/ggml_blocks.hpp"
#include "model/host/host_kernels.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVO_GEMM_Q8_HAVE_VNNI_CODE 1
#define KVO_GEMM_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,fma")))
#else
#define KVO_GEMM_Q8_HAVE_VNNI_CODE 0
#endif

namespace kvo::model::q8_gemm {
namespace {

constexpr int kGroup = 16;  // weight rows a group of the panel interleaves
constexpr int kTokens = 8;  // activation rows the kernel multiplies together

bool has_offset(std::uint32_t type) {
  return type == blocks::kQ4_1 || type == blocks::kQ4_K || type == blocks::kQ5_K;
}

// A quantized activation row: q [in], then per sub-block b: the integer start of its sum,
// -code_offset * sum q (so that the sum over u q comes out as the sum over (u - offset) q), d, and
// d * sum q (f32) for the offsets m; then the group scales d [in / 32] as the quantizer writes them
// and the sums of q it writes.
struct XRow {
  std::int8_t* q;
  std::int32_t* start;
  float* d;
  float* dsum;
  float* d32;
  std::int32_t* sums;
};

XRow x_row(std::uint32_t type, void* base, int in) {
  const int subs = in / sub_block(type);
  auto* p = static_cast<std::uint8_t*>(base);
  XRow r{};
  r.q = reinterpret_cast<std::int8_t*>(p);
  p += in;
  r.start = reinterpret_cast<std::int32_t*>(p);
  p += 4 * static_cast<std::size_t>(subs);
  r.d = reinterpret_cast<float*>(p);
  p += 4 * static_cast<std::size_t>(subs);
  r.dsum = reinterpret_cast<float*>(p);
  p += 4 * static_cast<std::size_t>(subs);
  r.d32 = reinterpret_cast<float*>(p);
  p += 4 * static_cast<std::size_t>(in / 32);
  r.sums = reinterpret_cast<std::int32_t*>(p);
  return r;
}

// The panel: per group of 16 rows, per sub-block, the codes [S / 4][16 rows][4], then the 16
// rows' scales, then (types with offsets) their offsets.
std::size_t block_stride(std::uint32_t type) {
  return static_cast<std::size_t>(sub_block(type)) * kGroup + 64 + (has_offset(type) ? 64 : 0);
}
std::size_t group_stride(std::uint32_t type, int in) {
  return static_cast<std::size_t>(in / sub_block(type)) * block_stride(type);
}

const std::uint8_t* bytes_of(const void* p) {
  return static_cast<const std::uint8_t*>(p);
}

float bias_at(DType bias_type, const void* bias, int o) {
  return bias != nullptr ? load_elem(bias, o, bias_type) : 0.0f;
}

// The plain loops: each output's sub-blocks in order, the same steps as the VNNI kernel's lanes.
void multiply_portable(std::uint32_t type, const void* panel, int rows, int in, const void* xq,
                       int n, DType bias_type, const void* bias, int o0, float* y, std::int64_t ldy,
                       bool accumulate) {
  const int S = sub_block(type);
  const int subs = in / S;
  const bool offset = has_offset(type);
  const std::size_t row_bytes = activation_row_bytes(type, in);
  for (int t = 0; t < n; ++t) {
    const XRow x = x_row(type, const_cast<std::uint8_t*>(bytes_of(xq)) + t * row_bytes, in);
    for (int o = 0; o < rows; ++o) {
      const std::uint8_t* g = bytes_of(panel) + (o / kGroup) * group_stride(type, in);
      const int lane = o % kGroup;
      float acc = 0.0f;
      for (int b = 0; b < subs; ++b) {
        const std::uint8_t* blk = g + static_cast<std::size_t>(b) * block_stride(type);
        std::int32_t s = x.start[b];
        for (int i = 0; i < S; ++i) {
          s += blk[(i / 4) * 64 + lane * 4 + i % 4] * x.q[b * S + i];
        }
        float scale = 0.0f, m = 0.0f;
        std::memcpy(&scale, blk + S * kGroup + 4 * lane, 4);
        acc = std::fma(static_cast<float>(s) * x.d[b], scale, acc);
        if (offset) {
          std::memcpy(&m, blk + S * kGroup + 64 + 4 * lane, 4);
          acc = std::fma(m, x.dsum[b], acc);
        }
      }
      float* out = y + t * ldy + o;
      const float value = acc + bias_at(bias_type, bias, o0 + o);
      *out = accumulate ? *out + value : value;
    }
  }
}

#if KVO_GEMM_Q8_HAVE_VNNI_CODE

// kC tokens against one group of 16 rows (`lanes` of them real): the 16 x kC outputs in registers.
template <int kS, bool kOffset, int kC>
KVO_GEMM_VNNI void group_tokens(const std::uint8_t* g, int subs, const XRow* x, const float* bias16,
                                int lanes, float* y, std::int64_t ldy, bool accumulate) {
  constexpr std::size_t kStride = static_cast<std::size_t>(kS) * kGroup + 64 + (kOffset ? 64 : 0);
  __m512 acc[kC];
  for (int c = 0; c < kC; ++c) acc[c] = _mm512_setzero_ps();
  for (int b = 0; b < subs; ++b) {
    const std::uint8_t* blk = g + static_cast<std::size_t>(b) * kStride;
    __m512i sum[kC];
    for (int c = 0; c < kC; ++c) sum[c] = _mm512_set1_epi32(x[c].start[b]);
    for (int k = 0; k < kS / 4; ++k) {
      const __m512i codes = _mm512_loadu_si512(blk + 64 * k);
      for (int c = 0; c < kC; ++c) {
        std::int32_t four = 0;
        std::memcpy(&four, x[c].q + b * kS + 4 * k, 4);
        sum[c] = _mm512_dpbusd_epi32(sum[c], codes, _mm512_set1_epi32(four));
      }
    }
    const __m512 scale = _mm512_loadu_ps(blk + kS * kGroup);
    for (int c = 0; c < kC; ++c) {
      const __m512 p = _mm512_mul_ps(_mm512_cvtepi32_ps(sum[c]), _mm512_set1_ps(x[c].d[b]));
      acc[c] = _mm512_fmadd_ps(p, scale, acc[c]);
    }
    if constexpr (kOffset) {
      const __m512 m = _mm512_loadu_ps(blk + kS * kGroup + 64);
      for (int c = 0; c < kC; ++c)
        acc[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(x[c].dsum[b]), acc[c]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << lanes) - 1);
  const __m512 b = _mm512_loadu_ps(bias16);
  for (int c = 0; c < kC; ++c) {
    float* out = y + c * ldy;
    __m512 value = _mm512_add_ps(acc[c], b);
    if (accumulate) value = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), value);
    _mm512_mask_storeu_ps(out, mask, value);
  }
}

template <int kS, bool kOffset>
KVO_GEMM_VNNI void multiply_vnni(std::uint32_t type, const void* panel, int rows, int in,
                                 const void* xq, int n, DType bias_type, const void* bias, int o0,
                                 float* y, std::int64_t ldy, bool accumulate) {
  const int subs = in / kS;
  const std::size_t row_bytes = activation_row_bytes(type, in);
  XRow x[kTokens];
  for (int r0 = 0; r0 < rows; r0 += kGroup) {
    const int lanes = std::min(kGroup, rows - r0);
    alignas(64) float bias16[kGroup] = {};
    for (int l = 0; l < lanes; ++l) bias16[l] = bias_at(bias_type, bias, o0 + r0 + l);
    const std::uint8_t* g = bytes_of(panel) + (r0 / kGroup) * group_stride(type, in);
    for (int t0 = 0; t0 < n; t0 += kTokens) {
      const int tokens = std::min(kTokens, n - t0);
      for (int c = 0; c < tokens; ++c) {
        x[c] = x_row(type, const_cast<std::uint8_t*>(bytes_of(xq)) + (t0 + c) * row_bytes, in);
      }
      float* out = y + t0 * ldy + r0;
      switch (tokens) {
#define KVO_Q8_TOKENS(k)                                                           \
  case k:                                                                          \
    group_tokens<kS, kOffset, k>(g, subs, x, bias16, lanes, out, ldy, accumulate); \
    break;
        KVO_Q8_TOKENS(1)
        KVO_Q8_TOKENS(2)
        KVO_Q8_TOKENS(3)
        KVO_Q8_TOKENS(4)
        KVO_Q8_TOKENS(5)
        KVO_Q8_TOKENS(6)
        KVO_Q8_TOKENS(7)
        KVO_Q8_TOKENS(8)
#undef KVO_Q8_TOKENS
        default:
          break;
      }
    }
  }
}

#endif

bool have_vnni() {
  return kernels::have_avx512_vnni();
}

}  // namespace

bool serves(std::uint32_t type) {
  return type == blocks::kQ8_0 || type == blocks::kQ4_0 || type == blocks::kQ4_1 ||
         type == blocks::kQ4_K || type == blocks::kQ5_K || type == blocks::kQ6_K;
}

bool available() {
  return have_vnni();
}

void quantize_row(std::uint32_t type, const float* x, int in, void* dst, bool portable) {
  const int S = sub_block(type);
  const XRow r = x_row(type, dst, in);
  kernels::quantize_q8_groups(x, in, 32, S, false, r.d32, r.sums, r.q, portable);
  const int offset = blocks::code_offset(type);
  for (int b = 0; b < in / S; ++b) {
    r.start[b] = -offset * r.sums[b];
    r.d[b] = r.d32[b * S / 32];
    r.dsum[b] = r.d[b] * static_cast<float>(r.sums[b]);
  }
}

std::size_t panel_bytes(std::uint32_t type, int rows, int in) {
  return static_cast<std::size_t>((rows + kGroup - 1) / kGroup) * group_stride(type, in);
}

void pack(std::uint32_t type, const void* w, int rows, int in, void* panel) {
  const int S = sub_block(type);
  const bool offset = has_offset(type);
  const int per_block = blocks::block_elements(type);
  const int parts_per_block = per_block / 32;
  const std::size_t block_bytes = static_cast<std::size_t>(blocks::block_bytes(type));
  const std::size_t row_bytes = static_cast<std::size_t>(in / per_block) * block_bytes;
  const std::size_t stride = block_stride(type);
  const std::size_t groups = group_stride(type, in);
  auto* out = static_cast<std::uint8_t*>(panel);
  if (rows % kGroup != 0) {  // the rows that pad the last group: zeros
    std::memset(out + (rows / kGroup) * groups, 0, groups);
  }
  std::uint8_t u[32];
  float scale[2] = {0.0f, 0.0f};
  float m = 0.0f;
  for (int o = 0; o < rows; ++o) {
    std::uint8_t* g = out + (o / kGroup) * groups;
    const std::size_t lane = 4 * static_cast<std::size_t>(o % kGroup);
    const std::uint8_t* row = bytes_of(w) + static_cast<std::size_t>(o) * row_bytes;
    for (int part = 0; part < in / 32; ++part) {
      blocks::codes_part(type, row + static_cast<std::size_t>(part / parts_per_block) * block_bytes,
                         part % parts_per_block, u, scale, &m);
      // The part's sub-blocks (one, or two of 16): four codes a row at each 64 bytes, then the
      // row's scale and offset.
      for (int h = 0; h < 32 / S; ++h) {
        std::uint8_t* blk = g + static_cast<std::size_t>(part * (32 / S) + h) * stride;
        for (int k = 0; k < S / 4; ++k) std::memcpy(blk + 64 * k + lane, u + S * h + 4 * k, 4);
        std::memcpy(blk + S * kGroup + lane, &scale[h], 4);  // h is 0 but for Q6_K
        if (offset) std::memcpy(blk + S * kGroup + 64 + lane, &m, 4);
      }
    }
  }
}

void multiply(std::uint32_t type, const void* panel, int rows, int in, const void* xq, int n,
              DType bias_type, const void* bias, int o0, float* y, std::int64_t ldy,
              bool accumulate, bool portable) {
#if KVO_GEMM_Q8_HAVE_VNNI_CODE
  if (!portable && have_vnni()) {
    if (type == blocks::kQ6_K) {
      return multiply_vnni<16, false>(type, panel, rows, in, xq, n, bias_type, bias, o0, y, ldy,
                                      accumulate);
    }
    if (has_offset(type)) {
      return multiply_vnni<32, true>(type, panel, rows, in, xq, n, bias_type, bias, o0, y, ldy,
                                     accumulate);
    }
    return multiply_vnni<32, false>(type, panel, rows, in, xq, n, bias_type, bias, o0, y, ldy,
                                    accumulate);
  }
#endif
  multiply_portable(type, panel, rows, in, xq, n, bias_type, bias, o0, y, ldy, accumulate);
}

}  // namespace kvo::model::q8_gemm
