// The host path's GEMMs: y [n][out] = x [n][in] W^T + bias, W [out][in] in the model dtype.
//
// Prefill-sized calls (n >= kGemmMinRows) go to OpenBLAS's sgemm, one call per tile of
// [kGemmRowBlock rows][kGemmColBlock outputs], the tiles spread over the thread pool with BLAS
// itself single-threaded. f16/bf16 weights are not kept as f32 copies: each tile converts its
// kGemmColBlock rows of W into a per-thread f32 panel first (kGemmColBlock x in floats per thread,
// 7 MiB at in = 14336, in the host workspace the memory plan counts: host_workspace.hpp), work that
// is 1/n of the tile's multiply-adds. bf16 weights on a CPU with AVX512_BF16 multiply as they are
// instead (model/host/host_gemm_bf16.hpp: the activations rounded to bf16, twice the rate), unless
// f32 is asked for.
//
// W may also be kept in GGUF blocks (model/checkpoint/ggml_blocks.hpp): a GEMM tile then
// dequantizes its kGemmColBlock rows into the thread's f32 panel, as f16 weights are converted,
// and a decode-sized call dequantizes one row at a time (kernels::linear_rows_blocks). In an f32
// model W may be a GGUF file's f16 or bf16 matrix kept in its type: widened into the panel, or
// in registers row by row, the bits of the matrix expanded to f32. Asked for
// (q8 activations), both quantize x to 8 bits and multiply in integers instead: decode rows with
// kernels::linear_row_blocks_q8, GEMMs with model/host/host_gemm_q8.hpp where the CPU has
// AVX512-VNNI (elsewhere a GEMM keeps the f32 panel, faster than integer loops without it).
//
// Decode-sized calls (a few rows) read W in place, one output row at a time
// (kernels::linear_rows), spread over blocks of outputs: they are bound by reading W, and every
// row of y comes out the same whatever the batch, so slots decoded together get exactly the bits
// each gets alone. Tiles and blocks depend on the shapes only, never on the thread count.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "model/checkpoint/weights.hpp"
#include "model/common/numerics.hpp"
#include "model/host/host_workspace.hpp"
#include "model/host/thread_pool.hpp"

namespace kvo::model {

// The BLAS the host path's GEMMs call and the kernels chosen for this CPU, e.g. "OpenBLAS
// 0.3.21, SkylakeX kernels (chosen for AVX-512)" (model/host/blas.hpp), and for `weights` in bf16
// what multiplies them: "; bf16 weights: AVX512_BF16 (activations rounded to bf16)".
std::string gemm_library(DType weights, bool f32_gemm);

// Whether prefill GEMMs of `weights` go through the AVX512_BF16 kernel: bf16 weights, a CPU
// that has it, and f32 not asked for.
bool uses_bf16_gemm(DType weights, bool f32_gemm);

class HostLinear {
 public:
  static constexpr int kGemmMinRows = 16;
  static constexpr int kGemmRowBlock = 256;
  static constexpr int kGemmColBlock = 128;
  static constexpr int kDotColBlock = 32;
  static constexpr int kQ8RowBlock = 128;  // rows a task of a q8-activation decode call takes
  static constexpr int kQ8GemmCols = 64;   // outputs a task of a q8-activation GEMM takes

  // max_in: the widest input of any call. Loads OpenBLAS (single-threaded) if need be.
  // f32_gemm: bf16 weights multiply in f32 even where the CPU has AVX512_BF16. blocks: some
  // matrices come in GGUF blocks or, in an f32 model, kept f16/bf16 (their panels are sized for
  // them; without it such a matrix is refused).
  // q8_activations: decode-sized calls on blocks kernels::q8_activations_serve() serves quantize
  // x to 8 bits and multiply with kernels::linear_row_blocks_q8.
  // max_rows: the most rows a call multiplies (the q8 GEMM's quantized rows are sized for it; a
  // q8 GEMM of more rows throws kvo::Error(kInternal)).
  // scratch: carved for the same arguments and the pool's threads (HostLinearScratch::carve);
  // without it, the object carves a region of its own.
  HostLinear(ThreadPool& pool, DType type, int max_in, bool f32_gemm = false, bool blocks = false,
             bool q8_activations = false, int max_rows = kGemmMinRows);
  HostLinear(ThreadPool& pool, DType type, bool f32_gemm, bool blocks, bool q8_activations,
             HostLinearScratch scratch);

  // y [n][out] = x [n][in] W^T + bias (bias [out] or null, in the model dtype); y += instead
  // with `accumulate`.
  void operator()(const float* x, int n, int in, WeightRef w, const void* bias, int out, float* y,
                  bool accumulate);

 private:
  void gemm(const float* x, int n, int in, WeightRef w, const void* bias, int out, float* y,
            bool accumulate);
  // gemm() for weights in blocks with x quantized to 8 bits (q8_gemm): tasks of kQ8GemmCols
  // outputs over all n rows, each repacking its weight rows once.
  void gemm_q8(const float* x, int n, int in, WeightRef w, const void* bias, int out, float* y,
               bool accumulate);

  ThreadPool& pool_;
  DType type_;
  bool bf16_gemm_;
  bool blocks_;  // matrices of other types may come (GGUF blocks, kept f16/bf16): wide panels
  bool q8_activations_;
  std::unique_ptr<HostRegion> own_;  // the region without a given scratch
  HostLinearScratch scratch_;
};

}  // namespace kvo::model
