#include "model/host/host_linear.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "kvoffload/error.hpp"
#include "model/host/blas.hpp"
#include "model/host/host_gemm_bf16.hpp"
#include "model/host/host_gemm_q8.hpp"
#include "model/host/host_kernels.hpp"

namespace kvo::model {

// BLAS: OpenBLAS (Debian's libopenblas-dev, its pthread build; model/host/blas.hpp loads it with
// the kernels chosen for the CPU), chosen over BLIS by measurement on this project's GEMM shapes
// (bench/results/blas-choice.md): on the 2-core AMD EPYC (Zen 5) development machine OpenBLAS
// 0.3.21 ran the prefill shapes at 140-220 GFLOP/s, while BLIS 0.9.0 does not know that CPU and
// falls back to its generic kernels (1-75 GFLOP/s). Single-threaded calls on our own pool ran on
// par with OpenBLAS's own threads (ahead on some shapes, behind on others), and leave one pool on
// the cores with results independent of the thread count.
std::string gemm_library(DType weights, bool f32_gemm) {
  std::string what = blas::description();
  if (uses_bf16_gemm(weights, f32_gemm)) {
    what += "; bf16 weights: AVX512_BF16 (activations rounded to bf16)";
  }
  return what;
}

HostLinear::HostLinear(ThreadPool& pool, DType type, bool f32_gemm, bool blocks,
                       bool q8_activations, HostLinearScratch scratch)
    : pool_(pool),
      type_(type),
      bf16_gemm_(uses_bf16_gemm(type, f32_gemm)),
      blocks_(blocks),
      q8_activations_(q8_activations && blocks),
      scratch_(std::move(scratch)) {
  static_assert(kGemmColBlock == bf16_gemm::kCols, "a tile is one panel of the bf16 kernel");
  static_assert(kQ8GemmCols <= kGemmColBlock, "a q8 panel fits the f32 panel's floats");
  blas::description();  // loads OpenBLAS now (single-threaded), not in the first GEMM
}

HostLinear::HostLinear(ThreadPool& pool, DType type, int max_in, bool f32_gemm, bool blocks,
                       bool q8_activations, int max_rows)
    : HostLinear(pool, type, f32_gemm, blocks, q8_activations, HostLinearScratch{}) {
  scratch_ = carve_own(&own_, [&](HostCarver& carver) {
    return HostLinearScratch::carve(carver, pool.threads(), type, max_in, f32_gemm, blocks,
                                    q8_activations, max_rows);
  });
}

void HostLinear::operator()(const float* x, int n, int in, WeightRef w, const void* bias, int out,
                            float* y, bool accumulate) {
  check_weights_type(w, type_, true);
  if (w.type != element_type(type_) && !blocks_) {  // its tiles would overflow the panel
    throw Error(ErrorCode::kInternal, std::string("a matrix of ") + traits(w.type).name +
                                          " in an op planned for " + dtype_name(type_) +
                                          " weights alone");
  }
  if (n >= kGemmMinRows) {
    gemm(x, n, in, w, bias, out, y, accumulate);
    return;
  }
  const int blocks = (out + kDotColBlock - 1) / kDotColBlock;
  if (w.in_blocks() && q8_activations_ && kernels::q8_activations_serve(w.ggml())) {
    const std::size_t stride = kernels::q8_activation_bytes(in);
    for (int t = 0; t < n; ++t) {
      kernels::quantize_activation_q8(w.ggml(), x + static_cast<std::int64_t>(t) * in, in,
                                      scratch_.q8_rows.data() + t * stride);
    }
    // Tasks of 128 rows: the rows' blocks stream from memory longer in one run (measured on the
    // 2-core machine, Q4_K 8-layer model: 78-81 tokens/s against 68-74 with tasks of 32 rows).
    const int rows_per_task = kQ8RowBlock;
    pool_.run((out + rows_per_task - 1) / rows_per_task, [&](int b, int) {
      const int o0 = b * rows_per_task;
      for (int t = 0; t < n; ++t) {
        kernels::linear_row_blocks_q8(scratch_.q8_rows.data() + t * stride, in, w.data, w.ggml(),
                                      type_, bias, o0, std::min(out, o0 + rows_per_task),
                                      y + static_cast<std::int64_t>(t) * out, accumulate);
      }
    });
    return;
  }
  pool_.run(blocks, [&](int b, int thread) {
    const int o0 = b * kDotColBlock;
    float* row = scratch_.panels[static_cast<std::size_t>(thread)].data();
    if (w.in_blocks()) {
      kernels::linear_rows_blocks(x, n, in, in, w.data, w.ggml(), type_, bias, o0,
                                  std::min(out, o0 + kDotColBlock), y, out, accumulate, row);
      return;
    }
    kernels::linear_rows(x, n, in, in, w.data, dtype_of(w.type), type_, bias, o0,
                         std::min(out, o0 + kDotColBlock), y, out, accumulate, row);
  });
}

void HostLinear::gemm(const float* x, int n, int in, WeightRef w, const void* bias, int out,
                      float* y, bool accumulate) {
  if (w.in_blocks() && q8_activations_ && q8_gemm::serves(w.ggml()) && q8_gemm::available()) {
    gemm_q8(x, n, in, w, bias, out, y, accumulate);
    return;
  }
  const int row_blocks = (n + kGemmRowBlock - 1) / kGemmRowBlock;
  const int col_blocks = (out + kGemmColBlock - 1) / kGemmColBlock;
  pool_.run(row_blocks * col_blocks, [&](int task, int thread) {
    const int r0 = (task / col_blocks) * kGemmRowBlock;
    const int rows = std::min(kGemmRowBlock, n - r0);
    const int c0 = (task % col_blocks) * kGemmColBlock;
    const int cols = std::min(kGemmColBlock, out - c0);
    const void* w_block = static_cast<const char*>(w.data) + matrix_bytes(w.type, c0, in);
    const float* panel = static_cast<const float*>(w_block);
    // bf16 weights in a bf16 model go to the bf16 kernel as they are; f16 and bf16 in an f32 model
    // (a GGUF file's, kept) are widened into the panel, as f16 ones in an f16 model are.
    const bool bf16_kernel = bf16_gemm_ && w.type == ElementType::kBF16;
    if (w.in_blocks()) {
      float* p = scratch_.panels[static_cast<std::size_t>(thread)].data();
      kernels::dequantize_rows(w.ggml(), w_block, cols, in, p);
      panel = p;
    } else if (w.type != ElementType::kF32 && !bf16_kernel) {
      float* p = scratch_.panels[static_cast<std::size_t>(thread)].data();
      kernels::to_f32(w_block, dtype_of(w.type), static_cast<std::int64_t>(cols) * in, p);
      panel = p;
    }
    float* y_block = y + static_cast<std::int64_t>(r0) * out + c0;
    float beta = accumulate ? 1.0f : 0.0f;
    if (bias != nullptr) {
      // y = (y + bias) + x W^T, or bias + x W^T
      for (int t = 0; t < rows; ++t) {
        float* yt = y_block + static_cast<std::int64_t>(t) * out;
        for (int o = 0; o < cols; ++o) {
          const float b = load_elem(bias, c0 + o, type_);
          yt[o] = accumulate ? yt[o] + b : b;
        }
      }
      beta = 1.0f;
    }
    const float* x_block = x + static_cast<std::int64_t>(r0) * in;
    if (bf16_kernel) {
      bf16_gemm::multiply(x_block, rows, in, in, static_cast<const std::uint16_t*>(w_block), cols,
                          beta != 0.0f, y_block, out,
                          scratch_.panels[static_cast<std::size_t>(thread)].data());
      return;
    }
    blas::sgemm(true, rows, cols, in, 1.0f, x_block, in, panel, in, beta, y_block, out);
  });
}

void HostLinear::gemm_q8(const float* x, int n, int in, WeightRef w, const void* bias, int out,
                         float* y, bool accumulate) {
  const std::size_t stride = q8_gemm::activation_row_bytes(w.ggml(), in);
  if (n > scratch_.q8_gemm_max_rows) {
    throw Error(ErrorCode::kInternal, "a q8 GEMM of " + std::to_string(n) +
                                          " rows, more than the " +
                                          std::to_string(scratch_.q8_gemm_max_rows) + " planned");
  }
  constexpr int kQuantizeRows = 16;
  pool_.run((n + kQuantizeRows - 1) / kQuantizeRows, [&](int task, int) {
    for (int t = task * kQuantizeRows; t < std::min(n, (task + 1) * kQuantizeRows); ++t) {
      q8_gemm::quantize_row(w.ggml(), x + static_cast<std::int64_t>(t) * in, in,
                            scratch_.q8_gemm_rows.data() + static_cast<std::size_t>(t) * stride);
    }
  });
  pool_.run((out + kQ8GemmCols - 1) / kQ8GemmCols, [&](int task, int thread) {
    const int c0 = task * kQ8GemmCols;
    const int cols = std::min(kQ8GemmCols, out - c0);
    void* panel = scratch_.panels[static_cast<std::size_t>(thread)].data();
    q8_gemm::pack(w.ggml(), static_cast<const char*>(w.data) + matrix_bytes(w.type, c0, in), cols,
                  in, panel);
    q8_gemm::multiply(w.ggml(), panel, cols, in, scratch_.q8_gemm_rows.data(), n, type_, bias, c0,
                      y + c0, out, accumulate);
  });
}

}  // namespace kvo::model
