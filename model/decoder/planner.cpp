// The public memory planner (include/kvoffload/planner.hpp) over the decoder's own memory plan.
#include "kvoffload/planner.hpp"

#include <algorithm>
#include <filesystem>

#include "kvoffload/error.hpp"
#include "kvoffload/plan.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/gguf_config.hpp"
#include "model/checkpoint/gguf_weights.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/checkpoint/weight_formats.hpp"
#include "model/decoder/memory_plan.hpp"

namespace kvo {
namespace {

model::DecoderMemory decoder_memory(const MemoryQuery& q, const model::ModelConfig& config) {
  if (q.backend == BackendKind::kAuto) {
    throw Error(ErrorCode::kInvalidArgument, "the planner needs a backend: cuda or host");
  }
  model::DecoderOptions options = model::decoder_options(q);
  // What the decoder refuses, the planner does not plan.
  const bool gguf = model::has_gguf_magic(q.model);
  if (gguf) model::check_weight_format_source(q.weights, q.model);
  if (q.expand_weights && !gguf) {
    throw Error(ErrorCode::kInvalidArgument,
                "expanding the weights (--expand-weights) plans a GGUF file's matrices "
                "expanded at load, and " +
                    q.model + " is not a GGUF file");
  }
  bool blocks = !q.weights.empty();  // quantized at load
  if (q.weights.empty() && gguf && options.keep_blocks) {
    // As the decoder lays them out unless asked to expand them: both paths keep a GGUF file's
    // quantized matrices in their blocks (the CUDA path with a tile of their rows dequantized for
    // prefill GEMMs, in its workspace); the host keeps its F16 and BF16 matrices in their type too
    // where the model is f32.
    const model::GgufFile file(q.model);
    const model::WeightLayout plain(config, q.override_dtype ? q.dtype : config.dtype);
    const model::WeightLayout kept(
        config, plain.dtype(),
        model::gguf_kept_matrices(plain, file, q.backend == BackendKind::kHost));
    options.weights_bytes = kept.bytes();
    options.weights_in_blocks = kept.has_other_types();
    blocks = kept.has_blocks();
  }
  model::check_q8_activations(q.q8_activations, q.backend, blocks);
  return model::plan_decoder_memory(config, options, q.backend);
}

// One rank's model under tensor parallelism (MemoryQuery::tp).
model::ModelConfig rank_config(model::ModelConfig c, int tp, const std::string& model) {
  check_tensor_parallel(c.heads, c.kv_heads, c.intermediate_size, tp);
  if (tp == 1) return c;
  if (model::has_gguf_magic(model)) {
    throw Error(ErrorCode::kInvalidArgument,
                "a tensor-parallel plan shards a preset or a config.json; a GGUF file's blocks "
                "are counted whole");
  }
  c.heads /= tp;
  c.kv_heads = c.kv_heads >= tp ? c.kv_heads / tp : 1;
  c.intermediate_size /= tp;
  c.vocab_size = (c.vocab_size + tp - 1) / tp;
  return c;
}

MemoryPlan base_plan(Strategy strategy, const model::DecoderMemory& m, int layers, int tp) {
  MemoryPlan p;
  p.strategy = strategy;
  p.weights_bytes = m.weights;
  p.activation_bytes = m.activations;
  p.workspace_bytes = m.workspace;
  p.layers = layers;
  p.tp = tp;
  p.host_available_bytes = host_available_bytes() / static_cast<std::uint64_t>(tp);
  return p;
}

// On the host backend the "device" bytes are host memory as well, so both count against it.
void finish(MemoryPlan& p, std::uint64_t budget, BackendKind backend) {
  p.total_bytes = p.weights_bytes + p.kv_device_bytes + p.activation_bytes + p.workspace_bytes;
  p.fits = budget == 0 || p.total_bytes <= budget;
  const std::uint64_t host_need =
      backend == BackendKind::kHost ? p.total_bytes + p.host_bytes : p.host_bytes;
  p.host_fits = host_need <= p.host_available_bytes;
}

MemoryPlan kvoffload_plan(const model::DecoderMemory& m, int layers, std::uint64_t budget, int tp) {
  MemoryPlan p = base_plan(Strategy::kKvoffload, m, layers, tp);
  model::require_weights_fit(m, budget);
  const CachePlan cache = plan_cache(m.cache, budget);
  p.kv_device_bytes = cache.resident_bytes + cache.staging_bytes + cache.window_bytes;
  p.kv_window_bytes = cache.window_bytes;
  p.window_layers = cache.window_layers;
  p.host_bytes = cache.host_bytes;
  p.resident_layers = cache.resident_layers;
  p.prefill_piece = m.max_prompt;
  // Pieces 1 .. k-1 start after piece, 2 piece, ... rows: piece k(k-1)/2 rows re-read in all.
  const std::uint64_t k = (static_cast<std::uint64_t>(m.cache.max_seq) + m.max_prompt - 1) /
                          static_cast<std::uint64_t>(m.max_prompt);
  p.piece_reread_bytes = static_cast<std::uint64_t>(m.max_prompt) * k * (k - 1) / 2 *
                         cache.row_bytes * 2 * static_cast<std::uint64_t>(cache.streamed_layers);
  finish(p, budget, m.cache.backend);
  if (p.total_bytes != cache.device_bytes) {
    throw Error(ErrorCode::kInternal, "the memory plan does not add up to the cache's plan");
  }
  return p;
}

// K and V of one layer as a plain [batch][kv_heads][max_seq][head_dim] tensor pair (no padding;
// quantized rows with their scales).
std::uint64_t plain_layer_bytes(const model::DecoderMemory& m) {
  const CacheConfig& c = m.cache;
  return 2ull * static_cast<std::uint64_t>(c.slots) * static_cast<std::uint64_t>(c.max_seq) *
         kv_row_bytes(c.dtype, c.kv_heads, c.head_dim);
}

}  // namespace

const char* strategy_name(Strategy strategy) {
  switch (strategy) {
    case Strategy::kAllOnDevice:
      return "all-on-device";
    case Strategy::kHfOffloadedStatic:
      return "hf-offloaded-static";
    case Strategy::kKvoffload:
      return "kvoffload";
  }
  return "?";
}

void check_tensor_parallel(int heads, int kv_heads, int intermediate, int tp) {
  const auto refuse = [tp](const std::string& what) {
    throw Error(ErrorCode::kInvalidArgument,
                "tensor parallelism over " + std::to_string(tp) + " ranks: " + what);
  };
  if (tp < 1 || tp > 4096) refuse("needs 1 to 4096 ranks");
  if (heads % tp != 0) refuse(std::to_string(heads) + " query heads do not divide among them");
  if (kv_heads % tp != 0 && tp % kv_heads != 0) {
    refuse(std::to_string(kv_heads) + " KV heads neither divide among them nor divide " +
           std::to_string(tp) + " (to be replicated)");
  }
  if (intermediate % tp != 0) {
    refuse("an MLP of " + std::to_string(intermediate) + " columns does not divide among them");
  }
}

MemoryPlan plan_memory(const MemoryQuery& query) {
  const model::ModelConfig config =
      rank_config(model::resolve_model(query.model), query.tp, query.model);
  return kvoffload_plan(decoder_memory(query, config), config.layers, query.budget, query.tp);
}

std::vector<MemoryPlan> compare_strategies(const MemoryQuery& query) {
  const model::ModelConfig config =
      rank_config(model::resolve_model(query.model), query.tp, query.model);
  const model::DecoderMemory m = decoder_memory(query, config);
  const std::uint64_t layer = plain_layer_bytes(m);
  // transformers' static caches keep a sliding-window layer's window alone (min(window,
  // max_seq) rows), on the device: its StaticSlidingWindowLayer, which offloading skips.
  std::uint64_t full_layers = 0;
  std::uint64_t window_bytes = 0;
  int windows = 0;
  for (int l = 0; l < config.layers; ++l) {
    const int w = config.window(l);
    if (w > 0 && w < m.cache.max_seq) {
      window_bytes +=
          layer / static_cast<std::uint64_t>(m.cache.max_seq) * static_cast<std::uint64_t>(w);
      ++windows;
    } else {
      ++full_layers;
    }
  }
  std::vector<MemoryPlan> plans;

  MemoryPlan all = base_plan(Strategy::kAllOnDevice, m, config.layers, query.tp);
  all.kv_device_bytes = full_layers * layer + window_bytes;
  all.kv_window_bytes = window_bytes;
  all.window_layers = windows;
  all.resident_layers = static_cast<int>(full_layers);
  finish(all, query.budget, query.backend);
  plans.push_back(all);

  // transformers' OffloadedStaticCache: the first full layer's K/V stays on the device, two
  // device buffers of one full-length layer each take the prefetched layer and the one being
  // computed, and the other full layers live in pinned host memory.
  MemoryPlan hf = base_plan(Strategy::kHfOffloadedStatic, m, config.layers, query.tp);
  hf.kv_device_bytes = (full_layers > 1 ? 3 : 1) * layer + window_bytes;
  hf.kv_window_bytes = window_bytes;
  hf.window_layers = windows;
  hf.host_bytes = (full_layers - 1) * layer;
  hf.resident_layers = 1;
  finish(hf, query.budget, query.backend);
  plans.push_back(hf);

  try {
    plans.push_back(kvoffload_plan(m, config.layers, query.budget, query.tp));
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kOutOfMemory) throw;
    // Even the smallest plan does not fit: report it, marked as not fitting.
    plans.push_back(kvoffload_plan(
        [&] {
          model::DecoderMemory smallest = m;
          smallest.cache.resident_layers = 0;
          return smallest;
        }(),
        config.layers, 0, query.tp));
    plans.back().fits = false;
  }
  return plans;
}

}  // namespace kvo

namespace kvo::model {

ModelConfig resolve_model(const std::string& name) {
  const auto presets = preset_names();
  if (std::find(presets.begin(), presets.end(), name) != presets.end()) {
    return preset(name);
  }
  const std::filesystem::path path(name);
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return load_model_config((path / "config.json").string());
  }
  if (has_gguf_magic(name)) return gguf_model_config(GgufFile(name));
  if (std::filesystem::is_regular_file(path, ec)) return load_model_config(name);
  std::string known;
  for (const auto& p : presets) known += (known.empty() ? "" : ", ") + p;
  throw Error(ErrorCode::kInvalidArgument, "unknown model '" + name + "': neither a preset (" +
                                               known +
                                               ") nor a config.json, a directory holding one "
                                               "or a GGUF file");
}

DecoderOptions decoder_options(const MemoryQuery& q) {
  DecoderOptions options;
  options.max_seq = q.max_seq;
  options.slots = q.slots;
  options.chunk = q.chunk;
  options.max_prompt = q.max_prompt;
  options.fit_prompt = q.max_prompt == 0;
  options.resident_layers = q.resident_layers;
  options.ring_depth = q.ring_depth;
  options.device_budget = q.budget;
  options.override_dtype = q.override_dtype;
  options.dtype = q.dtype;
  options.override_kv_dtype = q.override_kv_dtype;
  options.weight_format = q.weights;
  options.keep_blocks = !q.expand_weights;
  options.kv_dtype = q.kv_dtype;
  options.backend = q.backend;
  options.threads = q.threads;
  options.f32_gemm = q.f32_gemm;
  options.q8_activations = q.q8_activations;
  options.split.mode = q.split;
  return options;
}

}  // namespace kvo::model
