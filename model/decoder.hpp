// kvo::model::Decoder: a Llama-family decoder (Llama 2/3/3.1, Mistral, Qwen2) that keeps its
// K/V in an OffloadedStaticCache and drives it through the public per-step protocol, exactly
// as an outside engine would.
//
// Prefill is layer-major: the whole prompt of a slot goes through layer l (attention and MLP in
// chunks of `chunk` tokens) before layer l+1, so each layer's K/V crosses PCIe once. Decode is
// token-major: one token for each active slot through every layer per step.
//
// Every device byte is in the cache's one plan: the weights, the activations (sized for the
// largest chunk and the whole prompt's residual stream) and library workspaces are reserved
// regions of it. Nothing is allocated on the device after construction.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/cache.hpp"
#include "model/model_config.hpp"
#include "model/ops.hpp"
#include "model/sampler.hpp"
#include "model/weights.hpp"

namespace kvo::model {

class Ops;
struct ActivationLayout;

// Where the weights come from: a checkpoint directory (config.json + safetensors), or, when
// `checkpoint_dir` is empty, values drawn from `seed` on the device itself.
struct WeightSource {
  std::string checkpoint_dir;
  std::uint64_t seed = 0;
};

struct DecoderOptions {
  int max_seq = 4096;                         // tokens per slot
  int slots = 1;                              // sequences decoded together
  int chunk = 512;                            // prefill tokens per attention/MLP chunk
  int max_prompt = 0;                         // longest prompt prefilled at once; 0: max_seq
  int resident_layers = kAutoResidentLayers;  // or 0..layers
  int ring_depth = 2;
  std::uint64_t device_budget = 0;  // 0: the device's free memory (CUDA), unlimited (host)
  BackendKind backend = BackendKind::kAuto;
  bool override_dtype = false;  // else the checkpoint's (config) dtype
  DType dtype = DType::kBF16;   // weights and K/V
  HostBackendOptions host;
  int threads = 0;  // host path: threads computing a step; 0: the cores this process may use
};

// Called after each layer of a prefill: (layers done, layers).
using ProgressFn = std::function<void(int, int)>;

class Decoder {
 public:
  // Plans and allocates everything, then loads or draws the weights. Throws kvo::Error:
  // kInvalidArgument for bad options or weights, kOutOfMemory when the weights alone exceed the
  // budget (naming both sizes) or the plan does not fit.
  Decoder(const ModelConfig& config, const WeightSource& weights, const DecoderOptions& options);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Appends `tokens` to `slot` in one layer-major step and writes the logits of the last one to
  // `logits` [vocab] (host). REQUIRES: 0 < tokens.size() <= max_prompt; each id in the
  // vocabulary; length(slot) + tokens.size() <= max_seq.
  void prefill(int slot, const std::vector<std::int32_t>& tokens, float* logits,
               const ProgressFn& progress = {});
  // One step: tokens[s] >= 0 is the next token of slot s, -1 leaves the slot out. Writes
  // logits[s][vocab] (host) for each slot that took part.
  void decode(const std::vector<std::int32_t>& tokens, float* logits);

  // The same steps with the next token drawn on the backend (on CUDA only the ids come back,
  // never the logits): draw d of slot s is the token a Sampler(params, seed, s) picks at its
  // draw d, where d counts the slot's draws since construction or reset(s). set_sampling throws
  // kInvalidArgument for bad params; until it is called, sampling is greedy with seed 0.
  void set_sampling(const SamplingParams& params, std::uint64_t seed);
  // Returns the token drawn from the logits of the prompt's last token.
  std::int32_t prefill_sample(int slot, const std::vector<std::int32_t>& tokens,
                              const ProgressFn& progress = {});
  // next[s] = the token drawn for each slot that took part (tokens[s] >= 0); others untouched.
  void decode_sample(const std::vector<std::int32_t>& tokens, std::int32_t* next);

  void reset(int slot);
  int length(int slot) const { return cache_->length(slot); }

  const ModelConfig& config() const { return config_; }
  const DecoderOptions& options() const { return options_; }
  OffloadedStaticCache& cache() { return *cache_; }
  BackendKind backend() const { return cache_->backend(); }
  std::uint64_t weight_bytes() const { return layout_.bytes(); }
  std::uint64_t activation_bytes() const { return activation_bytes_; }

 private:
  void check_tokens(const std::vector<std::int32_t>& tokens) const;
  void attention_block(int layer, const LayerView& view, float* x, int n, int slot,
                       int first_position, bool decode);
  void mlp_block(int layer, float* x, int n);
  // The steps without their head: the residual stream of the last layer in act_->residual.
  void prefill_layers(int slot, const std::vector<std::int32_t>& tokens,
                      const ProgressFn& progress);
  int decode_layers(const std::vector<std::int32_t>& tokens);  // returns the rows decoded
  void logits_of(const float* rows, int n, float* host_logits);
  // host tokens [n] drawn from the logits of `rows` [n][hidden], row i for slot row_slots[i].
  void sample_of(const float* rows, int n, const std::int32_t* row_slots, std::int32_t* tokens);

  ModelConfig config_;
  DecoderOptions options_;
  WeightLayout layout_;
  std::unique_ptr<OffloadedStaticCache> cache_;
  std::unique_ptr<ActivationLayout> act_;
  std::unique_ptr<Ops> ops_;
  ModelWeights weights_;
  OpsShape shape_;
  void* workspace_ = nullptr;  // CUDA only
  void* stream_ = nullptr;
  SamplingParams sampling_;
  std::uint64_t sampling_seed_ = 0;
  std::vector<std::uint32_t> draws_;       // [slots]: draws taken by each slot
  std::vector<std::int32_t> sample_rows_;  // [2][slots]: slot, draw of each sampled row
  std::vector<float> sample_scratch_;      // host backend
  std::uint64_t activation_bytes_ = 0;
  std::vector<std::int32_t> host_rows_;  // [3][slots]: tokens, slots, positions of a decode step
  std::vector<float> decode_logits_;     // [slots][vocab], host
};

}  // namespace kvo::model
