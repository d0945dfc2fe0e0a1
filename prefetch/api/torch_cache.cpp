// kvo::torch::OffloadedStaticCache: HF-style update() calls turned into the per-step protocol,
// with lazy release (layer l is released when layer l + 1's update arrives, because only then is
// the caller's attention on l known to be enqueued). Every check runs before any state changes.
#include "kvoffload/torch.hpp"

#include <ATen/ATen.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/VirtualGuardImpl.h>

#include <algorithm>
#include <sstream>
#include <string>

#include "kvoffload/quant.hpp"

namespace kvo::torch {

namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}
Error protocol(const std::string& what) {
  return Error(ErrorCode::kProtocol, what);
}

// Torch's type of each dtype stored as a plain element, in DType's order (the adapter sees the
// public API alone; offload/util/element_types.hpp ties that order to the C ABI and the files);
// the quantized K/V dtypes have none.
constexpr at::ScalarType kTorchTypes[] = {at::kFloat, at::kHalf, at::kBFloat16};
static_assert(static_cast<int>(DType::kF32) == 0 && static_cast<int>(DType::kF16) == 1 &&
                  static_cast<int>(DType::kBF16) == 2,
              "kTorchTypes follows DType's order");

at::ScalarType scalar_type_of(DType dtype) {
  const auto i = static_cast<std::size_t>(dtype);
  if (i < sizeof(kTorchTypes) / sizeof(kTorchTypes[0])) return kTorchTypes[i];
  throw Error(ErrorCode::kInternal, std::string("no torch dtype stands for ") + dtype_name(dtype));
}

// The dtype of the keys and values update() takes and returns: the stored one, or for quantized
// K/V the one the caller computes in.
at::ScalarType states_dtype_of(const CacheConfig& config, at::ScalarType requested) {
  const bool undefined = requested == at::ScalarType::Undefined;
  if (!is_quantized(config.dtype)) {
    const at::ScalarType stored = scalar_type_of(config.dtype);
    if (!undefined && requested != stored) {
      throw invalid(std::string("the cache stores ") + dtype_name(config.dtype) +
                    " keys and values, which update() takes and returns as they are: "
                    "states_dtype must be " +
                    c10::toString(stored) + " (or left undefined), not " +
                    c10::toString(requested));
    }
    return stored;
  }
  if (requested != at::kFloat && requested != at::kHalf && requested != at::kBFloat16) {
    throw invalid(std::string("a cache of ") + dtype_name(config.dtype) +
                  " K/V quantizes keys and values computed in float, half or bfloat16 and "
                  "returns them in that dtype: give it as states_dtype (got " +
                  (undefined ? std::string("none") : std::string(c10::toString(requested))) + ")");
  }
  return requested;
}

std::string shape_of(const at::Tensor& tensor) {
  std::ostringstream out;
  out << tensor.sizes();
  return out.str();
}

std::string device_of(const at::Device& device) {
  std::ostringstream out;
  out << device;
  return out.str();
}

// rows [batch, n, kv_heads, dim] (contiguous, any float dtype) as quantized rows [batch, n,
// quant_row_bytes] (uint8), on the rows' device: the arithmetic of kvo::quantize_row in torch
// operations, to the same bits for finite inputs. Every division is by a tensor on the rows'
// device (a CPU scalar divisor may become a multiplication by its reciprocal).
at::Tensor quantize_rows(const at::Tensor& rows, DType dtype) {
  const std::int64_t batch = rows.size(0);
  const std::int64_t n = rows.size(1);
  const std::int64_t heads = rows.size(2);
  const std::int64_t dim = rows.size(3);
  const at::Tensor x = rows.to(at::kFloat);
  const at::Tensor top = at::full({1}, quant::max_code(dtype), x.options());
  const at::Tensor scale = x.abs().amax(-1, /*keepdim=*/true) / top;  // [batch, n, heads, 1]
  const at::Tensor scaled = at::where(scale > 0, x / scale, at::zeros_like(x));
  const at::Tensor codes =
      dtype == DType::kInt8
          ? scaled.round().clamp(-127, 127).to(at::kChar).view(at::kByte)  // ties to even
          : scaled.clamp(-448, 448).to(at::kFloat8_e4m3fn).view(at::kByte);
  const auto row_bytes =
      static_cast<std::int64_t>(quant_row_bytes(static_cast<int>(heads), static_cast<int>(dim)));
  const auto scale_offset =
      static_cast<std::int64_t>(quant_scale_offset(static_cast<int>(heads), static_cast<int>(dim)));
  at::Tensor out = at::zeros({batch, n, row_bytes}, x.options().dtype(at::kByte));
  out.narrow(2, 0, heads * dim).copy_(codes.reshape({batch, n, heads * dim}));
  out.narrow(2, scale_offset, 4 * heads).view(at::kFloat).copy_(scale.reshape({batch, n, heads}));
  return out;
}

// The quantized rows [0, length) of slots [0, batch) at `base` (a staged or resident buffer:
// slot_stride and token_stride in bytes) as values [batch, kv_heads, length, dim] of `dtype`:
// decode(byte) * scale in f32, as kvo::dequantize_row, then rounded to `dtype`.
at::Tensor dequantize_rows(void* base, std::int64_t batch, std::int64_t length,
                           std::int64_t slot_stride, std::int64_t token_stride, int heads, int dim,
                           std::int64_t scale_offset, DType stored, at::ScalarType dtype,
                           const at::Device& device) {
  const auto row_bytes = static_cast<std::int64_t>(quant_row_bytes(heads, dim));
  const at::Tensor bytes =
      at::from_blob(base, {batch, length, row_bytes}, {slot_stride, token_stride, 1},
                    at::TensorOptions().dtype(at::kByte).device(device));
  const at::Tensor codes = bytes.narrow(2, 0, static_cast<std::int64_t>(heads) * dim)
                               .view(stored == DType::kInt8 ? at::kChar : at::kFloat8_e4m3fn)
                               .to(at::kFloat)
                               .view({batch, length, heads, dim});
  const at::Tensor scales = bytes.narrow(2, scale_offset, 4 * heads).view(at::kFloat);
  return (codes * scales.unsqueeze(-1)).to(dtype).permute({0, 2, 1, 3});
}

}  // namespace

OffloadedStaticCache::OffloadedStaticCache(const CacheConfig& config, at::ScalarType states_dtype,
                                           bool static_shapes)
    : cache_(config),
      device_(at::kCPU),
      dtype_(states_dtype_of(config, states_dtype)),
      static_shapes_(static_shapes),
      layers_(config.layers),
      slots_(config.slots),
      new_tokens_(static_cast<std::size_t>(config.slots), 0) {
  if (cache_.backend() == BackendKind::kCuda) {
    device_ = at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(config.device));
  }
}

OffloadedStaticCache::~OffloadedStaticCache() {
  // The caller's kernels may still read a view of this cache's memory.
  if (device_.is_cuda()) {
    try {
      cache_.synchronize_stream(last_stream_);
    } catch (...) {
    }
  }
}

void* OffloadedStaticCache::current_stream() const {
  if (!device_.is_cuda()) return nullptr;  // the host backend: synchronous, like CPU tensors
  const c10::impl::VirtualGuardImpl guard(c10::DeviceType::CUDA);
  return guard.getStream(device_).native_handle();
}

void OffloadedStaticCache::check_states(const at::Tensor& states, const char* name, int head_dim,
                                        std::int64_t layer_idx) const {
  const std::string where = "update of layer " + std::to_string(layer_idx) + ": ";
  if (!states.defined()) throw invalid(where + name + " is an undefined tensor");
  if (states.scalar_type() != dtype_) {
    throw invalid(where + name + " has dtype " + c10::toString(states.scalar_type()) +
                  ", the cache stores " + c10::toString(dtype_));
  }
  if (states.device() != device_) {
    throw invalid(where + name + " is on " + device_of(states.device()) + ", the cache is on " +
                  device_of(device_) + " (the " + backend_name(cache_.backend()) + " backend)");
  }
  const CacheConfig& c = cache_.config();
  if (states.dim() != 4 || states.size(0) < 1 || states.size(0) > c.slots ||
      states.size(1) != c.kv_heads || states.size(2) < 1 || states.size(3) != head_dim) {
    throw invalid(where + name + " has shape " + shape_of(states) + ", expected [1.." +
                  std::to_string(c.slots) + " (batch <= slots), " + std::to_string(c.kv_heads) +
                  " (kv_heads), n >= 1 (tokens), " + std::to_string(head_dim) + " (head_dim)]");
  }
}

void OffloadedStaticCache::check_positions(const at::Tensor& cache_position, std::int64_t length,
                                           std::int64_t n) const {
  if (!cache_position.defined()) return;
  if (cache_position.dim() != 1 || cache_position.numel() != n ||
      !at::isIntegralType(cache_position.scalar_type(), /*includeBool=*/false)) {
    throw invalid("update: cache_position must be a 1-D integer tensor of the " +
                  std::to_string(n) + " new positions, got " +
                  c10::toString(cache_position.scalar_type()) + " of shape " +
                  shape_of(cache_position));
  }
  const at::Tensor positions = cache_position.to(at::kCPU, at::kLong).contiguous();
  const std::int64_t* p = positions.data_ptr<std::int64_t>();
  for (std::int64_t i = 0; i < n; ++i) {
    if (p[i] != length + i) {
      throw invalid("update: cache_position must continue the cache: the cache holds " +
                    std::to_string(length) + " tokens, so the " + std::to_string(n) +
                    " new ones go at [" + std::to_string(length) + ", " +
                    std::to_string(length + n) + "), but position " + std::to_string(i) + " is " +
                    std::to_string(p[i]) +
                    " (gaps and rewrites are not supported; reset() or cache().truncate_slot "
                    "between steps)");
    }
  }
}

std::tuple<at::Tensor, at::Tensor> OffloadedStaticCache::update(const at::Tensor& key_states,
                                                                const at::Tensor& value_states,
                                                                std::int64_t layer_idx,
                                                                const at::Tensor& cache_position) {
  if (layer_idx < 0 || layer_idx >= layers_) {
    throw invalid("update: layer_idx " + std::to_string(layer_idx) +
                  " is out of range (the cache has " + std::to_string(layers_) + " layers)");
  }
  const int layer = static_cast<int>(layer_idx);
  const CacheConfig& c = cache_.config();
  check_states(key_states, "key_states", c.head_dim, layer_idx);
  check_states(value_states, "value_states", c.v_head_dim > 0 ? c.v_head_dim : c.head_dim,
               layer_idx);
  if (key_states.size(0) != value_states.size(0) || key_states.size(2) != value_states.size(2)) {
    throw invalid("update of layer " + std::to_string(layer) + ": key_states " +
                  shape_of(key_states) + " and value_states " + shape_of(value_states) +
                  " differ in batch or tokens");
  }
  const std::int64_t n = key_states.size(2);
  const int batch = static_cast<int>(key_states.size(0));  // rows use slots [0, batch)

  // Where the rows go: the length the step starts from, the same for every row of the batch.
  const std::int64_t committed = cache_.length(0);
  for (int s = 1; s < batch; ++s) {
    if (cache_.length(s) != committed) {
      throw protocol(
          "update: rows of the batch hold different lengths (slot 0: " + std::to_string(committed) +
          ", slot " + std::to_string(s) + ": " + std::to_string(cache_.length(s)) +
          "); the adapter keeps every row at the same position");
    }
  }
  const bool starts_step = layer == 0;
  std::int64_t length = committed;
  if (starts_step) {
    if (in_step_ && held_layer_ != layers_ - 1) {
      throw protocol("update of layer 0 while the open step has updated only layers [0, " +
                     std::to_string(held_layer_ + 1) + ") of " + std::to_string(layers_) +
                     " (every layer is updated once per step, in order; reset() drops the step)");
    }
    if (in_step_) length += step_tokens_;
    const std::int64_t max_seq = cache_.config().max_seq;
    if (length + n > max_seq) {
      throw invalid("update: " + std::to_string(n) + " more tokens after " +
                    std::to_string(length) + " would pass max_cache_len (" +
                    std::to_string(max_seq) + ")");
    }
  } else {
    if (!in_step_) {
      throw protocol("update of layer " + std::to_string(layer) +
                     " before layer 0 of a step (layers are updated in order 0, 1, ...)");
    }
    if (layer != held_layer_ + 1) {
      throw protocol("update of layer " + std::to_string(layer) + " out of order: " +
                     (held_layer_ + 1 == layers_
                          ? std::string("every layer of the step was updated; layer 0 starts the "
                                        "next")
                          : "expected layer " + std::to_string(held_layer_ + 1)));
    }
    if (n != step_tokens_) {
      throw invalid("update of layer " + std::to_string(layer) + " with " + std::to_string(n) +
                    " tokens, but layer 0 of this step had " + std::to_string(step_tokens_));
    }
    if (batch != step_batch_) {
      throw invalid("update of layer " + std::to_string(layer) + " with a batch of " +
                    std::to_string(batch) + " rows, but layer 0 of this step had " +
                    std::to_string(step_batch_));
    }
  }
  check_positions(cache_position, length, n);

  // append() wants each row [n][kv_heads][head_dim] contiguous: NHD, as the cache stores it;
  // quantized, [n][row bytes], quantized here on the tensors' device.
  at::Tensor k_rows = key_states.transpose(1, 2).contiguous();  // [batch, n, kv_heads, d]
  at::Tensor v_rows = value_states.transpose(1, 2).contiguous();
  if (is_quantized(c.dtype)) {
    k_rows = quantize_rows(k_rows, c.dtype);  // [batch, n, row bytes]
    v_rows = quantize_rows(v_rows, c.dtype);
  }
  void* stream = current_stream();

  if (starts_step) {
    if (in_step_) {
      cache_.release(held_layer_, held_stream_);
      cache_.end_step();
      in_step_ = false;
    }
    // Rows [0, batch) get n tokens; the slots past the batch sit the step out.
    for (int s = 0; s < slots_; ++s) {
      new_tokens_[static_cast<std::size_t>(s)] = s < batch ? static_cast<std::int32_t>(n) : 0;
    }
    cache_.begin_step(new_tokens_);
    in_step_ = true;
    step_tokens_ = n;
    step_batch_ = batch;
  } else {
    cache_.release(held_layer_, held_stream_);
  }
  held_layer_ = -1;
  const LayerView view = cache_.acquire(layer, stream);
  held_layer_ = layer;
  held_stream_ = stream;
  last_stream_ = stream;
  const std::size_t k_slot_bytes =
      static_cast<std::size_t>(k_rows.stride(0)) * k_rows.element_size();
  const std::size_t v_slot_bytes =
      static_cast<std::size_t>(v_rows.stride(0)) * v_rows.element_size();
  const auto* k_base = static_cast<const char*>(k_rows.data_ptr());
  const auto* v_base = static_cast<const char*>(v_rows.data_ptr());
  for (int s = 0; s < batch; ++s) {
    cache_.append(layer, s, k_base + static_cast<std::size_t>(s) * k_slot_bytes,
                  v_base + static_cast<std::size_t>(s) * v_slot_bytes, static_cast<int>(n), stream);
  }

  const std::int64_t rows = static_shapes_ ? c.max_seq : length + n;  // returned per batch row
  if (is_quantized(view.layout.dtype)) {
    // Dequantized on the device into new tensors of the caller's dtype (the staged rows hold
    // bytes and scales, which attention in torch cannot read); with static shapes, zero rows
    // after the valid ones, token-major as the valid ones are.
    const auto padded = [&](at::Tensor valid) {
      if (rows == length + n) return valid;
      // valid is [batch, kv_heads, length + n, dim] over [batch, length + n, kv_heads, dim].
      return at::constant_pad_nd(valid.permute({0, 2, 1, 3}), {0, 0, 0, 0, 0, rows - length - n})
          .permute({0, 2, 1, 3});
    };
    return {
        padded(dequantize_rows(view.k, batch, length + n, view.slot_stride, view.token_stride,
                               view.layout.kv_heads, view.layout.head_dim,
                               view.layout.k_scale_offset, view.layout.dtype, dtype_, device_)),
        padded(dequantize_rows(view.v, batch, length + n, view.v_slot_stride, view.v_token_stride,
                               view.layout.kv_heads, view.layout.v_head_dim,
                               view.layout.v_scale_offset, view.layout.dtype, dtype_, device_))};
  }
  // [batch, kv_heads, rows, head_dim] over the NHD buffer: zero-copy, strided.
  const at::TensorOptions options = at::TensorOptions().dtype(dtype_).device(device_);
  return {at::from_blob(view.k, {batch, view.layout.kv_heads, rows, view.layout.head_dim},
                        {view.slot_stride, view.head_stride, view.token_stride, 1}, options),
          at::from_blob(view.v, {batch, view.layout.kv_heads, rows, view.layout.v_head_dim},
                        {view.v_slot_stride, view.v_head_stride, view.v_token_stride, 1}, options)};
}

std::int64_t OffloadedStaticCache::get_seq_length() {
  if (in_step_ && held_layer_ == layers_ - 1) end_step();
  std::int64_t length = cache_.length(0);
  if (in_step_) length += step_tokens_;  // layer 0 already holds the open step's rows
  return length;
}

std::int64_t OffloadedStaticCache::get_max_cache_shape() const {
  return cache_.config().max_seq;
}

void OffloadedStaticCache::reset() {
  if (in_step_) {
    cache_.abort_step(held_layer_ >= 0 ? held_stream_ : current_stream());
    in_step_ = false;
    held_layer_ = -1;
    step_tokens_ = 0;
    step_batch_ = 0;
  }
  for (int s = 0; s < slots_; ++s) cache_.reset_slot(s);
}

void OffloadedStaticCache::end_step() {
  if (!in_step_) return;
  if (held_layer_ != layers_ - 1) {
    throw protocol("end_step after updating only layers [0, " + std::to_string(held_layer_ + 1) +
                   ") of " + std::to_string(layers_) + "; reset() drops the step");
  }
  cache_.release(held_layer_, held_stream_);
  cache_.end_step();
  last_stream_ = held_stream_;
  in_step_ = false;
  held_layer_ = -1;
  step_tokens_ = 0;
  step_batch_ = 0;
}

}  // namespace kvo::torch
