#include "model/memory_plan.hpp"

#include <algorithm>
#include <string>

#include "kvoffload/error.hpp"
#include "model/weights.hpp"

namespace kvo::model {
namespace {

std::uint64_t align256(std::uint64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

WorkspaceLayout::WorkspaceLayout(const ModelConfig& c, DType weight_dtype, int max_rows,
                                 int max_decode_rows) {
  const std::uint64_t widest = static_cast<std::uint64_t>(
      std::max({c.hidden_size, c.intermediate_size, static_cast<int>(c.q_dim())}));
  gemm_input = kCublasWorkspaceBytes;
  const std::uint64_t gemm_bytes =
      weight_dtype == DType::kF32
          ? 0
          : align256(static_cast<std::uint64_t>(max_rows) * widest * dtype_size(weight_dtype));
  partials = gemm_input + gemm_bytes;
  const std::uint64_t f = sizeof(float);
  const std::uint64_t rows = static_cast<std::uint64_t>(max_rows);
  const std::uint64_t decode_rows = static_cast<std::uint64_t>(max_decode_rows);
  prefill_scores =
      partials + align256(decode_rows * c.heads * kMaxAttentionSplits * (c.head_dim + 2) * f);
  prefill_stats = prefill_scores + align256(f * c.heads * rows * kPrefillKeyBlock);
  prefill_kv = prefill_stats + align256(f * 2 * c.heads * rows);
  const std::uint64_t kv_bytes =
      weight_dtype == DType::kF32 ? 0 : align256(f * 2 * kPrefillKeyBlock * c.kv_dim());
  sampling = prefill_kv + kv_bytes;
  bytes = sampling + align256(sizeof(std::int32_t) * 3 * decode_rows);
}

std::uint64_t ActivationLayout::carve(std::byte* base, const ModelConfig& c, DType dtype, int R,
                                      int P, int slots) {
  std::uint64_t offset = 0;
  auto take = [&](std::uint64_t bytes) {
    std::byte* p = base == nullptr ? nullptr : base + offset;
    offset += align256(bytes);
    return p;
  };
  const auto f = sizeof(float);
  const std::uint64_t r = static_cast<std::uint64_t>(R);
  residual = reinterpret_cast<float*>(take(f * static_cast<std::uint64_t>(P) * c.hidden_size));
  xnorm = reinterpret_cast<float*>(take(f * r * c.hidden_size));
  q = reinterpret_cast<float*>(take(f * r * c.q_dim()));
  k = reinterpret_cast<float*>(take(f * r * c.kv_dim()));
  v = reinterpret_cast<float*>(take(f * r * c.kv_dim()));
  attn = reinterpret_cast<float*>(take(f * r * c.q_dim()));
  gate = reinterpret_cast<float*>(take(f * r * c.intermediate_size));
  up = reinterpret_cast<float*>(take(f * r * c.intermediate_size));
  k_rows = take(dtype_size(dtype) * r * c.kv_dim());
  v_rows = take(dtype_size(dtype) * r * c.kv_dim());
  logits = reinterpret_cast<float*>(take(f * static_cast<std::uint64_t>(slots) * c.vocab_size));
  tokens = reinterpret_cast<std::int32_t*>(take(4 * static_cast<std::uint64_t>(P)));
  rows = reinterpret_cast<std::int32_t*>(take(4 * 3 * static_cast<std::uint64_t>(slots)));
  inv_freq = reinterpret_cast<float*>(take(f * static_cast<std::uint64_t>(c.head_dim / 2)));
  return offset;
}

void require_weights_fit(const DecoderMemory& memory, std::uint64_t budget) {
  if (budget != 0 && memory.weights > budget) {
    throw Error(ErrorCode::kOutOfMemory, "the weights alone need " + format_bytes(memory.weights) +
                                             " (" + dtype_name(memory.dtype) +
                                             "), more than the device budget of " +
                                             format_bytes(budget));
  }
}

DecoderMemory plan_decoder_memory(const ModelConfig& config, const DecoderOptions& options,
                                  BackendKind backend) {
  if (options.max_seq < 1 || options.slots < 1 || options.chunk < 1) {
    throw Error(ErrorCode::kInvalidArgument, "max_seq, slots and chunk must be positive");
  }
  DecoderMemory m;
  m.dtype = options.override_dtype ? options.dtype : config.dtype;
  m.max_prompt = options.max_prompt <= 0 || options.max_prompt > options.max_seq
                     ? options.max_seq
                     : options.max_prompt;
  m.max_rows = std::max(std::min(options.chunk, m.max_prompt), options.slots);
  m.prompt_rows = std::max(m.max_prompt, options.slots);
  m.weights = WeightLayout(config, m.dtype).bytes();
  m.activations =
      ActivationLayout().carve(nullptr, config, m.dtype, m.max_rows, m.prompt_rows, options.slots);
  m.workspace = backend == BackendKind::kCuda
                    ? WorkspaceLayout(config, m.dtype, m.max_rows, options.slots).bytes
                    : 0;

  CacheConfig& cc = m.cache;
  cc.layers = config.layers;
  cc.kv_heads = config.kv_heads;
  cc.head_dim = config.head_dim;
  cc.max_seq = options.max_seq;
  cc.slots = options.slots;
  cc.dtype = m.dtype;
  cc.resident_layers = options.resident_layers;
  cc.ring_depth = options.ring_depth;
  cc.device_budget = options.device_budget;
  cc.backend = backend;
  cc.host = options.host;
  cc.reserved.push_back({"weights", m.weights});
  cc.reserved.push_back({"activations", m.activations});
  if (m.workspace > 0) cc.reserved.push_back({"workspace", m.workspace});
  return m;
}

}  // namespace kvo::model
