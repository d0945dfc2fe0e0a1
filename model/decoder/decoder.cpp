#include "model/decoder/decoder.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "kvoffload/error.hpp"
#include "model/checkpoint/ggml_blocks.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/gguf_weights.hpp"
#include "model/checkpoint/safetensors.hpp"
#include "model/checkpoint/weight_formats.hpp"
#include "model/cuda/attention_kernels.hpp"
#include "model/cuda/cuda_ops.hpp"
#include "model/decoder/memory_plan.hpp"
#include "model/host/host_attention.hpp"
#include "model/host/host_gemm_q8.hpp"
#include "model/host/host_kernels.hpp"
#include "model/host/host_linear.hpp"
#include "model/host/host_ops.hpp"
#include "model/host/thread_pool.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

}  // namespace

Decoder::Decoder(const ModelConfig& config, const WeightSource& source,
                 const DecoderOptions& options, const ProgressFn& weights_progress)
    : config_((validate(config), config)),  // checked before layout_ sizes anything by it
      family_(family_of_architecture(config_.architecture, "the model")),
      rope_(rope_schedule(config_)),
      options_(options),
      layout_(config, options.override_dtype ? options.dtype : config.dtype) {
  const BackendKind backend = resolve_backend(options_.backend);
  if (!options_.weight_format.empty()) {
    if (options_.weight_format != "q8_0" && options_.weight_format != "int8") {
      throw invalid("weights in " + options_.weight_format +
                    " are planned (kvo-vram --weights), not run: give a GGUF file of that type "
                    "(--model FILE.gguf), or q8_0 or int8 to quantize at load");
    }
    check_weight_format_source(options_.weight_format, source.checkpoint);
    std::map<std::string, std::uint32_t> q8_0;
    for (const WeightEntry& e : layout_.entries()) {
      if (e.kind != WeightKind::kMatrix) continue;
      if (e.shape[1] % 32 != 0) {
        throw invalid(options_.weight_format + " needs rows of whole 32-element blocks; " + e.name +
                      " has rows of " + std::to_string(e.shape[1]));
      }
      q8_0[e.name] = blocks::kQ8_0;
    }
    layout_ = WeightLayout(config_, layout_.dtype(), q8_0);
  }
  if (options_.threads < 0) {
    throw invalid("threads must be 0 (the cores) or more, not " + std::to_string(options_.threads));
  }
  // The checkpoint's tensor table is read (mapped, no data touched) and checked against the
  // config before a byte is allocated: a config that does not match its weights is refused here.
  std::unique_ptr<Checkpoint> checkpoint;
  std::unique_ptr<GgufFile> gguf;
  if (!source.checkpoint.empty() && is_gguf_model(source.checkpoint)) {
    gguf = std::make_unique<GgufFile>(source.checkpoint);
    check_gguf_weights(layout_, *gguf);
    if (options_.keep_blocks) {
      layout_ = WeightLayout(config_, layout_.dtype(),
                             gguf_kept_matrices(layout_, *gguf, backend == BackendKind::kHost));
    }
  } else if (!source.checkpoint.empty()) {
    checkpoint = std::make_unique<Checkpoint>(source.checkpoint);
    check_checkpoint(layout_, *checkpoint);
  }
  if (options_.auto_activations) {
    options_.q8_activations = gguf != nullptr && backend == BackendKind::kHost &&
                              layout_.has_blocks() && kernels::have_avx512_vnni();
    options_.auto_activations = false;
  }
  check_q8_activations(options_.q8_activations, backend, layout_.has_blocks());
  DecoderOptions planned = options_;
  planned.weights_bytes = layout_.bytes();
  planned.weights_in_blocks = layout_.has_other_types();
  planned.weight_format.clear();  // the layout's own bytes, not the recipe's
  if (planned.fit_prompt && planned.device_budget == 0 && backend == BackendKind::kCuda) {
    // The piece fits the budget the cache will take: the device's free memory less headroom.
    planned.device_budget = cuda_default_budget();
  }
  DecoderMemory memory = plan_decoder_memory(config_, planned, backend);
  memory.cache.device_budget = options_.device_budget;  // 0 stays 0: the cache resolves it
  options_.max_prompt = memory.max_prompt;
  const int R = memory.max_rows;
  const int P = memory.prompt_rows;
  act_ = std::make_unique<ActivationLayout>();
  activation_bytes_ = memory.activations;

  // The shape the plan sized the host workspace for, and what the CUDA path needs besides.
  OpsShape shape = host_ops_shape(config_, planned, memory);
  shape.kernels = memory.kernels;

  require_weights_fit(memory, options_.device_budget);
  if (memory.cache.split.mode == SplitMode::kAuto && memory.cache.split.host_bytes_per_s == 0) {
    // The host's rate is its attention kernel's (about half the raw read the cache would probe
    // otherwise), on as many threads as the split's host part runs on.
    ThreadPool pool(shape.threads);
    memory.cache.split.host_bytes_per_s =
        HostAttention::measure_rate(config_, memory.kv_dtype, pool);
  }
  cache_ = std::make_unique<OffloadedStaticCache>(memory.cache);

  kv_row_bytes_ = cache_->stats().plan.row_bytes;
  act_->carve(static_cast<std::byte*>(cache_->reserved("activations")), config_, memory.kv_dtype, R,
              P, options_.slots, memory.logit_rows);
  logit_rows_ = memory.logit_rows;
  const RopeTable& rope = rope_.table();
  cache_->copy_to_device(act_->inv_freq, rope.inv_freq.data(),
                         rope.inv_freq.size() * sizeof(float));
  shape.rope_scale = rope.scale;
  shape.inv_freq = act_->inv_freq;
  if (config_.rope_local_theta > 0) {  // Gemma 3's window layers: the default rope, own base
    const RopeTable local = rope_table(RopeScaling{}, static_cast<float>(config_.rope_local_theta),
                                       config_.head_dim, config_.max_position_embeddings, 1);
    cache_->copy_to_device(act_->inv_freq_local, local.inv_freq.data(),
                           local.inv_freq.size() * sizeof(float));
    shape.inv_freq_local = act_->inv_freq_local;
  }
  shape.embed_scale = embedding_scale(config_, layout_.dtype());

  auto* weights = static_cast<std::byte*>(cache_->reserved("weights"));
  if (cache_->backend() == BackendKind::kCuda) {
    owned_stream_ = CacheStream(*cache_);
    stream_ = owned_stream_.get();
    ops_ = make_cuda_ops(shape, stream_, cache_->reserved("workspace"));
  } else {
    ops_ = std::make_unique<HostOps>(shape, cache_->reserved("workspace"), memory.workspace);
  }
  const UploadFn upload = [&](std::size_t offset, const void* host, std::size_t bytes) {
    cache_->copy_to_device(weights + offset, host, bytes);
  };
  if (gguf) {
    load_gguf_weights(layout_, *gguf, upload, weights_progress);
  } else if (checkpoint) {
    load_checkpoint(layout_, *checkpoint, upload, weights_progress, q8_scales());
  } else {
    const auto total = static_cast<std::int64_t>(layout_.entries().size());
    std::int64_t done = 0;
    std::vector<float> values;
    std::vector<std::uint8_t> quantized;
    const WeightLayout f32(config_, DType::kF32);
    for (const auto& e : layout_.entries()) {
      if (e.type == ElementType::kQ8_0) {  // drawn in f32 on the host, quantized, uploaded
        values.resize(static_cast<std::size_t>(e.elements));
        fill_synthetic(f32, e, source.seed, values.data());
        quantized.resize(layout_.entry_bytes(e));
        quantize_q8_0_matrix(values.data(), e.shape[0], e.shape[1], q8_scales(), quantized.data());
        cache_->copy_to_device(weights + e.offset, quantized.data(), quantized.size());
      } else {
        ops_->fill_synthetic(layout_, e, source.seed, weights + e.offset);
      }
      if (weights_progress) weights_progress(++done, total);
    }
    ops_->synchronize();
  }
  weights_ = layout_.bind(weights);
  shape_ = shape;
  draws_.assign(static_cast<std::size_t>(options_.slots), 0);
  draw_rows_.resize(static_cast<std::size_t>(options_.slots));
  batch_ = DecodeBatch(options_.slots);
}

Decoder::~Decoder() {
  // The ops' kernels and copies on the stream finish before anything they use is freed.
  if (ops_) {
    try {
      ops_->synchronize();
    } catch (...) {
    }
  }
}

std::string Decoder::attention_kernels() const {
  if (cache_->backend() != BackendKind::kCuda) return "host";
  return shape_.kernels.describe(config_, shape_.kv_dtype);
}

std::string Decoder::weights_text(bool widened) const {
  std::string text = dtype_name(layout_.dtype());
  std::map<std::string, int> types;
  std::map<std::string, int> halves;
  int kept = 0;
  for (const WeightEntry& e : layout_.entries()) {
    if (e.in_blocks()) {
      ++types[traits(e.type).name];
      ++kept;
    } else if (e.kind == WeightKind::kMatrix && e.type != element_type(layout_.dtype())) {
      ++halves[traits(e.type).name];
    }
  }
  if (kept > 0) {
    text += "; " + std::to_string(kept) + " matrices in GGUF blocks (";
    bool first = true;
    for (const auto& [name, count] : types) {
      text += (first ? "" : ", ") + std::to_string(count) + " " + name;
      first = false;
    }
    text += ")";
  }
  if (widened) {
    for (const auto& [name, count] : halves) {
      text += "; " + std::to_string(count) + " matrices in " + name + ", widened as read";
    }
  }
  return text;
}

std::string Decoder::gemm_kernels() const {
  if (cache_->backend() == BackendKind::kCuda) return "cuBLAS";
  std::string text = gemm_library(shape_.weight_dtype, shape_.f32_gemm) + ", " +
                     std::to_string(shape_.threads) + " threads";
  if (shape_.q8_activations) {
    text += std::string("; GGUF blocks: activations quantized to 8 bits, decode rows (") +
            kernels::q8_activation_kernel() + "), prefill GEMMs (" +
            (q8_gemm::available() ? "AVX512-VNNI" : "f32 panels: no AVX512-VNNI here") + ")";
  }
  return text;
}

void Decoder::check_tokens(const std::vector<std::int32_t>& tokens) const {
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= config_.vocab_size) {
      throw invalid("token id " + std::to_string(tokens[i]) + " at position " + std::to_string(i) +
                    " is outside the vocabulary (vocab_size " + std::to_string(config_.vocab_size) +
                    ")");
    }
  }
}

LayerContext Decoder::layer_context(int layer) {
  return {*ops_, config_,         weights_.layers[static_cast<std::size_t>(layer)],
          *act_, layout_.dtype(), config_.local_rope(layer)};
}

void Decoder::prefill_attention(int layer, const LayerView& view, float* x, int n, int slot,
                                int first_position) {
  if (view.split_rows != nullptr && view.split_rows[slot] > 0) {
    throw Error(ErrorCode::kInternal, "a prefill step's view splits slot " + std::to_string(slot));
  }
  const LayerContext l = layer_context(layer);
  ActivationLayout& a = *act_;
  family_.attention_inputs(l, x, n, nullptr, first_position);
  ops_->to_cache_rows(a.k, n, a.k_rows);
  ops_->to_cache_rows(a.v, n, a.v_rows);
  cache_->append(layer, slot, a.k_rows, a.v_rows, n, stream_);
  // A window layer's rows start at its first position (read after the append, which may move
  // them): the attention takes positions in its rows.
  const int first_row = view.first_positions != nullptr ? view.first_positions[slot] : 0;
  ops_->attention_prefill(a.q, n, slot, first_position - first_row, config_.window(layer), view,
                          a.attn);
  family_.attention_output(l, x, n);
}

void Decoder::decode_attention(int layer, const LayerView& view) {
  const LayerContext l = layer_context(layer);
  ActivationLayout& a = *act_;
  const int n = batch_.size();
  const int slots = options_.slots;
  DecodeRows rows;
  rows.slots = a.rows + slots;
  rows.positions = a.rows + 2 * slots;
  rows.host_slots = batch_.slots();
  rows.host_positions = batch_.positions();
  family_.attention_inputs(l, a.residual, n, rows.positions, 0);
  ops_->to_cache_rows(a.k, n, a.k_rows);
  ops_->to_cache_rows(a.v, n, a.v_rows);
  // Each row goes to its own slot: one append per row.
  const std::size_t row_bytes = kv_row_bytes_;
  for (int i = 0; i < n; ++i) {
    cache_->append(layer, batch_.slots()[i], static_cast<std::byte*>(a.k_rows) + i * row_bytes,
                   static_cast<std::byte*>(a.v_rows) + i * row_bytes, 1, stream_);
  }
  if (view.first_positions != nullptr) {  // a window layer: positions in its rows
    std::vector<std::int32_t>& rel = window_positions_;
    rel.resize(static_cast<std::size_t>(n));
    for (int i = 0; i < n; ++i) {
      rel[static_cast<std::size_t>(i)] =
          batch_.positions()[i] - view.first_positions[batch_.slots()[i]];
    }
    // A blocking copy: made only when the rows differ from those an earlier window layer copied
    // (once a step, however many window layers). The copied layer's region is rewritten only by
    // a later copy, never while a kernel that reads it can still run: this step's layers read
    // it after the copy returned, and the previous step's were waited for when this one began
    // (decode_layers).
    if (rel != window_copied_ || window_copied_layer_ < 0) {
      std::int32_t* device = a.window_positions + static_cast<std::int64_t>(layer) * slots;
      cache_->copy_to_device(device, rel.data(), rel.size() * sizeof(std::int32_t));
      window_copied_ = rel;
      window_copied_layer_ = layer;
      ++window_copies_;
    }
    rows.positions = a.window_positions + static_cast<std::int64_t>(window_copied_layer_) * slots;
    rows.host_positions = rel.data();
  }
  if (view.split_rows != nullptr) {
    ops_->attention_decode_split(a.q, n, rows, config_.window(layer), view, a.attn);
  } else {
    ops_->attention_decode(a.q, n, rows, config_.window(layer), view, a.attn);
  }
  family_.attention_output(l, a.residual, n);
}

void Decoder::head(const float* rows, int n) {
  ops_->rms_norm(rows, n, config_.hidden_size, weights_.final_norm, act_->xnorm);
  ops_->linear(act_->xnorm, n, config_.hidden_size, weights_.lm_head, nullptr, config_.vocab_size,
               act_->logits, false);
  if (family_.logits != nullptr) {
    family_.logits(*ops_, config_, act_->logits, static_cast<std::int64_t>(n) * config_.vocab_size);
  }
}

void Decoder::logits_of(const float* rows, int n, float* host_logits) {
  head(rows, n);
  ops_->synchronize();
  cache_->copy_to_host(host_logits, act_->logits,
                       sizeof(float) * static_cast<std::size_t>(n) * config_.vocab_size);
}

void Decoder::reset(int slot) {
  cache_->reset_slot(slot);
  draws_.at(static_cast<std::size_t>(slot)) = 0;
}

void Decoder::set_sampling(const SamplingParams& params, std::uint64_t seed) {
  check_sampling(params);
  sampling_ = params;
  sampling_seed_ = seed;
}

void Decoder::sample_of(const float* rows, int n, const std::int32_t* row_slots,
                        std::int32_t* tokens) {
  head(rows, n);
  for (int i = 0; i < n; ++i) {
    draw_rows_[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(draws_[static_cast<std::size_t>(row_slots[i])]++);
  }
  SampleRows sample_rows;
  sample_rows.slots = row_slots;
  sample_rows.draws = draw_rows_.data();
  ops_->sample(act_->logits, n, sample_rows, sampling_, sampling_seed_, tokens);
}

void Decoder::prefill(int slot, const std::vector<std::int32_t>& tokens, float* logits,
                      const ProgressFn& progress) {
  const int last = prefill_layers(slot, tokens, progress);
  logits_of(act_->residual + static_cast<std::int64_t>(last - 1) * config_.hidden_size, 1, logits);
}

void Decoder::prefill_scored(int slot, const std::vector<std::int32_t>& tokens,
                             const RowLogitsFn& row, const ProgressFn& progress) {
  const int n = static_cast<int>(tokens.size());
  if (n > options_.max_prompt) {
    throw invalid("scoring needs the prompt in one piece: it has " + std::to_string(n) +
                  " tokens, more than the " + std::to_string(options_.max_prompt) +
                  " the decoder was planned for");
  }
  prefill_layers(slot, tokens, progress);
  const int vocab = config_.vocab_size;
  std::vector<float> logits(static_cast<std::size_t>(std::min(n, logit_rows_)) * vocab);
  for (int r0 = 0; r0 < n; r0 += logit_rows_) {
    const int m = std::min(logit_rows_, n - r0);
    logits_of(act_->residual + static_cast<std::int64_t>(r0) * config_.hidden_size, m,
              logits.data());
    for (int i = 0; i < m; ++i) row(r0 + i, logits.data() + static_cast<std::int64_t>(i) * vocab);
  }
}

std::int32_t Decoder::prefill_sample(int slot, const std::vector<std::int32_t>& tokens,
                                     const ProgressFn& progress) {
  const int last = prefill_layers(slot, tokens, progress);
  std::int32_t token = 0;
  sample_of(act_->residual + static_cast<std::int64_t>(last - 1) * config_.hidden_size, 1, &slot,
            &token);
  return token;
}

int Decoder::prefill_layers(int slot, const std::vector<std::int32_t>& tokens,
                            const ProgressFn& progress) {
  if (slot < 0 || slot >= options_.slots) {
    throw invalid("slot " + std::to_string(slot) + " is out of range (" +
                  std::to_string(options_.slots) + " slots)");
  }
  const int n = static_cast<int>(tokens.size());
  if (n == 0) throw invalid("prefill needs at least one token");
  const int start = cache_->length(slot);
  if (static_cast<std::int64_t>(start) + n > options_.max_seq) {
    throw invalid("the prompt has " + std::to_string(n) + " tokens" +
                  (start > 0 ? " after " + std::to_string(start) + " already held" : "") +
                  ", more than max_seq (" + std::to_string(options_.max_seq) + ")");
  }
  check_tokens(tokens);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) throw invalid("token id " + std::to_string(tokens[i]) + " is negative");
  }
  // Pieces of max_prompt tokens, the last one shorter; each a layer-major step of its own.
  const int piece = options_.max_prompt;
  const int chunk = options_.chunk;
  std::int64_t total = 0;
  for (int p0 = 0; p0 < n; p0 += piece) {
    total +=
        (std::min(piece, n - p0) + chunk - 1) / chunk * static_cast<std::int64_t>(config_.layers);
  }
  // One rope table for the whole prompt, whatever its pieces: the tables of dynamic and longrope
  // follow the length of a forward, and the prompt is one forward however the budget splits it.
  ops_->synchronize();  // the previous step's kernels may still read the table
  follow_rope(static_cast<std::int64_t>(start) + n);
  std::int64_t done = 0;
  int last = 0;
  for (int p0 = 0; p0 < n; p0 += piece) {
    last = std::min(piece, n - p0);
    prefill_piece(slot, tokens.data() + p0, last, start + p0, progress, &done, total);
  }
  return last;
}

void Decoder::prefill_piece(int slot, const std::int32_t* tokens, int n, int start,
                            const ProgressFn& progress, std::int64_t* done, std::int64_t total) {
  ActivationLayout& a = *act_;
  ops_->synchronize();  // the previous step's kernels may still read a.tokens
  cache_->copy_to_device(a.tokens, tokens, static_cast<std::size_t>(n) * sizeof(std::int32_t));
  ops_->embed(a.tokens, n, weights_.embed, a.residual);

  std::vector<std::int32_t> counts(static_cast<std::size_t>(options_.slots), 0);
  counts[static_cast<std::size_t>(slot)] = n;
  // A prefill never splits, a piece of one row neither: the cache cannot tell it from a decode
  // row, so the split rows are given (none).
  cache_->begin_step(counts, std::vector<std::int32_t>(counts.size(), 0));
  const int chunk = options_.chunk;
  for (int layer = 0; layer < config_.layers; ++layer) {
    const LayerView view = cache_->acquire(layer, stream_);
    for (int c0 = 0; c0 < n; c0 += chunk) {
      const int m = std::min(chunk, n - c0);
      float* x = a.residual + static_cast<std::int64_t>(c0) * config_.hidden_size;
      prefill_attention(layer, view, x, m, slot, start + c0);
      family_.mlp(layer_context(layer), x, m);
      // On CUDA the chunk is only enqueued here; the bar then runs ahead of the device by at
      // most the queue, and the layer's release orders it again.
      if (progress) progress(++*done, total);
    }
    cache_->release(layer, stream_);
  }
  cache_->end_step();
}

void Decoder::follow_rope(std::int64_t seq_len) {
  if (!rope_.update(seq_len)) return;
  const RopeTable& rope = rope_.table();
  cache_->copy_to_device(act_->inv_freq, rope.inv_freq.data(),
                         rope.inv_freq.size() * sizeof(float));
}

void Decoder::decode(const std::vector<std::int32_t>& tokens, float* logits) {
  const int n = decode_layers(tokens);
  if (n == 0) return;
  // Logits of the n rows, then spread to their slots' places.
  std::vector<float>& staging = decode_logits_;
  staging.resize(static_cast<std::size_t>(n) * config_.vocab_size);
  logits_of(act_->residual, n, staging.data());
  for (int i = 0; i < n; ++i) {
    const int s = batch_.slots()[i];
    std::memcpy(logits + static_cast<std::int64_t>(s) * config_.vocab_size,
                staging.data() + static_cast<std::int64_t>(i) * config_.vocab_size,
                sizeof(float) * static_cast<std::size_t>(config_.vocab_size));
  }
}

void Decoder::decode_sample(const std::vector<std::int32_t>& tokens, std::int32_t* next) {
  const int n = decode_layers(tokens);
  if (n == 0) return;
  std::vector<std::int32_t> drawn(static_cast<std::size_t>(n));
  sample_of(act_->residual, n, batch_.slots(), drawn.data());
  for (int i = 0; i < n; ++i) next[batch_.slots()[i]] = drawn[i];
}

int Decoder::decode_layers(const std::vector<std::int32_t>& tokens) {
  const int slots = options_.slots;
  if (static_cast<int>(tokens.size()) != slots) {
    throw invalid("decode needs one token per slot (" + std::to_string(slots) + "), got " +
                  std::to_string(tokens.size()));
  }
  check_tokens(tokens);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(slots), 0);
  // The previous step's kernels may still read the device copy of the batch.
  ops_->synchronize();
  batch_.clear();
  for (int s = 0; s < slots; ++s) {
    if (tokens[static_cast<std::size_t>(s)] < 0) continue;
    if (cache_->length(s) + 1 > options_.max_seq) {
      throw invalid("slot " + std::to_string(s) + " is full (max_seq " +
                    std::to_string(options_.max_seq) + ")");
    }
    batch_.add(tokens[static_cast<std::size_t>(s)], s, cache_->length(s));
    counts[static_cast<std::size_t>(s)] = 1;
  }
  const int n = batch_.size();
  if (n == 0) return 0;
  std::int64_t seq_len = 0;
  for (int s = 0; s < slots; ++s) {
    if (tokens[static_cast<std::size_t>(s)] >= 0) {
      seq_len = std::max<std::int64_t>(seq_len, cache_->length(s) + 1);
    }
  }
  follow_rope(seq_len);
  ActivationLayout& a = *act_;
  cache_->copy_to_device(a.rows, batch_.data(), batch_.bytes());
  ops_->embed(a.rows, n, weights_.embed, a.residual);
  cache_->begin_step(counts);
  for (int layer = 0; layer < config_.layers; ++layer) {
    const LayerView view = cache_->acquire(layer, stream_);
    decode_attention(layer, view);
    family_.mlp(layer_context(layer), a.residual, n);
    cache_->release(layer, stream_);
  }
  cache_->end_step();
  return n;
}

}  // namespace kvo::model
