// Qwen3 (Qwen3ForCausalLM): the Llama block with an RMSNorm over each query and key head
// (q_norm, k_norm: [head_dim] weights shared by the heads) between the projections and the
// rotation, and an explicit head_dim (heads * head_dim need not be hidden_size).
#include "model/families/qwen3.hpp"

#include "model/decoder/memory_plan.hpp"
#include "model/families/llama.hpp"

namespace kvo::model {
namespace qwen3 {

std::vector<LayerTensor> with_head_norms(std::vector<LayerTensor> t, const ModelConfig& c) {
  // After the attention's projections, as the checkpoint lists a layer's tensors.
  const auto at = t.begin() + (c.qkv_bias ? 8 : 5);
  t.insert(at,
           {{"self_attn.q_norm.weight", {c.head_dim}, WeightKind::kNorm, &LayerWeights::q_norm},
            {"self_attn.k_norm.weight", {c.head_dim}, WeightKind::kNorm, &LayerWeights::k_norm}});
  return t;
}

std::vector<LayerTensor> layer_tensors(const ModelConfig& c) {
  return with_head_norms(llama::layer_tensors(c), c);
}

void attention_inputs(const LayerContext& l, const float* x, int n, const std::int32_t* positions,
                      int first_position) {
  const ModelConfig& c = l.config;
  ActivationLayout& a = l.a;
  llama::project_qkv(l, x, n);
  l.ops.rms_norm(a.q, n * c.heads, c.head_dim, l.w.q_norm, a.q);
  l.ops.rms_norm(a.k, n * c.kv_heads, c.head_dim, l.w.k_norm, a.k);
  l.ops.rope(a.q, a.k, n, positions, first_position, l.local_rope);
}

}  // namespace qwen3

// Qwen3's config: attention_bias as Llama's (false in every released model); sliding windows
// are not served.
extern const Family kQwen3Family;
const Family kQwen3Family = {
    "qwen3",
    {"Qwen3ForCausalLM"},
    [](ModelConfig&) {},
    [](const JsonField& f, ModelConfig& c) {
      c.qkv_bias = c.o_bias = f.boolean_or("attention_bias", false);
      if (f.boolean_or("use_sliding_window", false)) {
        throw f.at("use_sliding_window").error("true is not supported for Qwen3");
      }
      // Qwen3's class defaults head_dim to 128, not hidden / heads.
      c.head_dim = static_cast<int>(f.integer_or("head_dim", 128, 2, ModelLimits::kHeadDim));
    },
    [](const ModelConfig& c, nlohmann::ordered_json& o) {
      o["attention_bias"] = c.qkv_bias;
      o["use_sliding_window"] = false;
    },
    qwen3::layer_tensors,
    qwen3::attention_inputs,
    llama::attention_output,
    llama::mlp};

}  // namespace kvo::model
