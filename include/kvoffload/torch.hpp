// kvo::torch::OffloadedStaticCache: the offloaded static cache behind the interface of Hugging
// Face's static cache, for LibTorch programs: update(key_states, value_states, layer_idx,
// cache_position) once per layer and step, returning the keys and values to attend over.
//
// How the HF calls map onto the per-step protocol (kvoffload/cache.hpp):
//
//   update(k, v, 0, ...)     ends the previous step if one is open (release of its last layer,
//                            end_step), begin_step(n = k.size(2) for every row of the batch, 0
//                            for the slots past it), acquire(0), append the rows of every
//                            batch row
//   update(k, v, l > 0, ...) release(l - 1) (the caller's attention on l - 1 is enqueued by
//                            now), acquire(l), append
//   get_seq_length(), reset(), end_step()
//                            end (or, for reset, abort) the open step
//
// What update returns, against HF: HF's StaticCache returns its whole [batch, kv_heads,
// max_cache_len, head_dim] buffers, rows past the valid length zero or stale, and relies on an
// attention mask of max_cache_len columns to hide them. This adapter returns only the valid rows:
// [batch, kv_heads, len + n, head_dim], where len is the length before the step and n the rows
// just added, so a mask must have len + n columns; HF's attention functions already cut their
// mask to the key length (mask[..., :key.size(-2)]), so the two agree on every visible position.
// The returned tensors are zero-copy, strided views of the cache's device buffer (strides
// [slot_stride, head_stride, token_stride, 1]; not contiguous): they are valid until the next
// call on this cache, which may release the buffer for reuse. Use them for this layer's
// attention, do not keep them, do not write to them.
//
// Static shapes (the constructor's static_shapes): update returns max_seq rows per batch row
// instead, [batch, kv_heads, max_seq, head_dim], as HF's StaticCache does, so the shapes a
// compiled forward sees never change (torch.compile without recompiling, CUDA graphs). Only the
// valid rows are copied, as without it; the rows past len + n are whatever the buffer holds: zero
// in a buffer never written (device memory starts zeroed) or rows of an earlier layer or step,
// finite either way, never uninitialized memory. The caller's mask hides them (max_seq columns).
//
// Quantized K/V (config.dtype fp8 or int8, kvoffload/quant.hpp): update() quantizes the new rows
// on their device (torch operations with the arithmetic of kvo::quantize_row, to the same bits)
// and appends the quantized rows; what it returns are not views then but new tensors of
// states_dtype, [batch, kv_heads, len + n, head_dim] (strides [(len + n) * kv_heads * head_dim,
// head_dim, kv_heads * head_dim, 1]), dequantized on the device from the staged rows: 2 x batch x
// (len + n) x kv_heads x head_dim x its element size in torch's allocator per update, freed with
// them after the layer's attention. With static shapes they have max_seq rows, the rows past
// len + n zero.
//
// Values may have their own head size (config.v_head_dim, multi-head latent attention): value
// tensors are then [.., v_head_dim] in and out.
//
// Rows of the batch are the cache's first slots and all sit at the same position, as in HF's
// static cache: 1 <= batch <= config.slots, the same batch for every layer of a step; slots past
// the batch sit the step out. Tensors: CPU tensors on the host backend, CUDA tensors of device
// config.device on the CUDA backend, of states_dtype (for f32, f16 and bf16 K/V: float, half,
// bfloat16). On CUDA the work is ordered on the current torch CUDA stream of that device at each
// update; a layer is released on the stream of its own update, so switching streams between
// updates, or before get_seq_length, end_step or reset, is safe.
//
// Errors throw kvo::Error: kInvalidArgument for a wrong dtype, device, shape, layer index or
// position (naming what was expected), kProtocol for updates out of order. A call that throws
// changes nothing. Threading: one thread at a time per cache.
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "kvoffload/kvoffload.hpp"

namespace kvo::torch {

class KVO_API OffloadedStaticCache {
 public:
  // Plans and allocates like kvo::OffloadedStaticCache(config); throws the same errors.
  // states_dtype: the dtype of the keys and values update() takes and returns. For f32, f16 and
  // bf16 K/V it is that dtype (Undefined means so); for quantized K/V (fp8, int8) it is required:
  // float, half or bfloat16, the dtype the model computes in. static_shapes: update returns
  // max_seq rows (above).
  explicit OffloadedStaticCache(const CacheConfig& config,
                                at::ScalarType states_dtype = at::ScalarType::Undefined,
                                bool static_shapes = false);
  // Waits for the work of the last stream used (CUDA), then frees everything. Never throws.
  ~OffloadedStaticCache();
  OffloadedStaticCache(const OffloadedStaticCache&) = delete;
  OffloadedStaticCache& operator=(const OffloadedStaticCache&) = delete;

  // Appends key_states and value_states, each [batch, kv_heads, n, head_dim] (any strides), as
  // rows [len, len + n) of layer `layer_idx`, and returns (keys, values), each
  // [batch, kv_heads, len + n, head_dim] (max_seq rows with static shapes): the rows to attend
  // over (see above).
  // cache_position, when defined: a 1-D integer tensor of the n positions, which must be
  // len, len + 1, ..., len + n - 1 (a CUDA tensor here costs a device sync to read). Undefined:
  // the rows go at len, as in HF's current StaticCache.
  // REQUIRES: layer_idx is 0 or the layer after the previous update's; every layer of a step has
  // the same n >= 1; len + n <= max_seq.
  std::tuple<at::Tensor, at::Tensor> update(const at::Tensor& key_states,
                                            const at::Tensor& value_states, std::int64_t layer_idx,
                                            const at::Tensor& cache_position = at::Tensor());

  // Tokens the cache holds, counting the open step's if layer 0 was updated in it (as HF's
  // get_seq_length counts what layer 0 holds). Ends the open step first when every layer of it
  // was updated.
  std::int64_t get_seq_length();
  std::int64_t get_max_cache_shape() const;
  bool static_shapes() const { return static_shapes_; }
  // Empties every row: aborts an open step, lengths back to 0.
  void reset();
  // Ends the open step (every layer updated): releases the last layer and commits the lengths.
  // Done implicitly by the next step's first update, get_seq_length and reset; call it to
  // commit the step (and write back its rows) before reading the cache another way.
  // REQUIRES: no step open, or every layer of the open step was updated.
  void end_step();

  // The underlying cache, for stats() and the other calls of the C++ API. Do not run the
  // per-step protocol on it while this adapter has a step open.
  kvo::OffloadedStaticCache& cache() { return cache_; }
  const kvo::OffloadedStaticCache& cache() const { return cache_; }

 private:
  void* current_stream() const;
  void check_states(const at::Tensor& states, const char* name, int head_dim,
                    std::int64_t layer_idx) const;
  void check_positions(const at::Tensor& cache_position, std::int64_t length, std::int64_t n) const;

  kvo::OffloadedStaticCache cache_;
  at::Device device_;
  at::ScalarType dtype_;
  bool static_shapes_;
  int layers_;
  int slots_;
  bool in_step_ = false;
  int held_layer_ = -1;                   // acquired and not yet released
  std::int64_t step_tokens_ = 0;          // n of the open step
  int step_batch_ = 0;                    // rows of the open step: slots [0, step_batch_)
  std::vector<std::int32_t> new_tokens_;  // [slots]: step_tokens_ for the batch, 0 past it
  // The stream the held layer was updated on: its rows were appended there and its attention
  // follows there, so its release (the write-back and the buffer's reuse wait on it) is recorded
  // there too, whatever stream is current when the release happens.
  void* held_stream_ = nullptr;
  void* last_stream_ = nullptr;
};

}  // namespace kvo::torch
