#include "model/host/host_workspace.hpp"

#include <algorithm>
#include <string>

#include "kvoffload/error.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "model/host/host_attention.hpp"
#include "model/host/host_gemm_bf16.hpp"
#include "model/host/host_gemm_q8.hpp"
#include "model/host/host_kernels.hpp"
#include "model/host/host_linear.hpp"

namespace kvo::model {

namespace bf16_gemm {

// host_gemm_bf16.cpp builds the kernel under the same condition.
bool available() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512bf16");
  }();
  return yes;
#else
  return false;
#endif
}

}  // namespace bf16_gemm

bool uses_bf16_gemm(DType weights, bool f32_gemm) {
  return weights == DType::kBF16 && !f32_gemm && bf16_gemm::available();
}

void HostCarver::check() const {
  if (base_ != nullptr && offset_ > limit_) {
    throw Error(ErrorCode::kInternal, "the host workspace needs " + std::to_string(offset_) +
                                          " bytes, the region holds " + std::to_string(limit_));
  }
}

HostLinearScratch HostLinearScratch::carve(HostCarver& carver, int threads, DType type, int max_in,
                                           bool f32_gemm, bool blocks, bool q8_activations,
                                           int max_rows) {
  HostLinearScratch s;
  const auto in = static_cast<std::size_t>(max_in);
  // f32 weights are read in place, one row at a time is converted otherwise; a GEMM tile's
  // kGemmColBlock rows are converted or dequantized (f16, bf16 without the bf16 kernel, blocks),
  // or repacked for the q8 GEMM (fewer bytes than the f32 panel); the bf16 kernel packs its own
  // panel, 136 KiB at any width.
  std::size_t floats = (type == DType::kF32 && !blocks ? 1 : HostLinear::kGemmColBlock) * in;
  if (uses_bf16_gemm(type, f32_gemm)) {
    floats = std::max(bf16_gemm::scratch_bytes(max_in) / sizeof(float), in);
    if (blocks) floats = std::max<std::size_t>(floats, HostLinear::kGemmColBlock * in);
  }
  for (int t = 0; t < threads; ++t) s.panels.push_back(carver.take<float>(floats));
  if (q8_activations && blocks) {
    s.q8_rows =
        carver.take<std::uint8_t>(HostLinear::kGemmMinRows * kernels::q8_activation_bytes(max_in));
    if (max_rows >= HostLinear::kGemmMinRows) {
      // Q6_K's rows are the widest (sub-blocks of 16).
      s.q8_gemm_max_rows = max_rows;
      s.q8_gemm_rows =
          carver.take<std::uint8_t>(static_cast<std::size_t>(max_rows) *
                                    q8_gemm::activation_row_bytes(blocks::kQ6_K, max_in));
    }
  }
  return s;
}

HostAttentionScratch HostAttentionScratch::carve(HostCarver& carver, const ModelConfig& config,
                                                 DType kv_type, int max_decode_rows, int threads) {
  HostAttentionScratch s;
  const auto d = static_cast<std::size_t>(config.head_dim);
  const std::size_t rows =
      static_cast<std::size_t>(HostAttention::kQueryBlock) * (config.heads / config.kv_heads);
  const auto key_block = static_cast<std::size_t>(HostAttention::kPrefillKeyBlock);
  for (int t = 0; t < threads; ++t) {
    Prefill p;
    p.q = carver.take<float>(rows * d);
    p.scores = carver.take<float>(rows * key_block);
    p.out = carver.take<float>(rows * d);
    p.k = carver.take<float>(key_block * d);
    p.v = carver.take<float>(key_block * d);
    p.state = carver.take<SoftmaxState>(rows);
    p.first = carver.take<int>(rows);
    p.last = carver.take<int>(rows);
    s.prefill.push_back(p);
  }
  attend::DecodeShape shape;
  shape.heads = config.heads;
  shape.kv_heads = config.kv_heads;
  shape.head_dim = config.head_dim;
  shape.type = kv_type;
  const attend::DecodeAttention::Sizes sizes =
      attend::DecodeAttention::sizes(shape, max_decode_rows);
  for (int t = 0; t < threads; ++t) {
    attend::DecodeScratch::Thread q;
    q.q = carver.take<float>(sizes.q).data();
    q.kv = carver.take<float>(sizes.kv).data();
    q.scores = carver.take<float>(sizes.scores).data();
    if (sizes.dequant > 0) {
      q.k = carver.take<float>(sizes.dequant).data();
      q.v = carver.take<float>(sizes.dequant).data();
    }
    s.decode.threads.push_back(q);
  }
  s.decode.part_state = carver.take<SoftmaxState>(sizes.part_states).data();
  s.decode.part_values = carver.take<float>(sizes.part_values).data();
  s.decode.first_task = carver.take<int>(sizes.first_task).data();
  return s;
}

int widest_input(const ModelConfig& c) {
  return std::max({c.hidden_size, c.intermediate_size, static_cast<int>(c.q_dim())});
}

HostWorkspaceLayout::HostWorkspaceLayout(const OpsShape& shape, std::byte* base,
                                         std::uint64_t limit) {
  const ModelConfig& c = shape.config;
  const int threads = std::max(1, shape.threads);
  HostCarver carver(base, limit);
  linear =
      HostLinearScratch::carve(carver, threads, shape.weight_dtype, widest_input(c), shape.f32_gemm,
                               shape.weight_blocks, shape.q8_activations, shape.max_rows);
  attention =
      HostAttentionScratch::carve(carver, c, shape.kv_dtype, shape.max_decode_rows, threads);
  // As wide as a norm over a whole projection (OLMo 2's q and k norms).
  norm_weight = carver.take<float>(static_cast<std::size_t>(
      std::max({static_cast<std::int64_t>(c.hidden_size), c.q_dim(), c.kv_dim()})));
  for (int t = 0; t < threads; ++t) {
    rope_angles.push_back(carver.take<float>(static_cast<std::size_t>(c.head_dim)));
  }
  sample = carver.take<float>(2 * static_cast<std::size_t>(c.vocab_size));
  bytes = (carver.bytes() + 255) / 256 * 256;  // the cache places its regions 256 bytes apart
}

}  // namespace kvo::model
