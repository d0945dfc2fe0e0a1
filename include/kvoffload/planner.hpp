// The memory planner: for a model (a preset or a Hugging Face config.json), a context length and
// a VRAM budget, the device bytes of every component and the host bytes, for kvoffload and for
// the strategies a user would compare it with. The decoder allocates exactly what this plans.
// plan_memory and compare_strategies live in the kvo_model library (they need model shapes);
// host_available_bytes (kvoffload/plan.hpp, included here) in kvoffload.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kvoffload/api.h"
#include "kvoffload/config.hpp"
#include "kvoffload/error.hpp"
#include "kvoffload/plan.hpp"
#include "kvoffload/types.hpp"

namespace kvo {

struct MemoryQuery {
  // A preset name (tiny, llama3-8b, mistral-7b, qwen2.5-7b), a directory with a config.json,
  // the path of a config.json, or a GGUF file (its quantized matrices counted in their blocks,
  // as both paths keep them, and on the host its f16/bf16 matrices in their type where the model
  // is f32; on CUDA with the tile their prefill GEMMs dequantize into).
  std::string model = "llama3-8b";
  bool override_dtype = false;     // else the model's own dtype
  DType dtype = DType::kBF16;      // weights (f32, f16, bf16), and K/V unless override_kv_dtype
  bool override_kv_dtype = false;  // else the weights' dtype
  DType kv_dtype = DType::kBF16;   // K/V: f32, f16, bf16, fp8 or int8
  // The weights in a quantized GGUF format, as llama.cpp lays them out: "q8_0", "q4_k_m" or
  // "q5_k_m", or "int8" (per output channel, in Q8_0 blocks: q8_0's bytes); "" (default): in
  // `dtype`. The decoder runs q8_0 and int8 (quantized at load); the others are planned only.
  std::string weights;
  // A GGUF file: its matrices planned expanded into the model dtype, as kvo-generate
  // --expand-weights loads them, not kept in their blocks (or on the host in f16/bf16).
  bool expand_weights = false;
  int max_seq = 4096;  // the context, tokens per slot
  int slots = 1;
  int chunk = 512;  // prefill rows per attention/MLP chunk
  // Longest piece of a prompt prefilled at once; 0: planned (the whole context, or with a budget
  // the largest piece whose activations fit beside the weights and the ring).
  int max_prompt = 0;
  int ring_depth = 2;
  int resident_layers = kAutoResidentLayers;
  std::uint64_t budget = 0;  // device bytes; 0: none
  // Which path's workspaces to count: kCuda (cuBLAS and attention partials) or kHost (none).
  BackendKind backend = BackendKind::kCuda;
  // The host path's options its scratch depends on (DecoderOptions'): threads of a step (0: the
  // cores this process may use), bf16 weights multiplied in f32, 8-bit activations for weights in
  // GGUF blocks. And split attention at decode, whose regions the CUDA workspace holds.
  int threads = 0;
  bool f32_gemm = false;
  bool q8_activations = false;
  SplitMode split = SplitMode::kOff;
  // Tensor parallelism over `tp` devices of one node: the plan is one rank's. A rank holds heads
  // / tp query heads, kv_heads / tp KV heads (one when kv_heads < tp divides tp: each head on
  // tp / kv_heads ranks, as transformers replicates them), intermediate / tp MLP columns and
  // vocab / tp rows (rounded up) of the embeddings and the head; norms and the residual stream
  // whole. Its host memory is checked against the node's available bytes shared by tp ranks.
  int tp = 1;
};

enum class Strategy {
  kAllOnDevice,        // a plain static cache: every layer's full K/V on the device (a
                       // sliding-window layer's window alone, as transformers' StaticCache)
  kHfOffloadedStatic,  // transformers' OffloadedStaticCache: layer 0 and two full-length
                       // one-layer buffers on the device, the other layers on the host (its
                       // sliding-window layers' windows on the device, never offloaded)
  kKvoffload,          // resident layers that fit the budget, a ring of staging buffers
};

KVO_API const char* strategy_name(
    Strategy strategy);  // "all-on-device", "hf-offloaded-static", ...

struct MemoryPlan {
  Strategy strategy = Strategy::kKvoffload;
  std::uint64_t weights_bytes = 0;
  std::uint64_t kv_device_bytes = 0;  // K/V on the device: resident layers + buffers + windows
  // Of kv_device_bytes, the window layers' (sliding-window layers keeping their last rows alone:
  // kvoffload's window buffers, transformers' window-long static layers).
  std::uint64_t kv_window_bytes = 0;
  int window_layers = 0;
  std::uint64_t activation_bytes = 0;
  std::uint64_t workspace_bytes = 0;  // library workspaces (cuBLAS, attention partials)
  std::uint64_t total_bytes = 0;      // all of the above
  std::uint64_t host_bytes = 0;       // pinned host K/V
  int resident_layers = 0;            // full layers whose K/V stays on the device
  int layers = 0;
  bool fits = false;                       // total_bytes <= budget (always true without a budget)
  std::uint64_t host_available_bytes = 0;  // this machine's available memory
  bool host_fits = false;  // host_bytes (plus total_bytes on the host backend) fit available
  // kvoffload: the longest piece of a prompt prefilled at once, and the H2D bytes a prompt of
  // the whole context costs beyond one piece's: each later piece attends over the rows of the
  // pieces before it, which cross PCIe again for each streamed layer.
  int prefill_piece = 0;
  std::uint64_t piece_reread_bytes = 0;
  int tp = 1;  // ranks (MemoryQuery::tp): every byte above is one rank's
};

// The model one rank of `tp` holds (MemoryQuery::tp). Throws kvo::Error(kInvalidArgument) naming
// what does not divide: heads, KV heads (neither divisible by tp nor dividing it), intermediate.
KVO_API void check_tensor_parallel(int heads, int kv_heads, int intermediate, int tp);

// kvoffload's plan: as many resident layers as the budget holds. Throws kvo::Error:
// kOutOfMemory naming the missing bytes when not even a ring fits (or the weights alone do
// not), kInvalidArgument for an unknown model, a malformed config or bad sizes.
KVO_API MemoryPlan plan_memory(const MemoryQuery& query);

// The three strategies side by side. Never throws for a budget they do not fit: `fits` says.
KVO_API std::vector<MemoryPlan> compare_strategies(const MemoryQuery& query);

}  // namespace kvo
