#include "model/decoder.hpp"

#include <algorithm>
#include <cstring>

#include "kvoffload/error.hpp"
#include "model/cuda_ops.hpp"
#include "model/host_ops.hpp"
#include "model/safetensors.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

std::uint64_t align256(std::uint64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

// The activations region, carved into buffers. R = rows of the largest chunk or decode batch,
// P = longest prompt (the residual stream of a layer-major prefill holds all of it).
struct Decoder::Activations {
  float* residual = nullptr;       // [P][hidden]
  float* xnorm = nullptr;          // [R][hidden]
  float* q = nullptr;              // [R][heads][head_dim]
  float* k = nullptr;              // [R][kv_heads][head_dim]
  float* v = nullptr;              // [R][kv_heads][head_dim]
  float* attn = nullptr;           // [R][heads][head_dim]
  float* gate = nullptr;           // [R][intermediate]
  float* up = nullptr;             // [R][intermediate]
  void* k_rows = nullptr;          // [R][kv_heads][head_dim], cache dtype
  void* v_rows = nullptr;          // same
  float* logits = nullptr;         // [slots][vocab]
  std::int32_t* tokens = nullptr;  // [P]
  std::int32_t* rows = nullptr;    // [3][slots]: tokens, slots, positions of a decode step
  float* inv_freq = nullptr;       // [head_dim / 2]

  // Lays the buffers out from `base` (nullptr: only counts). Returns the bytes used.
  std::uint64_t carve(std::byte* base, const ModelConfig& c, DType dtype, int R, int P, int slots) {
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
};

Decoder::Decoder(const ModelConfig& config, const WeightSource& source,
                 const DecoderOptions& options)
    : config_(config),
      options_(options),
      layout_(config, options.override_dtype ? options.dtype : config.dtype) {
  validate(config_);
  if (options_.max_seq < 1 || options_.slots < 1 || options_.chunk < 1) {
    throw invalid("max_seq, slots and chunk must be positive");
  }
  if (options_.max_prompt <= 0 || options_.max_prompt > options_.max_seq) {
    options_.max_prompt = options_.max_seq;
  }
  const DType dtype = layout_.dtype();
  const int R = std::max(std::min(options_.chunk, options_.max_prompt), options_.slots);
  const int P = std::max(options_.max_prompt, options_.slots);
  act_ = std::make_unique<Activations>();
  activation_bytes_ = act_->carve(nullptr, config_, dtype, R, P, options_.slots);

  BackendKind backend = options_.backend;
  if (backend == BackendKind::kAuto) {
    backend = cuda_device_count() > 0 ? BackendKind::kCuda : BackendKind::kHost;
  }
  OpsShape shape;
  shape.config = config_;
  shape.weight_dtype = dtype;
  shape.max_rows = R;
  shape.max_decode_rows = options_.slots;
  shape.max_seq = options_.max_seq;
  const std::uint64_t workspace = backend == BackendKind::kCuda ? cuda_workspace_bytes(shape) : 0;

  if (options_.device_budget != 0 && layout_.bytes() > options_.device_budget) {
    throw Error(ErrorCode::kOutOfMemory, "the weights alone need " + format_bytes(layout_.bytes()) +
                                             " (" + dtype_name(dtype) +
                                             "), more than the device budget of " +
                                             format_bytes(options_.device_budget));
  }

  CacheConfig cc;
  cc.layers = config_.layers;
  cc.kv_heads = config_.kv_heads;
  cc.head_dim = config_.head_dim;
  cc.max_seq = options_.max_seq;
  cc.slots = options_.slots;
  cc.dtype = dtype;
  cc.resident_layers = options_.resident_layers;
  cc.ring_depth = options_.ring_depth;
  cc.device_budget = options_.device_budget;
  cc.backend = backend;
  cc.host = options_.host;
  cc.reserved.push_back({"weights", layout_.bytes()});
  cc.reserved.push_back({"activations", activation_bytes_});
  if (workspace > 0) cc.reserved.push_back({"workspace", workspace});
  cache_ = std::make_unique<OffloadedStaticCache>(cc);

  act_->carve(static_cast<std::byte*>(cache_->reserved("activations")), config_, dtype, R, P,
              options_.slots);
  std::vector<float> inv_freq(static_cast<std::size_t>(config_.head_dim / 2));
  for (int i = 0; i < config_.head_dim / 2; ++i) {
    inv_freq[static_cast<std::size_t>(i)] =
        rope_inv_freq(i, config_.head_dim, config_.rope_theta, config_.rope_scaling);
  }
  cache_->copy_to_device(act_->inv_freq, inv_freq.data(), inv_freq.size() * sizeof(float));
  shape.inv_freq = act_->inv_freq;

  auto* weights = static_cast<std::byte*>(cache_->reserved("weights"));
  if (cache_->backend() == BackendKind::kCuda) {
    stream_ = cache_->create_stream();
    ops_ = make_cuda_ops(shape, stream_, cache_->reserved("workspace"));
  } else {
    ops_ = std::make_unique<HostOps>(shape);
  }
  if (!source.checkpoint_dir.empty()) {
    const Checkpoint checkpoint(source.checkpoint_dir);
    load_checkpoint(layout_, checkpoint,
                    [&](std::size_t offset, const void* host, std::size_t bytes) {
                      cache_->copy_to_device(weights + offset, host, bytes);
                    });
  } else {
    for (const auto& e : layout_.entries()) {
      if (cache_->backend() == BackendKind::kCuda) {
        fill_synthetic_on_device(layout_, e, source.seed, weights + e.offset, stream_);
      } else {
        fill_synthetic(layout_, e, source.seed, weights + e.offset);
      }
    }
    if (stream_ != nullptr) cache_->synchronize_stream(stream_);
  }
  weights_ = layout_.bind(weights);
  host_rows_.resize(3 * static_cast<std::size_t>(options_.slots));
}

Decoder::~Decoder() {
  if (cache_ && stream_ != nullptr) {
    try {
      cache_->synchronize_stream(stream_);
    } catch (...) {
    }
    ops_.reset();
    cache_->destroy_stream(stream_);
  }
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

void Decoder::attention_block(int layer, const LayerView& view, float* x, int n, int slot,
                              int first_position, bool decode) {
  const LayerWeights& w = weights_.layers[static_cast<std::size_t>(layer)];
  const ModelConfig& c = config_;
  Activations& a = *act_;
  const int h = c.hidden_size;
  const int qd = static_cast<int>(c.q_dim());
  const int kvd = static_cast<int>(c.kv_dim());
  ops_->rms_norm(x, n, w.attn_norm, a.xnorm);
  ops_->linear(a.xnorm, n, h, w.wq, w.bq, qd, a.q, false);
  ops_->linear(a.xnorm, n, h, w.wk, w.bk, kvd, a.k, false);
  ops_->linear(a.xnorm, n, h, w.wv, w.bv, kvd, a.v, false);
  const std::int64_t kv_count = static_cast<std::int64_t>(n) * kvd;
  const std::size_t row_bytes = static_cast<std::size_t>(kvd) * dtype_size(layout_.dtype());
  if (decode) {
    const int slots = options_.slots;
    DecodeRows rows;
    rows.slots = a.rows + slots;
    rows.positions = a.rows + 2 * slots;
    rows.host_slots = host_rows_.data() + slots;
    rows.host_positions = host_rows_.data() + 2 * slots;
    ops_->rope(a.q, a.k, n, rows.positions, 0);
    ops_->to_cache_rows(a.k, kv_count, a.k_rows);
    ops_->to_cache_rows(a.v, kv_count, a.v_rows);
    for (int i = 0; i < n; ++i) {
      cache_->append(layer, rows.host_slots[i], static_cast<std::byte*>(a.k_rows) + i * row_bytes,
                     static_cast<std::byte*>(a.v_rows) + i * row_bytes, 1, stream_);
    }
    ops_->attention_decode(a.q, n, rows, view, a.attn);
  } else {
    ops_->rope(a.q, a.k, n, nullptr, first_position);
    ops_->to_cache_rows(a.k, kv_count, a.k_rows);
    ops_->to_cache_rows(a.v, kv_count, a.v_rows);
    cache_->append(layer, slot, a.k_rows, a.v_rows, n, stream_);
    ops_->attention_prefill(a.q, n, slot, first_position, view, a.attn);
  }
  ops_->linear(a.attn, n, qd, w.wo, w.bo, h, x, true);
}

void Decoder::mlp_block(int layer, float* x, int n) {
  const LayerWeights& w = weights_.layers[static_cast<std::size_t>(layer)];
  const ModelConfig& c = config_;
  Activations& a = *act_;
  const int h = c.hidden_size;
  const int ff = c.intermediate_size;
  ops_->rms_norm(x, n, w.mlp_norm, a.xnorm);
  ops_->linear(a.xnorm, n, h, w.w_gate, nullptr, ff, a.gate, false);
  ops_->linear(a.xnorm, n, h, w.w_up, nullptr, ff, a.up, false);
  ops_->swiglu(a.gate, a.up, static_cast<std::int64_t>(n) * ff);
  ops_->linear(a.gate, n, ff, w.w_down, nullptr, h, x, true);
}

void Decoder::logits_of(const float* rows, int n, float* host_logits) {
  ops_->rms_norm(rows, n, weights_.final_norm, act_->xnorm);
  ops_->linear(act_->xnorm, n, config_.hidden_size, weights_.lm_head, nullptr, config_.vocab_size,
               act_->logits, false);
  if (stream_ != nullptr) cache_->synchronize_stream(stream_);
  cache_->copy_to_host(host_logits, act_->logits,
                       sizeof(float) * static_cast<std::size_t>(n) * config_.vocab_size);
}

void Decoder::prefill(int slot, const std::vector<std::int32_t>& tokens, float* logits,
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
  if (n > options_.max_prompt) {
    throw invalid("the prompt has " + std::to_string(n) + " tokens, more than the " +
                  std::to_string(options_.max_prompt) + " the decoder was planned for");
  }
  check_tokens(tokens);
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0) throw invalid("token id " + std::to_string(tokens[i]) + " is negative");
  }
  Activations& a = *act_;
  if (stream_ != nullptr) cache_->synchronize_stream(stream_);
  cache_->copy_to_device(a.tokens, tokens.data(), tokens.size() * sizeof(std::int32_t));
  ops_->embed(a.tokens, n, weights_.embed, a.residual);

  std::vector<std::int32_t> counts(static_cast<std::size_t>(options_.slots), 0);
  counts[static_cast<std::size_t>(slot)] = n;
  cache_->begin_step(counts);
  const int chunk = options_.chunk;
  for (int layer = 0; layer < config_.layers; ++layer) {
    const LayerView view = cache_->acquire(layer, stream_);
    for (int c0 = 0; c0 < n; c0 += chunk) {
      const int m = std::min(chunk, n - c0);
      float* x = a.residual + static_cast<std::int64_t>(c0) * config_.hidden_size;
      attention_block(layer, view, x, m, slot, start + c0, false);
      mlp_block(layer, x, m);
    }
    cache_->release(layer, stream_);
    if (progress) progress(layer + 1, config_.layers);
  }
  cache_->end_step();
  logits_of(a.residual + static_cast<std::int64_t>(n - 1) * config_.hidden_size, 1, logits);
}

void Decoder::decode(const std::vector<std::int32_t>& tokens, float* logits) {
  const int slots = options_.slots;
  if (static_cast<int>(tokens.size()) != slots) {
    throw invalid("decode needs one token per slot (" + std::to_string(slots) + "), got " +
                  std::to_string(tokens.size()));
  }
  check_tokens(tokens);
  std::vector<std::int32_t> counts(static_cast<std::size_t>(slots), 0);
  int n = 0;
  for (int s = 0; s < slots; ++s) {
    if (tokens[static_cast<std::size_t>(s)] < 0) continue;
    if (cache_->length(s) + 1 > options_.max_seq) {
      throw invalid("slot " + std::to_string(s) + " is full (max_seq " +
                    std::to_string(options_.max_seq) + ")");
    }
    host_rows_[static_cast<std::size_t>(n)] = tokens[static_cast<std::size_t>(s)];
    host_rows_[static_cast<std::size_t>(slots + n)] = s;
    host_rows_[static_cast<std::size_t>(2 * slots + n)] = cache_->length(s);
    counts[static_cast<std::size_t>(s)] = 1;
    ++n;
  }
  if (n == 0) return;
  Activations& a = *act_;
  if (stream_ != nullptr) cache_->synchronize_stream(stream_);
  cache_->copy_to_device(a.rows, host_rows_.data(), host_rows_.size() * sizeof(std::int32_t));
  ops_->embed(a.rows, n, weights_.embed, a.residual);
  cache_->begin_step(counts);
  for (int layer = 0; layer < config_.layers; ++layer) {
    const LayerView view = cache_->acquire(layer, stream_);
    attention_block(layer, view, a.residual, n, -1, 0, true);
    mlp_block(layer, a.residual, n);
    cache_->release(layer, stream_);
  }
  cache_->end_step();
  // Logits of the n rows, then spread to their slots' places.
  std::vector<float>& staging = decode_logits_;
  staging.resize(static_cast<std::size_t>(n) * config_.vocab_size);
  logits_of(a.residual, n, staging.data());
  for (int i = 0; i < n; ++i) {
    const int s = host_rows_[static_cast<std::size_t>(slots + i)];
    std::memcpy(logits + static_cast<std::int64_t>(s) * config_.vocab_size,
                staging.data() + static_cast<std::int64_t>(i) * config_.vocab_size,
                sizeof(float) * static_cast<std::size_t>(config_.vocab_size));
  }
}

}  // namespace kvo::model
