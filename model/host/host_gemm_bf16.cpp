// The bf16 GEMM of model/host/host_gemm_bf16.hpp, with AVX-512 BF16 intrinsics (picked at run
// time).
//
// VDPBF16PS multiplies pairs: lane j of the result gains a[2j] b[2j] + a[2j+1] b[2j+1]. The
// weights are packed so that one 512-bit load holds the pair (w[c][2p], w[c][2p+1]) of 16
// columns c, and a row of x is converted into bf16 pairs, one 32-bit broadcast per pair: an
// outer product of kRows rows by 32 columns per pair of inputs, 2 * kRows instructions, no
// horizontal sums. Inputs go in chunks of kChunkPairs pairs so that the packed panel (128 KiB)
// stays in L2 and a chunk of x rows in L1; the partial sums wait in y between chunks, exactly
// (they are f32 either way), so every output is the same sum in the same order.
#include "model/host/host_gemm_bf16.hpp"

#include <algorithm>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVO_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))
#endif

namespace kvo::model::bf16_gemm {
namespace {

// Scratch (scratch_bytes): the panel [kChunkPairs][kCols] pairs, then kRows rows of [kChunkPairs]
// pairs.
constexpr std::size_t kPanelPairs = static_cast<std::size_t>(kChunkPairs) * kCols;

}  // namespace

#ifdef KVO_BF16

namespace {

// Mask of the first n of 16 lanes (n may be <= 0 or >= 16).
inline __mmask16 first_lanes(int n) {
  return n <= 0    ? 0
         : n >= 16 ? static_cast<__mmask16>(0xFFFF)
                   : static_cast<__mmask16>((1u << n) - 1);
}

// panel [pairs][kCols]: the pairs (w[c][2p], w[c][2p + 1]) of pairs p0 + [0, pairs), 0 past
// `cols` columns and past `in` inputs.
KVO_BF16 void pack_panel(const std::uint16_t* w, int cols, int in, int p0, int pairs,
                         std::uint32_t* panel) {
  const int whole = std::min(pairs, in / 2 - p0);  // pairs that lie inside every row
  for (int g = 0; g < kCols / 16; ++g) {
    const __mmask16 valid = first_lanes(cols - 16 * g);
    // Element offsets of each column's row, in units of 2 bytes.
    const __m512i rows = _mm512_mullo_epi32(
        _mm512_add_epi32(_mm512_set1_epi32(16 * g),
                         _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)),
        _mm512_set1_epi32(in));
    for (int p = 0; p < pairs; ++p) {
      __m512i v = _mm512_setzero_si512();
      if (p < whole && valid != 0) {
        const __m512i at = _mm512_add_epi32(rows, _mm512_set1_epi32(2 * (p0 + p)));
        v = _mm512_mask_i32gather_epi32(v, valid, at, w, 2);
      }
      _mm512_storeu_si512(panel + static_cast<std::size_t>(p) * kCols + 16 * g, v);
    }
  }
  // An odd last input pairs with 0.
  if (in % 2 == 1 && p0 + pairs > in / 2) {
    const int p = in / 2 - p0;
    for (int c = 0; c < cols; ++c) {
      panel[static_cast<std::size_t>(p) * kCols + c] = w[static_cast<std::size_t>(c) * in + in - 1];
    }
  }
}

// Row r of x, inputs 2 p0 + [0, 2 pairs), as bf16 pairs (round to nearest even; 0 past `in`).
KVO_BF16 void convert_row(const float* x, int in, int p0, int pairs, std::uint32_t* out) {
  const int first = 2 * p0;
  const int count = std::min(2 * pairs, in - first);  // inputs that exist
  auto* dst = reinterpret_cast<std::uint16_t*>(out);
  for (int i = 0; i < 2 * pairs; i += 16) {
    const __mmask16 m = first_lanes(count - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + first + i);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), (__m256i)_mm512_cvtneps_pbh(v));
  }
}

// y [MR][32 columns from c] (+)= x pairs [MR][pairs] . panel [pairs][c .. c + 32).
template <int MR>
KVO_BF16 void tile(const std::uint32_t* xp, const std::uint32_t* panel, int pairs, int c, int cols,
                   bool accumulate, float* y, std::int64_t ld_y) {
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const std::uint32_t* wp = panel + c;
  for (int p = 0; p < pairs; ++p, wp += kCols) {
    const __m512i w0 = _mm512_loadu_si512(wp);
    const __m512i w1 = _mm512_loadu_si512(wp + 16);
    for (int i = 0; i < MR; ++i) {
      const __m512i a = _mm512_set1_epi32(static_cast<int>(xp[i * kChunkPairs + p]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)a, (__m512bh)w0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], (__m512bh)a, (__m512bh)w1);
    }
  }
  const __mmask16 m0 = first_lanes(cols - c);
  const __mmask16 m1 = first_lanes(cols - c - 16);
  for (int i = 0; i < MR; ++i) {
    float* row = y + i * ld_y + c;
    if (accumulate) {
      acc[i][0] = _mm512_add_ps(_mm512_maskz_loadu_ps(m0, row), acc[i][0]);
      acc[i][1] = _mm512_add_ps(_mm512_maskz_loadu_ps(m1, row + 16), acc[i][1]);
    }
    _mm512_mask_storeu_ps(row, m0, acc[i][0]);
    _mm512_mask_storeu_ps(row + 16, m1, acc[i][1]);
  }
}

using TileFn = void (*)(const std::uint32_t*, const std::uint32_t*, int, int, int, bool, float*,
                        std::int64_t);
constexpr TileFn kTiles[kRows + 1] = {nullptr, tile<1>, tile<2>, tile<3>, tile<4>,
                                      tile<5>, tile<6>, tile<7>, tile<8>};

}  // namespace

namespace {

KVO_BF16 void multiply_bf16(const float* x, int rows, int in, std::int64_t ld_x,
                            const std::uint16_t* w, int cols, bool accumulate, float* y,
                            std::int64_t ld_y, void* scratch) {
  auto* panel = static_cast<std::uint32_t*>(scratch);
  std::uint32_t* xp = panel + kPanelPairs;
  const int in_pairs = (in + 1) / 2;
  for (int p0 = 0; p0 < in_pairs; p0 += kChunkPairs) {
    const int pairs = std::min(kChunkPairs, in_pairs - p0);
    pack_panel(w, cols, in, p0, pairs, panel);
    const bool add = accumulate || p0 > 0;
    for (int r0 = 0; r0 < rows; r0 += kRows) {
      const int mr = std::min(kRows, rows - r0);
      for (int i = 0; i < mr; ++i) {
        convert_row(x + (r0 + i) * ld_x, in, p0, pairs, xp + i * kChunkPairs);
      }
      for (int c = 0; c < cols; c += 32) {
        kTiles[mr](xp, panel, pairs, c, cols, add, y + r0 * ld_y, ld_y);
      }
    }
  }
}

}  // namespace

void multiply(const float* x, int rows, int in, std::int64_t ld_x, const std::uint16_t* w, int cols,
              bool accumulate, float* y, std::int64_t ld_y, void* scratch) {
  multiply_bf16(x, rows, in, ld_x, w, cols, accumulate, y, ld_y, scratch);
}

#else  // no x86-64 AVX-512 intrinsics in this build

void multiply(const float*, int, int, std::int64_t, const std::uint16_t*, int, bool, float*,
              std::int64_t, void*) {}

#endif

}  // namespace kvo::model::bf16_gemm
