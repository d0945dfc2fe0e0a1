// The CUDA path: cuBLAS for every projection (f32 accumulation; bf16/f16 weights take their
// input converted to the same type; matrices in GGUF blocks through kernels_blocks.cu and tiles),
// FlashInfer's kernels for attention where they serve the shape (model/cuda/attention_kernels.hpp),
// the built-in kernels elsewhere, kernels for the rest. Everything is ordered on one stream and
// uses only the workspace planned with the cache (and two small pinned host mirrors of FlashInfer's
// decode schedule, allocated here once).
#include "model/cuda/cuda_ops.hpp"

#include "kvoffload/plan.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "model/cuda/cublas_loader.hpp"
#include "model/cuda/cuda_check.hpp"
#include "model/cuda/flashinfer_attention.hpp"
#include "model/cuda/kernels.hpp"
#include "model/decoder/memory_plan.hpp"
#include "model/host/host_attention.hpp"
#include "model/host/thread_pool.hpp"

namespace kvo::model {
namespace {

static_assert(cuda::kBlockDecodeRowsMax == kBlockDecodeRows, "one limit, planned and launched");

cudaDataType_t cuda_type(DType d) {
  return d == DType::kF32 ? CUDA_R_32F : d == DType::kF16 ? CUDA_R_16F : CUDA_R_16BF;
}

class CudaOps final : public Ops {
 public:
  CudaOps(const OpsShape& shape, void* stream, void* workspace)
      : shape_(shape),
        elem_(shape.weight_dtype),
        kv_elem_(shape.kv_dtype),
        norm_offset_(shape.config.norm_offset()),
        stream_(static_cast<cudaStream_t>(stream)),
        layout_(shape.config, shape.weight_dtype, shape.kv_dtype, shape.max_rows,
                shape.max_decode_rows, shape.max_seq, shape.kernels, shape.weight_blocks,
                shape.split) {
    base_ = static_cast<std::byte*>(workspace);
    gemm_input_ = base_ + layout_.gemm_input;
    block_tile_ = base_ + layout_.block_tile;
    partials_ = reinterpret_cast<float*>(base_ + layout_.partials);
    scores_ = reinterpret_cast<float*>(base_ + layout_.prefill_scores);
    stats_ = reinterpret_cast<float*>(base_ + layout_.prefill_stats);
    kv_block_ = reinterpret_cast<float*>(base_ + layout_.prefill_kv);
    try {
      if (layout_.kernels.any_flashinfer()) setup_flashinfer();
      if (shape_.split) setup_split();
      KVO_MODEL_CUBLAS_CHECK(cublas::api().create(&handle_));
      KVO_MODEL_CUBLAS_CHECK(cublas::api().set_stream(handle_, stream_));
      KVO_MODEL_CUBLAS_CHECK(cublas::api().set_workspace(handle_, base_, kCublasWorkspaceBytes));
      KVO_MODEL_CUBLAS_CHECK(cublas::api().set_math_mode(handle_, CUBLAS_DEFAULT_MATH));
    } catch (...) {
      release();
      throw;
    }
  }
  ~CudaOps() override { release(); }
  CudaOps(const CudaOps&) = delete;
  CudaOps& operator=(const CudaOps&) = delete;

  void embed(const std::int32_t* tokens, int n, WeightRef table, float* out) override {
    const int hidden = shape_.config.hidden_size;
    if (table.in_blocks()) {
      cuda::embed_blocks(tokens, n, table.data, table.ggml(), hidden, out, stream_);
    } else {
      cuda::embed(tokens, n, table.data, elem_, hidden, out, stream_);
    }
    if (shape_.embed_scale != 1.0f) {
      cuda::scale(out, static_cast<std::int64_t>(n) * hidden, shape_.embed_scale, stream_);
    }
  }
  void rms_norm(const float* x, int n, int width, const void* weight, float* out) override {
    cuda::rms_norm(x, n, width, weight, elem_, static_cast<float>(shape_.config.rms_norm_eps),
                   norm_offset_, out, stream_);
  }
  void linear(const float* x, int n, int in, WeightRef w, const void* bias, int out, float* y,
              bool accumulate) override {
    if (n == 0) return;
    check_weights_type(w, elem_);
    if (w.in_blocks()) {
      multiply_blocks(x, nullptr, n, in, w, bias, out, y, accumulate);
      return;
    }
    gemm(gemm_input(x, n, in), n, in, w.data, bias, out, y, accumulate);
  }
  void linear_many(const float* x, int n, int in, const Projection* projections,
                   int count) override {
    if (n == 0) return;
    const void* input = nullptr;  // converted once, for every projection a GEMM multiplies
    for (int i = 0; i < count; ++i) {
      const Projection& p = projections[i];
      if (p.w.in_blocks() && n <= cuda::kBlockDecodeRowsMax) {
        multiply_blocks(x, nullptr, n, in, p.w, p.bias, p.out, p.y, p.accumulate);
        continue;
      }
      if (input == nullptr) input = gemm_input(x, n, in);
      if (p.w.in_blocks()) {
        multiply_blocks(x, input, n, in, p.w, p.bias, p.out, p.y, p.accumulate);
      } else {
        gemm(input, n, in, p.w.data, p.bias, p.out, p.y, p.accumulate);
      }
    }
  }
  // A matrix in GGUF blocks: a decode step's few rows through the kernel that reads the blocks
  // once; more through tiles of its rows dequantized into the model dtype, each a GEMM into its
  // columns of y. `input`: x as the GEMMs read it, or null to convert it here.
  void multiply_blocks(const float* x, const void* input, int n, int in, WeightRef w,
                       const void* bias, int out, float* y, bool accumulate) {
    if (n <= cuda::kBlockDecodeRowsMax) {
      cuda::linear_blocks(x, n, in, w.data, w.ggml(), out, y, accumulate, stream_);
    } else {
      if (layout_.block_tile_rows == 0) {
        throw Error(ErrorCode::kInternal, "weights in GGUF blocks, but no tile was planned");
      }
      if (input == nullptr) input = gemm_input(x, n, in);
      for (int c0 = 0; c0 < out; c0 += layout_.block_tile_rows) {
        const int rows = std::min(layout_.block_tile_rows, out - c0);
        cuda::dequantize_blocks(
            static_cast<const std::byte*>(w.data) + matrix_bytes(w.type, c0, in), w.ggml(), rows,
            in, block_tile_, elem_, stream_);
        gemm_columns(input, n, in, block_tile_, rows, y + c0, out, accumulate);
      }
    }
    if (bias != nullptr) cuda::add_bias(y, n, out, bias, elem_, stream_);
  }
  // x as the GEMMs read it: itself in f32, else converted to the weights' type.
  const void* gemm_input(const float* x, int n, int in) {
    if (shape_.weight_dtype == DType::kF32) return x;
    cuda::convert(x, static_cast<std::int64_t>(n) * in, gemm_input_, elem_, stream_);
    return gemm_input_;
  }
  void gemm(const void* input, int n, int in, const void* w, const void* bias, int out, float* y,
            bool accumulate) {
    gemm_columns(input, n, in, w, out, y, out, accumulate);
    if (bias != nullptr) cuda::add_bias(y, n, out, bias, elem_, stream_);
  }
  // y [n][cols] (row stride ldy) = x [n][in] W^T for W [cols][in] (y += with `accumulate`).
  void gemm_columns(const void* input, int n, int in, const void* w, int cols, float* y, int ldy,
                    bool accumulate) {
    const float alpha = 1.0f;
    const float beta = accumulate ? 1.0f : 0.0f;
    const cudaDataType_t type = cuda_type(shape_.weight_dtype);
    // Row-major y [n][cols] = x [n][in] W^T is column-major y^T [cols][n] = W^T [cols][in] x^T.
    KVO_MODEL_CUBLAS_CHECK(cublas::api().gemm_ex(
        handle_, CUBLAS_OP_T, CUBLAS_OP_N, cols, n, in, &alpha, w, type, in, input, type, in, &beta,
        y, CUDA_R_32F, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  }
  void rope(float* q, float* k, int n, const std::int32_t* positions, int first_position,
            bool local) override {
    const ModelConfig& c = shape_.config;
    cuda::rope(q, k, n, c.heads, c.kv_heads, c.head_dim,
               local ? shape_.inv_freq_local : shape_.inv_freq, local ? 1.0f : shape_.rope_scale,
               positions, first_position, stream_);
  }
  void to_cache_rows(const float* x, int n, void* out) override {
    const ModelConfig& c = shape_.config;
    if (is_quantized(kv_elem_)) {
      cuda::quantize_rows(x, n, c.kv_heads, c.head_dim, kv_elem_,
                          static_cast<std::int64_t>(quant_row_bytes(c.kv_heads, c.head_dim)), out,
                          stream_);
      return;
    }
    cuda::convert(x, static_cast<std::int64_t>(n) * c.kv_dim(), out, kv_elem_, stream_);
  }
  // Attention goes through FlashInfer where it serves the shape: the f32 queries are converted to
  // the cache's type, FlashInfer reads the staged K/V in place, and its output is widened back.
  void attention_prefill(const float* q, int n, int slot, int first_position, int window,
                         const LayerView& view, float* out) override {
    if (n == 0) return;
    if (layout_.kernels.dequant_tiles) {
      tiled_prefill(q, n, slot, first_position, window, view, out);
      return;
    }
    if (!layout_.kernels.flashinfer_prefill) {
      builtin_prefill(q, n, slot, first_position, window, view, out);
      return;
    }
    const ModelConfig& c = shape_.config;
    const std::int64_t count = static_cast<std::int64_t>(n) * c.q_dim();
    cuda::convert(q, count, attn_q_, kv_elem_, stream_);
    flashinfer_ops::PrefillCall call;
    call.q = attn_q_;
    call.out = attn_out_;
    call.n = n;
    call.heads = c.heads;
    call.slot = slot;
    call.first_position = first_position;
    call.window_left = window_left(window);
    call.sm_scale = sm_scale();
    call.soft_cap = static_cast<float>(shape_.config.attn_softcap);
    call.tmp = prefill_tmp_;
    call.tmp_bytes = layout_.prefill_tmp_bytes;
    flashinfer_ops::prefill(view, call, stream_);
    cuda::widen(attn_out_, count, kv_elem_, out, stream_);
  }
  void attention_decode(const float* q, int n, const DecodeRows& rows, int window,
                        const LayerView& view, float* out) override {
    if (n == 0) return;
    if (layout_.kernels.dequant_tiles) {
      tiled_decode(q, n, rows, window, view, out);
      return;
    }
    if (!layout_.kernels.flashinfer_decode) {
      builtin_decode(q, n, rows, window, view, out);
      return;
    }
    if (n > shape_.max_decode_rows) {
      throw Error(ErrorCode::kInternal, "attention_decode: more rows than the plan's slots");
    }
    const ModelConfig& c = shape_.config;
    const std::int64_t count = static_cast<std::int64_t>(n) * c.q_dim();
    cuda::convert(q, count, attn_q_, kv_elem_, stream_);
    for (int i = 0; i < n; ++i) kv_lens_[static_cast<std::size_t>(i)] = rows.host_positions[i] + 1;
    flashinfer_ops::DecodeCall call;
    call.q = attn_q_;
    call.out = attn_out_;
    call.n = n;
    call.heads = c.heads;
    call.slots = rows.host_slots;
    call.kv_lens = kv_lens_.data();
    call.window_left = window_left(window);
    call.sm_scale = sm_scale();
    call.soft_cap = static_cast<float>(shape_.config.attn_softcap);
    call.page_size = layout_.kernels.page_size;
    flashinfer_ops::decode(view, call, decode_ws_, stream_);
    cuda::widen(attn_out_, count, kv_elem_, out, stream_);
  }
  // Split attention: the queries go to the host (pinned) while the device attends each row's
  // tail [split, position] with the built-in kernels and its log-sum-exp; once the queries are
  // there, the host pool attends the rows before the split in the host store, its output and
  // log-sum-exps come back, and merge_attention_tile joins the two on the device. The host waits
  // for the queries (the layer's projections before them) and nothing else; the buffers of one
  // layer are rewritten by the next only after their copies to the device are done.
  void attention_decode_split(const float* q, int n, const DecodeRows& rows, int window,
                              const LayerView& view, float* out) override {
    if (n == 0) return;
    if (!shape_.split) {
      throw Error(ErrorCode::kInternal,
                  "attention_decode_split: the CUDA ops were made without OpsShape::split");
    }
    if (n > shape_.max_decode_rows) {
      throw Error(ErrorCode::kInternal, "attention_decode_split: more rows than the plan's slots");
    }
    const ModelConfig& c = shape_.config;
    const int slots = shape_.max_decode_rows;
    const std::size_t q_bytes = sizeof(float) * static_cast<std::size_t>(n) * c.q_dim();
    const std::size_t lse_bytes = sizeof(float) * static_cast<std::size_t>(n) * c.heads;
    KVO_MODEL_CUDA_CHECK(cudaEventSynchronize(split_sent_));
    std::copy(view.split_rows, view.split_rows + slots, split_first_host_);
    int longest = 0;
    for (int i = 0; i < n; ++i) {
      longest = std::max(longest, rows.host_positions[i] + 1 - view.split_rows[rows.host_slots[i]]);
    }
    auto* first = reinterpret_cast<std::int32_t*>(base_ + layout_.split_first);
    auto* host_out = reinterpret_cast<float*>(base_ + layout_.split_out);
    auto* device_lse = reinterpret_cast<float*>(base_ + layout_.split_lse);
    float* host_lse = device_lse + static_cast<std::size_t>(shape_.max_decode_rows) * c.heads;
    KVO_MODEL_CUDA_CHECK(
        cudaMemcpyAsync(split_q_host_, q, q_bytes, cudaMemcpyDeviceToHost, stream_));
    KVO_MODEL_CUDA_CHECK(cudaEventRecord(split_q_ready_, stream_));
    KVO_MODEL_CUDA_CHECK(cudaMemcpyAsync(first, split_first_host_, sizeof(std::int32_t) * slots,
                                         cudaMemcpyHostToDevice, stream_));
    cuda::AttentionArgs a = args(q, n, window, view, out);
    a.slots = rows.slots;
    a.positions = rows.positions;
    a.first_keys = first;
    a.lse = device_lse;
    cuda::attention(a, std::clamp(longest / 256, 1, kMaxAttentionSplits), partials_, stream_);

    KVO_MODEL_CUDA_CHECK(cudaEventSynchronize(split_q_ready_));
    HostAttention::KeyRange before;
    before.end = view.split_rows;
    before.lse = split_lse_host_;
    split_attention_->decode(split_q_host_, n, rows.host_slots, rows.host_positions, window,
                             host_part(view), split_out_host_, before);
    KVO_MODEL_CUDA_CHECK(
        cudaMemcpyAsync(host_out, split_out_host_, q_bytes, cudaMemcpyHostToDevice, stream_));
    KVO_MODEL_CUDA_CHECK(
        cudaMemcpyAsync(host_lse, split_lse_host_, lse_bytes, cudaMemcpyHostToDevice, stream_));
    KVO_MODEL_CUDA_CHECK(cudaEventRecord(split_sent_, stream_));
    cuda::merge_attention_tile(host_out, DType::kF32, host_lse, n, c.heads, c.head_dim, false, out,
                               device_lse, stream_);
  }
  void gated_activation(float* gate, const float* up, std::int64_t count) override {
    cuda::gated_activation(gate, up, count, shape_.config.hidden_act == Activation::kGeluTanh,
                           stream_);
  }
  void add(float* x, const float* y, std::int64_t count, float scale) override {
    cuda::add(x, y, count, scale, stream_);
  }
  void scale(float* x, std::int64_t count, float factor) override {
    cuda::scale(x, count, factor, stream_);
  }
  void soft_cap(float* x, std::int64_t count, float cap) override {
    cuda::soft_cap(x, count, cap, stream_);
  }
  void synchronize() override { KVO_MODEL_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
  void fill_synthetic(const WeightLayout& layout, const WeightEntry& entry, std::uint64_t seed,
                      void* dst) override {
    cuda::fill_synthetic(dst, entry.elements, layout.dtype(), seed, entry.stream, entry.scale,
                         entry.kind == WeightKind::kNorm, stream_);
  }
  // The rows' slots and draws go up, the draws run on the device, only the ids come back.
  void sample(const float* logits, int n, const SampleRows& rows, const SamplingParams& params,
              std::uint64_t seed, std::int32_t* tokens) override {
    if (n == 0) return;
    if (n > shape_.max_decode_rows) {
      throw Error(ErrorCode::kInvalidArgument, "sample: more rows than the plan's slots");
    }
    check_sampling(params);
    auto* device_rows = reinterpret_cast<std::int32_t*>(base_ + layout_.sampling);
    std::int32_t* device_tokens = device_rows + 2 * shape_.max_decode_rows;
    sample_rows_.assign(rows.slots, rows.slots + n);
    sample_rows_.insert(sample_rows_.end(), rows.draws, rows.draws + n);
    const std::size_t bytes = sizeof(std::int32_t) * static_cast<std::size_t>(n);
    KVO_MODEL_CUDA_CHECK(cudaMemcpyAsync(device_rows, sample_rows_.data(), 2 * bytes,
                                         cudaMemcpyHostToDevice, stream_));
    cuda::sample(logits, n, shape_.config.vocab_size, params.temperature, params.top_k,
                 params.top_p, seed, device_rows, device_tokens, stream_);
    KVO_MODEL_CUDA_CHECK(
        cudaMemcpyAsync(tokens, device_tokens, bytes, cudaMemcpyDeviceToHost, stream_));
    KVO_MODEL_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  // A quantized cache through FlashInfer (attention_kernels.hpp, kDequantTileKeys): the queries
  // in bf16, then per tile of keys (key_tiles): the tile dequantized into bf16, FlashInfer's
  // prefill kernel over it (causal for the queries' own tile, unmasked before it) with its
  // log-sum-exp, and its output merged into `out` in f32. A decode row is a chunk of one.
  void tiled_prefill(const float* q, int n, int slot, int first_position, int window,
                     const LayerView& view, float* out) {
    const ModelConfig& c = shape_.config;
    cuda::convert(q, static_cast<std::int64_t>(n) * c.q_dim(), attn_q_, DType::kBF16, stream_);
    attend_tiles(attn_q_, n, slot, first_position, window, view, out);
  }
  void tiled_decode(const float* q, int n, const DecodeRows& rows, int window,
                    const LayerView& view, float* out) {
    if (n > shape_.max_decode_rows) {
      throw Error(ErrorCode::kInternal, "attention_decode: more rows than the plan's slots");
    }
    const ModelConfig& c = shape_.config;
    const std::int64_t q_dim = static_cast<std::int64_t>(c.q_dim());
    cuda::convert(q, n * q_dim, attn_q_, DType::kBF16, stream_);
    for (int i = 0; i < n; ++i) {
      attend_tiles(attn_q_ + i * q_dim * 2, 1, rows.host_slots[i], rows.host_positions[i], window,
                   view, out + i * q_dim);
    }
  }
  // Rows [first_position, first_position + n) of `slot`, queries q_bf16 [n][heads][d].
  void attend_tiles(const std::byte* q_bf16, int n, int slot, int first_position, int window,
                    const LayerView& view, float* out) {
    const ModelConfig& c = shape_.config;
    const int d = c.head_dim;
    const int tile_keys = layout_.kernels.tile_keys;
    std::byte* k_tile = base_ + layout_.kv_tile;
    std::byte* v_tile = k_tile + static_cast<std::int64_t>(tile_keys) * c.kv_dim() * 2;
    auto* tile_lse = reinterpret_cast<float*>(base_ + layout_.tile_lse);
    auto* run_lse = reinterpret_cast<float*>(base_ + layout_.run_lse);
    CacheConfig tile_shape;  // the tile: one slot of tile_keys bf16 rows [kv_heads][d]
    tile_shape.slots = 1;
    tile_shape.max_seq = tile_keys;
    tile_shape.kv_heads = c.kv_heads;
    tile_shape.head_dim = d;
    tile_shape.dtype = DType::kBF16;
    const LayerView tile = LayerView::of(kv_layout(tile_shape), k_tile, v_tile);
    const std::vector<KeyTile> tiles =
        key_tiles(first_key(window, first_position), first_position, n, tile_keys);
    for (std::size_t i = 0; i < tiles.size(); ++i) {
      const KeyTile& t = tiles[i];
      const int keys = t.end - t.begin;
      cuda::gather_kv_block(view, slot, t.begin, keys, k_tile, v_tile, DType::kBF16, stream_);
      flashinfer_ops::PrefillCall call;
      call.q = q_bf16;
      call.out = attn_out_;
      call.n = n;
      call.heads = c.heads;
      call.sm_scale = sm_scale();
      call.soft_cap = static_cast<float>(c.attn_softcap);
      call.tmp = prefill_tmp_;
      call.tmp_bytes = layout_.prefill_tmp_bytes;
      call.lse = tile_lse;
      if (t.causal) {
        call.first_position = first_position - t.begin;
        call.window_left = window_left(window);
        flashinfer_ops::prefill(tile, call, stream_);
      } else {
        call.keys = keys;
        flashinfer_ops::prefill_unmasked(tile, call, stream_);
      }
      cuda::merge_attention_tile(attn_out_, DType::kBF16, tile_lse, n, c.heads, d, i == 0, out,
                                 run_lse, stream_);
    }
  }

  // The built-in kernels, for shapes FlashInfer does not serve.
  //
  // Prefill: keys in blocks of B = kPrefillKeyBlock, per block: S = scale Q K^T (cuBLAS, f32; a
  // bf16/f16 block is converted first), the masked online-softmax step (kernel), out += P V
  // (cuBLAS); then out /= the running sums. Per kv head g, one strided-batched GEMM covers its
  // `group` query heads: the K/V block is shared (stride 0), the heads' Q and out columns are d
  // apart.
  void builtin_prefill(const float* q, int n, int slot, int first_position, int window,
                       const LayerView& view, float* out) {
    const ModelConfig& c = shape_.config;
    const int d = c.head_dim;
    const int group = c.heads / c.kv_heads;
    const int B = kPrefillKeyBlock;
    const int last = first_position + n - 1;
    const float scale = sm_scale();
    const float one = 1.0f;
    const float zero = 0.0f;
    const std::int64_t score_stride = static_cast<std::int64_t>(n) * B;  // one head's [n][B]
    float* k_block = kv_block_;
    float* v_block = kv_block_ + static_cast<std::int64_t>(B) * c.kv_dim();
    cuda::PrefillBlock block;
    block.n = n;
    block.heads = c.heads;
    block.head_dim = d;
    block.first_position = first_position;
    block.sliding_window = window;
    block.softcap = static_cast<float>(c.attn_softcap);
    block.key_stride = B;
    if (view.layout.v_head_dim != d) {
      throw Error(ErrorCode::kInvalidArgument,
                  "attention_prefill: V rows of another width than K's");
    }
    const int begin = first_key(window, first_position);
    for (int k0 = begin; k0 <= last; k0 += B) {
      const int keys = std::min(B, last + 1 - k0);
      // K/V block as f32 rows: token j of kv head g at k_rows + j * k_ld + g * k_head (V: v_).
      const float* k_rows = nullptr;
      const float* v_rows = nullptr;
      std::int64_t k_ld = c.kv_dim(), v_ld = c.kv_dim();
      std::int64_t k_head = d, v_head = d;
      if (view.layout.dtype == DType::kF32) {
        k_rows =
            static_cast<const float*>(view.k) + slot * view.slot_stride + k0 * view.token_stride;
        v_rows = static_cast<const float*>(view.v) + slot * view.v_slot_stride +
                 k0 * view.v_token_stride;
        k_ld = view.token_stride;
        v_ld = view.v_token_stride;
        k_head = view.head_stride;
        v_head = view.v_head_stride;
      } else {
        cuda::gather_kv_block(view, slot, k0, keys, k_block, v_block, DType::kF32, stream_);
        k_rows = k_block;
        v_rows = v_block;
      }
      // Row-major S_h [n][B] = Q_h [n][d] K^T is column-major S_h^T [keys][n] = K [keys][d]
      // (stored d x keys, k_ld) transposed times Q_h^T (d x n, ld heads * d).
      for (int g = 0; g < c.kv_heads; ++g) {
        KVO_MODEL_CUBLAS_CHECK(cublas::api().gemm_strided_batched_ex(
            handle_, CUBLAS_OP_T, CUBLAS_OP_N, keys, n, d, &scale, k_rows + g * k_head, CUDA_R_32F,
            static_cast<int>(k_ld), 0, q + static_cast<std::int64_t>(g) * group * d, CUDA_R_32F,
            c.heads * d, d, &zero, scores_ + g * group * score_stride, CUDA_R_32F, B, score_stride,
            group, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
      block.key_begin = k0;
      block.keys = keys;
      block.first_block = k0 == begin;
      cuda::prefill_softmax_block(block, scores_, stats_, out, stream_);
      // Row-major O_h [n][d] += P_h [n][keys] V [keys][d] is column-major O_h^T (d x n, ld
      // heads * d) += V^T (d x keys, v_ld) P_h^T (keys x n, ld B).
      for (int g = 0; g < c.kv_heads; ++g) {
        KVO_MODEL_CUBLAS_CHECK(cublas::api().gemm_strided_batched_ex(
            handle_, CUBLAS_OP_N, CUBLAS_OP_N, d, n, keys, &one, v_rows + g * v_head, CUDA_R_32F,
            static_cast<int>(v_ld), 0, scores_ + g * group * score_stride, CUDA_R_32F, B,
            score_stride, &one, out + static_cast<std::int64_t>(g) * group * d, CUDA_R_32F,
            c.heads * d, d, group, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      }
    }
    cuda::prefill_normalize(n, c.heads, d, stats_, out, stream_);
  }
  // Decode: split-sequence over key ranges, merged after.
  void builtin_decode(const float* q, int n, const DecodeRows& rows, int window,
                      const LayerView& view, float* out) {
    cuda::AttentionArgs a = args(q, n, window, view, out);
    a.slots = rows.slots;
    a.positions = rows.positions;
    // Enough key ranges to fill the GPU when few rows decode over long prefixes.
    int longest = 0;
    for (int i = 0; i < n; ++i) longest = std::max(longest, rows.host_positions[i] + 1);
    const int splits = std::clamp(longest / 256, 1, kMaxAttentionSplits);
    cuda::attention(a, splits, partials_, stream_);
  }

  void setup_flashinfer() {
    attn_q_ = base_ + layout_.attn_q;
    attn_out_ = base_ + layout_.attn_out;
    if (layout_.kernels.flashinfer_decode && !layout_.kernels.dequant_tiles) {
      decode_ws_.float_buffer = base_ + layout_.decode_float;
      decode_ws_.float_bytes = layout_.decode_float_bytes;
      decode_ws_.int_bytes = layout_.decode_int_bytes;
      decode_ws_.pages_count = layout_.decode_pages_count;
      decode_ws_.grid = layout_.decode_grid;
      decode_ws_.schedules = DecodeSchedules(layout_.decode_schedules);
      for (int k = 0; k < layout_.decode_schedules; ++k) {
        flashinfer_ops::DecodeSchedule& s = decode_ws_.schedule[static_cast<std::size_t>(k)];
        s.int_buffer = base_ + layout_.decode_int_at(k);
        s.pages = reinterpret_cast<std::int32_t*>(base_ + layout_.decode_pages_at(k));
        KVO_MODEL_CUDA_CHECK(
            cudaHostAlloc(&s.int_host, layout_.decode_int_bytes, cudaHostAllocDefault));
        void* pages_host = nullptr;
        KVO_MODEL_CUDA_CHECK(cudaHostAlloc(
            &pages_host, layout_.decode_pages_count * sizeof(std::int32_t), cudaHostAllocDefault));
        s.pages_host = static_cast<std::int32_t*>(pages_host);
        KVO_MODEL_CUDA_CHECK(cudaEventCreateWithFlags(&s.mirrors_copied, cudaEventDisableTiming));
      }
      kv_lens_.resize(static_cast<std::size_t>(shape_.max_decode_rows));
    }
    if (layout_.kernels.flashinfer_prefill) {
      // The prefill split-KV scratch was planned for kPlannedSms SMs: on a wider GPU FlashInfer
      // would split further than it holds, so prefill does not split the keys there.
      int device = 0;
      int sms = 0;
      KVO_MODEL_CUDA_CHECK(cudaGetDevice(&device));
      KVO_MODEL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      prefill_tmp_ = sms <= kPlannedSms ? base_ + layout_.prefill_tmp : nullptr;
    }
  }
  // Frees what the constructor made; safe on a half-built object. Never throws.
  void setup_split() {
    const ModelConfig& c = shape_.config;
    const std::size_t rows = static_cast<std::size_t>(shape_.max_decode_rows);
    split_pool_ =
        std::make_unique<ThreadPool>(shape_.threads > 0 ? shape_.threads : available_cores());
    split_attention_ =
        std::make_unique<HostAttention>(c, kv_elem_, shape_.max_decode_rows, *split_pool_);
    void* p = nullptr;
    KVO_MODEL_CUDA_CHECK(cudaHostAlloc(&p, sizeof(float) * rows * c.q_dim(), cudaHostAllocDefault));
    split_q_host_ = static_cast<float*>(p);
    KVO_MODEL_CUDA_CHECK(cudaHostAlloc(&p, sizeof(float) * rows * c.q_dim(), cudaHostAllocDefault));
    split_out_host_ = static_cast<float*>(p);
    KVO_MODEL_CUDA_CHECK(cudaHostAlloc(&p, sizeof(float) * rows * c.heads, cudaHostAllocDefault));
    split_lse_host_ = static_cast<float*>(p);
    KVO_MODEL_CUDA_CHECK(cudaHostAlloc(&p, sizeof(std::int32_t) * rows, cudaHostAllocDefault));
    split_first_host_ = static_cast<std::int32_t*>(p);
    KVO_MODEL_CUDA_CHECK(cudaEventCreateWithFlags(&split_q_ready_, cudaEventDisableTiming));
    KVO_MODEL_CUDA_CHECK(cudaEventCreateWithFlags(&split_sent_, cudaEventDisableTiming));
  }
  void release() noexcept {
    if (split_sent_ != nullptr) {
      cudaEventSynchronize(split_sent_);  // no copy may still read the pinned buffers
      cudaEventDestroy(split_sent_);
    }
    if (split_q_ready_ != nullptr) {
      cudaEventSynchronize(split_q_ready_);
      cudaEventDestroy(split_q_ready_);
    }
    split_sent_ = split_q_ready_ = nullptr;
    for (void* p : {static_cast<void*>(split_q_host_), static_cast<void*>(split_out_host_),
                    static_cast<void*>(split_lse_host_), static_cast<void*>(split_first_host_)}) {
      if (p != nullptr) cudaFreeHost(p);
    }
    split_q_host_ = split_out_host_ = split_lse_host_ = nullptr;
    split_first_host_ = nullptr;
    if (handle_ != nullptr) cublas::api().destroy(handle_);
    handle_ = nullptr;
    for (flashinfer_ops::DecodeSchedule& s : decode_ws_.schedule) {
      if (s.mirrors_copied != nullptr) {
        cudaEventSynchronize(s.mirrors_copied);  // no copy may still read the mirrors
        cudaEventDestroy(s.mirrors_copied);
      }
      if (s.int_host != nullptr) cudaFreeHost(s.int_host);
      if (s.pages_host != nullptr) cudaFreeHost(s.pages_host);
    }
    decode_ws_ = flashinfer_ops::DecodeWorkspace{};
  }
  // FlashInfer counts the window's keys to the left of the query's own.
  static int window_left(int window) { return window > 0 ? window - 1 : -1; }
  float sm_scale() const { return static_cast<float>(shape_.config.attention_scale()); }
  cuda::AttentionArgs args(const float* q, int n, int window, const LayerView& view,
                           float* out) const {
    cuda::AttentionArgs a;
    a.q = q;
    a.out = out;
    a.n = n;
    a.heads = shape_.config.heads;
    a.sliding_window = window;
    a.scale = sm_scale();
    a.softcap = static_cast<float>(shape_.config.attn_softcap);
    a.kv = view;
    return a;
  }

  // Split attention (OpsShape::split): the host part's pool and attention, its pinned buffers
  // (the queries copied out, its output and log-sum-exps, each slot's split row for the device),
  // the event after the queries' copy and the one after the host part's copies to the device.
  std::unique_ptr<ThreadPool> split_pool_;
  std::unique_ptr<HostAttention> split_attention_;
  float* split_q_host_ = nullptr;
  float* split_out_host_ = nullptr;
  float* split_lse_host_ = nullptr;
  std::int32_t* split_first_host_ = nullptr;
  cudaEvent_t split_q_ready_ = nullptr;
  cudaEvent_t split_sent_ = nullptr;

  OpsShape shape_;
  DType elem_;         // the weights'
  DType kv_elem_;      // the cache's rows
  float norm_offset_;  // the family's, looked up once
  cudaStream_t stream_;
  WorkspaceLayout layout_;
  cublasHandle_t handle_ = nullptr;
  std::byte* base_ = nullptr;
  std::byte* gemm_input_ = nullptr;
  std::byte* block_tile_ = nullptr;
  float* partials_ = nullptr;
  float* scores_ = nullptr;    // [heads][max_rows][kPrefillKeyBlock]
  float* stats_ = nullptr;     // [2][heads][max_rows]
  float* kv_block_ = nullptr;  // [2][kPrefillKeyBlock][kv_heads][head_dim] (bf16/f16 caches)
  // FlashInfer's (model/decoder/memory_plan.hpp):
  std::byte* attn_q_ = nullptr;    // [R][heads][head_dim] (type)
  std::byte* attn_out_ = nullptr;  // [R][heads][head_dim] (type)
  std::byte* prefill_tmp_ = nullptr;
  flashinfer_ops::DecodeWorkspace decode_ws_;
  std::vector<std::int32_t> kv_lens_;      // [slots]: keys of each decode row
  std::vector<std::int32_t> sample_rows_;  // [2][n]: slots, then draws, of the rows sampled
};

}  // namespace

std::unique_ptr<Ops> make_cuda_ops(const OpsShape& shape, void* stream, void* workspace) {
  return std::make_unique<CudaOps>(shape, stream, workspace);
}

std::uint64_t cuda_device_bytes_in_use() {
  std::size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return 0;
  return total - free_bytes;
}

std::uint64_t cuda_default_budget() {
  std::size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) return 0;
  return default_device_budget(free_bytes, total);
}

}  // namespace kvo::model
