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
#include "model/checkpoint/model_config.hpp"
#include "model/checkpoint/weights.hpp"
#include "model/common/progress.hpp"
#include "model/common/rope.hpp"
#include "model/decoder/ops.hpp"
#include "model/decoder/sampler.hpp"
#include "model/families/family.hpp"

namespace kvo::model {

class Ops;
struct ActivationLayout;

// Where the weights come from: a checkpoint directory (config.json + safetensors) or a GGUF file
// (model/checkpoint/gguf_weights.hpp, its blocks dequantized at load), or, when `checkpoint` is
// empty, values drawn from `seed` on the device itself.
struct WeightSource {
  std::string checkpoint;
  std::uint64_t seed = 0;
};

struct DecoderOptions {
  int max_seq = 4096;  // tokens per slot
  int slots = 1;       // sequences decoded together
  int chunk = 512;     // prefill tokens per attention/MLP chunk
  int max_prompt = 0;  // longest piece of a prompt prefilled at once; 0: max_seq
  // With a device_budget: max_prompt shrunk, where its activations do not fit beside the weights
  // and the ring, to the largest piece of whole chunks that does (no smaller than chunk). A longer
  // prompt is then prefilled piece by piece, each piece attending over the rows of the pieces
  // before it.
  bool fit_prompt = false;
  int logit_rows = 0;  // prefill_scored: rows of logits computed at once (at least slots)
  // Full layers kept on the device (window layers always are; more than the full layers keeps
  // them all), or kAutoResidentLayers.
  int resident_layers = kAutoResidentLayers;
  int ring_depth = 2;
  // Sliding-window layers kept as windows in the cache (their last rows alone, on the device:
  // CacheConfig::layer_windows); false: full length, like the other layers (to compare).
  bool window_layers = true;
  // Split attention at decode (CacheConfig::split): the streamed layers' rows before a split
  // row are attended on the host in the host store, the rest where the layer was staged, merged
  // exactly (on CUDA: built, not yet run on a GPU).
  SplitOptions split;
  std::uint64_t device_budget = 0;  // 0: the device's free memory (CUDA), unlimited (host)
  BackendKind backend = BackendKind::kAuto;
  // CUDA: attend with the built-in kernels even where FlashInfer serves the shape (to compare).
  bool builtin_attention = false;
  bool override_dtype = false;     // else the checkpoint's (config) dtype
  DType dtype = DType::kBF16;      // weights (and K/V unless override_kv_dtype): f32, f16, bf16
  bool override_kv_dtype = false;  // else the weights' dtype
  DType kv_dtype = DType::kBF16;   // K/V storage: f32, f16, bf16, fp8 or int8 (quantized rows)
  // The weights in a quantized GGUF format (model/checkpoint/weight_formats.hpp), "" for
  // `dtype`: q8_0 quantizes a safetensors checkpoint's (or the drawn) matrices into Q8_0 blocks
  // at load, a scale per 32 weights; int8 into Q8_0 blocks sharing one scale per output channel
  // (a row); q4_k_m and q5_k_m are planned only (kvo-vram), and the decoder refuses them.
  std::string weight_format;
  // A GGUF checkpoint's quantized matrices stay in their blocks (multiplied by dequantizing a row
  // or a tile at a time, on either path); false expands them to `dtype` at load.
  bool keep_blocks = true;
  // The weights' bytes when the checkpoint fixes them (a GGUF file's blocks): the decoder sets it
  // for the plan; 0: the config's tensors in the model dtype.
  std::size_t weights_bytes = 0;
  // Some matrices are not in the model dtype: GGUF blocks, or on the host a GGUF file's f16 and
  // bf16 matrices in an f32 model (the decoder sets it for the plan). The workspace then holds
  // tiles of their rows expanded to f32 for prefill GEMMs (memory_plan.hpp).
  bool weights_in_blocks = false;
  HostBackendOptions host;
  int threads = 0;  // host path: threads computing a step; 0: the cores this process may use
  // Host path: bf16 weights multiply in f32 (sgemm) even where the CPU has AVX512_BF16, whose
  // GEMMs round the activations to bf16 (model/host/host_gemm_bf16.hpp).
  bool f32_gemm = false;
  // Host path, matrices kept in GGUF blocks: a decode step's rows multiply the activations
  // quantized to 8 bits (kernels::linear_row_blocks_q8, integer dot products as llama.cpp's) for
  // Q8_0, Q4_0, Q4_1, Q4_K and Q6_K; not the bits of the expanded weights. Off: f32 activations,
  // the bits of the weights expanded to f32.
  bool q8_activations = false;
  // Decide q8_activations here: on for a GGUF file's blocks on the host backend where the CPU has
  // AVX512-VNNI (llama.cpp multiplies such files so), off otherwise; options() then says which.
  bool auto_activations = false;
};

// The rows of one decode step, one per slot that takes part: row i feeds token tokens()[i] to
// slot slots()[i] at position positions()[i] (its length before the step). One host array,
// tokens | slots | positions, each [capacity], so that the device gets it in one copy.
class DecodeBatch {
 public:
  explicit DecodeBatch(int capacity = 0)
      : capacity_(capacity), rows_(3 * static_cast<std::size_t>(capacity)) {}
  void clear() { size_ = 0; }
  void add(std::int32_t token, int slot, int position) {
    rows_[static_cast<std::size_t>(size_)] = token;
    rows_[static_cast<std::size_t>(capacity_ + size_)] = slot;
    rows_[static_cast<std::size_t>(2 * capacity_ + size_)] = position;
    ++size_;
  }
  int size() const { return size_; }
  const std::int32_t* tokens() const { return rows_.data(); }
  const std::int32_t* slots() const { return rows_.data() + capacity_; }
  const std::int32_t* positions() const { return rows_.data() + 2 * capacity_; }
  // The whole array and its bytes, as it goes to the device.
  const std::int32_t* data() const { return rows_.data(); }
  std::size_t bytes() const { return rows_.size() * sizeof(std::int32_t); }

 private:
  int capacity_ = 0;
  int size_ = 0;
  std::vector<std::int32_t> rows_;
};

class Decoder {
 public:
  // Checks the config, the options and the checkpoint's tensor table, plans, and only then
  // allocates everything and loads or draws the weights; `weights_progress` (if set) hears
  // (tensors done, tensors) as they are. Throws kvo::Error, before allocating anything, with
  // kInvalidArgument for bad options or a checkpoint that does not match the config, and
  // kOutOfMemory when the weights alone exceed the budget (naming both sizes) or the plan does
  // not fit the device or this machine's memory.
  Decoder(const ModelConfig& config, const WeightSource& weights, const DecoderOptions& options,
          const ProgressFn& weights_progress = {});
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // Appends `tokens` to `slot` and writes the logits of the last one to `logits` [vocab] (host):
  // one layer-major step per piece of at most max_prompt tokens (options().max_prompt), each
  // piece attending over every row before it. REQUIRES: 0 < tokens.size(); each id in the
  // vocabulary; length(slot) + tokens.size() <= max_seq. `progress` (if set) hears (chunks done,
  // chunks) after each chunk of each layer: layers x the pieces' ceil(piece / chunk) in all.
  void prefill(int slot, const std::vector<std::int32_t>& tokens, float* logits,
               const ProgressFn& progress = {});
  // prefill(), scoring every token (REQUIRES tokens.size() <= max_prompt: one piece):
  // row(i, logits) hears the logits [vocab] (host, valid during
  // the call) after tokens[i], for i = 0 .. tokens.size() - 1 in order, computed
  // max(slots, options.logit_rows) rows at a time. For perplexity and agreement measures.
  using RowLogitsFn = std::function<void(int row, const float* logits)>;
  void prefill_scored(int slot, const std::vector<std::int32_t>& tokens, const RowLogitsFn& row,
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
  DType weight_dtype() const { return layout_.dtype(); }
  DType kv_dtype() const { return cache_->config().dtype; }
  std::uint64_t activation_bytes() const { return activation_bytes_; }
  // Which kernels attend: "host" on the host backend; on CUDA, FlashInfer's or the built-in
  // ones with the reason (AttentionKernels::describe).
  std::string attention_kernels() const;
  // What runs the GEMMs: on the host, the BLAS, the kernels chosen for this CPU and why, and the
  // threads ("OpenBLAS 0.3.21, SkylakeX kernels (chosen for AVX-512), 2 threads",
  // model/host/blas.hpp); on CUDA, "cuBLAS".
  std::string gemm_kernels() const;
  // How the weights are stored: the model dtype, and the matrices kept in GGUF blocks by type,
  // e.g. "f32; 211 matrices in GGUF blocks (210 Q4_1, 1 Q8_0)"; with `widened`, also those kept
  // in f16 or bf16 in an f32 model ("f32; 155 matrices in f16, widened as read"). Those multiply
  // with the bits of the f32 they widen to, so a saved context's fingerprint leaves them out.
  std::string weights_text(bool widened = true) const;
  // The blocking copies of window layers' row positions to the device so far: one a decode step
  // (all window layers share their rows), not one a window layer.
  std::int64_t window_position_copies() const { return window_copies_; }

 private:
  // How matrices quantized at load take their scales (options_.weight_format).
  Q8Scales q8_scales() const {
    return options_.weight_format == "int8" ? Q8Scales::kPerRow : Q8Scales::kPerBlock;
  }
  void check_tokens(const std::vector<std::int32_t>& tokens) const;
  // What layer `layer` computes with (the family's hooks take it).
  LayerContext layer_context(int layer);
  // The attention half of a layer over the rows x [n][hidden] (updated in place): the family's
  // inputs, k and v appended to the cache, attention, the family's output.
  // Prefill: the rows are one slot's, at first_position + i.
  void prefill_attention(int layer, const LayerView& view, float* x, int n, int slot,
                         int first_position);
  // Decode: the rows of batch_ (on the device at act_->rows), in act_->residual.
  void decode_attention(int layer, const LayerView& view);
  // The steps without their head: the residual stream of the last layer of the last piece in
  // act_->residual; returns that piece's rows.
  int prefill_layers(int slot, const std::vector<std::int32_t>& tokens, const ProgressFn& progress);
  // One piece: tokens [n] after `start` rows; progress counts on from *done of total.
  void prefill_piece(int slot, const std::int32_t* tokens, int n, int start,
                     const ProgressFn& progress, std::int64_t* done, std::int64_t total);
  int decode_layers(const std::vector<std::int32_t>& tokens);  // returns the rows decoded
  // Before a forward whose highest position is seq_len - 1 (the device idle): the rope table it
  // uses, uploaded where it changed.
  void follow_rope(std::int64_t seq_len);
  // The logits [n][vocab] of rows [n][hidden], in act_->logits.
  void head(const float* rows, int n);
  void logits_of(const float* rows, int n, float* host_logits);
  // host tokens [n] drawn from the logits of `rows` [n][hidden], row i for slot row_slots[i].
  void sample_of(const float* rows, int n, const std::int32_t* row_slots, std::int32_t* tokens);

  ModelConfig config_;
  const Family& family_;  // model/families/: the config's architecture
  RopeSchedule rope_;     // the rope table of each forward (dynamic and longrope change it)
  DecoderOptions options_;
  WeightLayout layout_;
  // Destroyed in reverse: the ops (which hold the stream) first, then the stream, then the cache.
  std::unique_ptr<OffloadedStaticCache> cache_;
  CacheStream owned_stream_;  // CUDA only
  void* stream_ = nullptr;    // owned_stream_.get()
  std::unique_ptr<ActivationLayout> act_;
  std::unique_ptr<Ops> ops_;
  ModelWeights weights_;
  OpsShape shape_;
  SamplingParams sampling_;
  std::uint64_t sampling_seed_ = 0;
  std::vector<std::uint32_t> draws_;     // [slots]: draws taken by each slot
  std::vector<std::int32_t> draw_rows_;  // [slots]: the draw number of each sampled row
  std::uint64_t activation_bytes_ = 0;
  std::size_t kv_row_bytes_ = 0;                // one token of K (or V) in the cache
  int logit_rows_ = 1;                          // rows act_->logits holds
  DecodeBatch batch_;                           // the rows of the decode step in progress
  std::vector<float> decode_logits_;            // [slots][vocab], host
  std::vector<std::int32_t> window_positions_;  // a decode step's rows in a window layer, host
  // The rows last copied to the device for a window layer, and that layer: every window layer of
  // a step has the same rows (one window, one move per append), so one copy a step serves them
  // all. -1: none copied.
  std::vector<std::int32_t> window_copied_;
  int window_copied_layer_ = -1;
  std::int64_t window_copies_ = 0;  // copies made (window_position_copies())
};

}  // namespace kvo::model
