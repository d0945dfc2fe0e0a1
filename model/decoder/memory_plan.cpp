#include "model/decoder/memory_plan.hpp"

#include <algorithm>
#include <string>

#include "kvoffload/error.hpp"
#include "kvoffload/plan.hpp"
#include "kvoffload/quant.hpp"
#include "model/checkpoint/weight_formats.hpp"
#include "model/checkpoint/weights.hpp"
#include "model/host/host_workspace.hpp"
#include "model/host/thread_pool.hpp"

namespace kvo::model {
namespace {

std::uint64_t align256(std::uint64_t bytes) {
  return (bytes + 255) / 256 * 256;
}

}  // namespace

WorkspaceLayout::WorkspaceLayout(const ModelConfig& c, DType weight_dtype, DType kv_dtype,
                                 int max_rows, int max_decode_rows, int max_seq,
                                 const AttentionKernels& chosen, bool weight_blocks, bool split)
    : kernels(chosen) {
  const std::uint64_t f = sizeof(float);
  const std::uint64_t i32 = sizeof(std::int32_t);
  const std::uint64_t rows = static_cast<std::uint64_t>(max_rows);
  const std::uint64_t decode_rows = static_cast<std::uint64_t>(max_decode_rows);
  const std::uint64_t heads = static_cast<std::uint64_t>(c.heads);
  const std::uint64_t d = static_cast<std::uint64_t>(c.head_dim);
  const std::uint64_t element = dtype_size(weight_dtype);
  // FlashInfer's q and out: the K/V type, or bf16 for the tiles of a quantized cache.
  const std::uint64_t kv_element = kernels.dequant_tiles ? 2 : dtype_size(kv_dtype);
  std::uint64_t offset = kCublasWorkspaceBytes;
  auto take = [&offset](std::uint64_t size) {
    const std::uint64_t at = offset;
    offset += align256(size);
    return at;
  };
  const auto widest = static_cast<std::uint64_t>(widest_input(c));
  gemm_input = take(weight_dtype == DType::kF32 ? 0 : rows * widest * element);
  sampling = take(i32 * 3 * decode_rows);
  if (weight_blocks && max_rows > kBlockDecodeRows) {  // else every call reads the blocks once
    const std::uint64_t fit = kBlockTileBytes / (widest * element) / 128 * 128;
    const std::uint64_t tallest = static_cast<std::uint64_t>(
        std::max({c.vocab_size, c.intermediate_size, static_cast<int>(c.q_dim()), c.hidden_size}));
    block_tile_rows = static_cast<int>(
        std::min(std::max<std::uint64_t>(kBlockTileMinRows, fit), (tallest + 127) / 128 * 128));
    block_tile = take(static_cast<std::uint64_t>(block_tile_rows) * widest * element);
  }
  if (kernels.any_flashinfer()) {
    attn_q = take(rows * heads * d * kv_element);
    attn_out = take(rows * heads * d * kv_element);
  }
  if (kernels.dequant_tiles) {
    tile_lse = take(f * rows * heads);
    run_lse = take(f * rows * heads);
    kv_tile = take(2 * static_cast<std::uint64_t>(kernels.tile_keys) * c.kv_dim() * 2);
  } else if (kernels.flashinfer_decode) {
    // FlashInfer's decode schedule splits the keys into at most decode_grid / kv_heads partial
    // rows (or none, when the slots alone fill the grid); each array is placed at 16 bytes.
    decode_grid = kPlannedSms * kDecodeBlocksPerSm;
    const std::uint64_t partial_rows =
        std::max<std::uint64_t>(decode_rows, static_cast<std::uint64_t>(decode_grid / c.kv_heads));
    decode_float_bytes = (heads * partial_rows * d * f + 15) + (heads * partial_rows * f + 15);
    decode_float = take(decode_float_bytes);
    decode_int_bytes = 3 * (partial_rows * i32 + 15) + i32 + i32 + (partial_rows + 15);
    // Window and full layers page their rows differently: a schedule for each kind there is.
    bool window = false, full = false;
    for (int l = 0; l < c.layers; ++l) (c.window(l) > 0 ? window : full) = true;
    decode_schedules = window && full ? 2 : 1;
    const auto schedules = static_cast<std::uint64_t>(decode_schedules);
    decode_int = take(schedules * align256(decode_int_bytes));
    decode_pages_count = (decode_rows + 1) + decode_rows +
                         decode_rows * static_cast<std::uint64_t>(max_seq / kernels.page_size);
    decode_pages = take(schedules * align256(decode_pages_count * i32));
  } else {
    partials = take(decode_rows * heads * kMaxAttentionSplits * (d + 2) * f);
  }
  if (split) {
    if (partials == 0) partials = take(decode_rows * heads * kMaxAttentionSplits * (d + 2) * f);
    split_first = take(i32 * decode_rows);
    split_out = take(f * decode_rows * heads * d);
    split_lse = take(f * 2 * decode_rows * heads);
  }
  if (kernels.flashinfer_prefill) {
    prefill_tmp_bytes = static_cast<std::uint64_t>(kPlannedSms) *
                        flashinfer_prefill_rows_per_sm(c.head_dim) * (d * kv_element + f);
    prefill_tmp = take(prefill_tmp_bytes);
  } else {
    prefill_scores = take(f * heads * rows * kPrefillKeyBlock);
    prefill_stats = take(f * 2 * heads * rows);
    prefill_kv = take(kv_dtype == DType::kF32 ? 0 : f * 2 * kPrefillKeyBlock * c.kv_dim());
  }
  bytes = offset;
}

std::uint64_t ActivationLayout::carve(std::byte* base, const ModelConfig& c, DType kv_dtype, int R,
                                      int P, int slots, int logit_rows) {
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
  k_rows = take(r * kv_row_bytes(kv_dtype, c.kv_heads, c.head_dim));
  v_rows = take(r * kv_row_bytes(kv_dtype, c.kv_heads, c.head_dim));
  logits = reinterpret_cast<float*>(
      take(f * static_cast<std::uint64_t>(std::max(slots, logit_rows)) * c.vocab_size));
  tokens = reinterpret_cast<std::int32_t*>(take(4 * static_cast<std::uint64_t>(P)));
  rows = reinterpret_cast<std::int32_t*>(take(4 * 3 * static_cast<std::uint64_t>(slots)));
  inv_freq = reinterpret_cast<float*>(take(f * static_cast<std::uint64_t>(c.head_dim / 2)));
  if (c.windowed()) {
    window_positions = reinterpret_cast<std::int32_t*>(
        take(4 * static_cast<std::uint64_t>(c.layers) * static_cast<std::uint64_t>(slots)));
  }
  if (c.rope_local_theta > 0) {
    inv_freq_local = reinterpret_cast<float*>(take(f * static_cast<std::uint64_t>(c.head_dim / 2)));
  }
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

namespace {

// The sizes that follow from the longest piece prefilled at once (and the cache's region for
// the activations, once the cache is configured).
void size_prompt(DecoderMemory& m, const ModelConfig& config, const DecoderOptions& options,
                 int max_prompt) {
  m.max_prompt = max_prompt;
  m.max_rows = std::max(std::min(options.chunk, m.max_prompt), options.slots);
  m.prompt_rows = std::max(m.max_prompt, options.slots);
  // Logit rows go through the rows of a chunk (xnorm, the GEMM input): no more than max_rows.
  m.logit_rows = std::max(std::min({options.logit_rows, m.max_prompt, m.max_rows}), options.slots);
  m.activations = ActivationLayout().carve(nullptr, config, m.kv_dtype, m.max_rows, m.prompt_rows,
                                           options.slots, m.logit_rows);
  for (ReservedRegion& r : m.cache.reserved) {
    if (r.name == "activations") r.bytes = m.activations;
  }
  // A window layer takes at most a chunk of rows per append (a decode step one).
  if (!m.cache.layer_windows.empty()) m.cache.max_append = m.max_rows;
}

// The layers the cache keeps as windows: each windowed layer whose window buffer is shorter
// than max_seq, while at least one layer stays full (the cache needs one); none when the
// options keep every layer full.
std::vector<int> cache_windows(const ModelConfig& config, const DecoderOptions& options,
                               int max_rows) {
  if (!options.window_layers || !config.windowed()) return {};
  std::vector<int> windows(static_cast<std::size_t>(config.layers));
  bool full = false;
  for (int l = 0; l < config.layers; ++l) {
    const int w = config.window(l);
    if (w > 0 && window_rows(w, max_rows) < options.max_seq) {
      windows[static_cast<std::size_t>(l)] = w;
    } else {
      full = true;
    }
  }
  return full ? windows : std::vector<int>{};
}

// Whether the cache's plan, its reserved regions included, fits `budget` with any number of
// resident layers.
bool plan_fits(const DecoderMemory& m, std::uint64_t budget) {
  if (m.weights > budget) return false;
  CacheConfig c = m.cache;
  c.resident_layers = 0;
  try {
    plan_cache(c, budget);
    return true;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kOutOfMemory) return false;
    throw;
  }
}

}  // namespace

namespace {

// Some matrices are not in the model dtype: a GGUF file's blocks or kept f16/bf16 matrices (the
// decoder's flag), or a format quantized at load.
bool weights_in_blocks(const DecoderOptions& options) {
  return options.weights_in_blocks || !options.weight_format.empty();
}

}  // namespace

OpsShape host_ops_shape(const ModelConfig& config, const DecoderOptions& options,
                        const DecoderMemory& memory) {
  OpsShape shape;
  shape.config = config;
  shape.weight_dtype = memory.dtype;
  shape.kv_dtype = memory.kv_dtype;
  shape.max_rows = memory.max_rows;
  shape.max_decode_rows = options.slots;
  shape.max_seq = options.max_seq;
  shape.f32_gemm = options.f32_gemm;
  shape.weight_blocks = weights_in_blocks(options);
  shape.q8_activations = options.q8_activations && shape.weight_blocks;
  shape.threads = options.threads > 0 ? options.threads : available_cores();
  shape.split = options.split.mode != SplitMode::kOff;
  return shape;
}

DecoderMemory plan_decoder_memory(const ModelConfig& config, const DecoderOptions& options,
                                  BackendKind backend) {
  if (options.max_seq < 1 || options.slots < 1 || options.chunk < 1 || options.logit_rows < 0) {
    throw Error(ErrorCode::kInvalidArgument,
                "max_seq, slots and chunk must be positive, and logit_rows not negative");
  }
  DecoderMemory m;
  m.dtype = options.override_dtype ? options.dtype : config.dtype;
  m.kv_dtype = options.override_kv_dtype ? options.kv_dtype : m.dtype;
  if (is_quantized(m.dtype)) {
    throw Error(ErrorCode::kInvalidArgument, std::string("weights are f32, f16 or bf16, not ") +
                                                 dtype_name(m.dtype) +
                                                 " (fp8 and int8 are K/V dtypes: kv_dtype)");
  }
  m.weights = !options.weight_format.empty()
                  ? quantized_weight_bytes(config, options.weight_format)
                  : (options.weights_bytes != 0 ? options.weights_bytes
                                                : WeightLayout(config, m.dtype).bytes());
  const int requested = options.max_prompt <= 0 || options.max_prompt > options.max_seq
                            ? options.max_seq
                            : options.max_prompt;
  size_prompt(m, config, options, requested);
  // The attention kernels are chosen here, once: the workspace is sized for them, and the
  // decoder hands them to its ops (OpsShape::kernels).
  m.kernels = choose_attention_kernels(config, m.kv_dtype, options.slots, options.max_seq,
                                       m.max_rows, options.builtin_attention);
  m.workspace = backend == BackendKind::kCuda
                    ? WorkspaceLayout(config, m.dtype, m.kv_dtype, m.max_rows, options.slots,
                                      options.max_seq, m.kernels, weights_in_blocks(options),
                                      options.split.mode != SplitMode::kOff)
                          .bytes
                    : HostWorkspaceLayout(host_ops_shape(config, options, m)).bytes;

  CacheConfig& cc = m.cache;
  cc.layers = config.layers;
  cc.kv_heads = config.kv_heads;
  cc.head_dim = config.head_dim;
  cc.max_seq = options.max_seq;
  cc.slots = options.slots;
  cc.dtype = m.kv_dtype;
  cc.resident_layers = options.resident_layers;
  cc.ring_depth = options.ring_depth;
  cc.device_budget = options.device_budget;
  cc.backend = backend;
  cc.host = options.host;
  cc.split = options.split;
  cc.reserved.push_back({"weights", m.weights});
  cc.reserved.push_back({"activations", m.activations});
  if (m.workspace > 0) cc.reserved.push_back({"workspace", m.workspace});
  // Window buffers sized for the largest chunk asked for (a smaller piece below only shrinks
  // them, and max_append follows it in size_prompt).
  cc.layer_windows = cache_windows(config, options, m.max_rows);
  if (!cc.layer_windows.empty()) {
    cc.max_append = m.max_rows;
    // resident_layers counts the full layers (window layers are always on the device): asking
    // for more than there are (--resident all) keeps all of them.
    const auto full =
        static_cast<int>(std::count(cc.layer_windows.begin(), cc.layer_windows.end(), 0));
    if (cc.resident_layers != kAutoResidentLayers) {
      cc.resident_layers = std::min(cc.resident_layers, full);
    }
  }
  if (options.fit_prompt && options.device_budget > 0 && !plan_fits(m, options.device_budget)) {
    // The largest piece of whole chunks, no smaller than one, whose activations fit beside the
    // weights and the ring (the plan's other reserved regions do not depend on it). Where even a
    // chunk does not fit, the requested size stays and the cache's plan says what is missing.
    const int smallest = std::min(options.chunk, requested);
    const auto fits = [&](int piece) {
      DecoderMemory trial = m;
      size_prompt(trial, config, options, piece);
      return plan_fits(trial, options.device_budget);
    };
    if (fits(smallest)) {
      int lo = smallest, hi = requested;  // fits(lo), !fits(hi)
      while (hi - lo > 1) {
        const int mid = lo + (hi - lo) / 2;
        (fits(mid) ? lo : hi) = mid;
      }
      // Whole chunks: a prompt in pieces then computes what it would in one (the same chunks
      // meet the same keys).
      size_prompt(m, config, options, std::max(smallest, lo / options.chunk * options.chunk));
    }
  }
  return m;
}

void check_q8_activations(bool q8_activations, BackendKind backend, bool blocks) {
  if (!q8_activations || (backend == BackendKind::kHost && blocks)) return;
  throw Error(
      ErrorCode::kInvalidArgument,
      "q8 activations multiply weights kept in GGUF blocks on the host backend (a GGUF "
      "file, or --weights q8_0); " +
          std::string(backend == BackendKind::kHost ? "these weights are not in blocks"
                                                    : "the CUDA path multiplies f32 activations"));
}

}  // namespace kvo::model
