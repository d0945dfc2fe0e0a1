// Phi-3 and Phi-3.5 (Phi3ForCausalLM): the Llama block with q, k and v in one fused projection
// (qkv_proj: [q_dim + 2 kv_dim][hidden], q's rows first, then k's, then v's) and the MLP's gate
// and up in one (gate_up_proj: [2 intermediate][hidden], gate's rows first); a sliding window
// where config.json gives one; longrope (older configs call it su or yarn) for the 128K models.
// A part of a fused tensor is the rows at an offset of it, so each projection reads its rows
// in place.
#include <cstddef>

#include "model/decoder/memory_plan.hpp"
#include "model/families/llama.hpp"

namespace kvo::model {
namespace phi3 {

std::vector<LayerTensor> layer_tensors(const ModelConfig& c) {
  using K = WeightKind;
  using W = LayerWeights;
  const std::int64_t h = c.hidden_size;
  const std::int64_t ff = c.intermediate_size;
  return {{"input_layernorm.weight", {h}, K::kNorm, &W::attn_norm},
          {"self_attn.qkv_proj.weight", {c.q_dim() + 2 * c.kv_dim(), h}, K::kMatrix, &W::wq},
          {"self_attn.o_proj.weight", {h, c.q_dim()}, K::kMatrix, &W::wo},
          {"post_attention_layernorm.weight", {h}, K::kNorm, &W::mlp_norm},
          {"mlp.gate_up_proj.weight", {2 * ff, h}, K::kMatrix, &W::w_gate},
          {"mlp.down_proj.weight", {h, ff}, K::kMatrix, &W::w_down}};
}

// Rows [first, ...) of a fused matrix with `in` columns (whole rows of blocks when it is kept in
// GGUF blocks).
WeightRef rows_of(WeightRef fused, std::int64_t first, int in) {
  return {static_cast<const std::byte*>(fused.data) + matrix_bytes(fused.type, first, in),
          fused.type};
}

void attention_inputs(const LayerContext& l, const float* x, int n, const std::int32_t* positions,
                      int first_position) {
  const ModelConfig& c = l.config;
  const std::int64_t qd = c.q_dim();
  llama::project_qkv(l, x, n, rows_of(l.w.wq, qd, c.hidden_size),
                     rows_of(l.w.wq, qd + c.kv_dim(), c.hidden_size));
  l.ops.rope(l.a.q, l.a.k, n, positions, first_position, l.local_rope);
}

void mlp(const LayerContext& l, float* x, int n) {
  llama::mlp(l, x, n, rows_of(l.w.w_gate, l.config.intermediate_size, l.config.hidden_size));
}

}  // namespace phi3

extern const Family kPhi3Family;
const Family kPhi3Family = {
    "phi3",
    {"Phi3ForCausalLM"},
    [](ModelConfig&) {},
    [](const JsonField& f, ModelConfig& c) {
      c.sliding_window =
          static_cast<int>(f.integer_or("sliding_window", 0, 1, ModelLimits::kPositions));
    },
    [](const ModelConfig& c, nlohmann::ordered_json& o) {
      o["sliding_window"] = c.sliding_window > 0 ? nlohmann::ordered_json(c.sliding_window)
                                                 : nlohmann::ordered_json(nullptr);
      if (c.rope_scaling.type != RopeType::kDefault) {
        o["original_max_position_embeddings"] =
            static_cast<std::int64_t>(c.rope_scaling.original_max_position);
      }
    },
    phi3::layer_tensors,
    phi3::attention_inputs,
    llama::attention_output,
    phi3::mlp,
    {{"su", "longrope"}, {"yarn", "longrope"}},
    4096};

}  // namespace kvo::model
