/* Prints the layout of the C ABI's structs as this compiler lays them out: one line per field,
 * "struct field offset size", then "struct sizeof N". tests/capi/ctypes_layout.py compares the
 * Python package's ctypes mirrors (kvoffload/_capi.py) with it, field by field. */
#include <stddef.h>
#include <stdio.h>

#include "kvoffload/kvoffload.h"

#define FIELD(type, name) \
  printf("%s %s %zu %zu\n", #type, #name, offsetof(type, name), sizeof(((type*)0)->name))
#define SIZE(type) printf("%s sizeof %zu\n", #type, sizeof(type))

int main(void) {
  FIELD(kvo_cache_options, struct_size);
  FIELD(kvo_cache_options, layers);
  FIELD(kvo_cache_options, kv_heads);
  FIELD(kvo_cache_options, head_dim);
  FIELD(kvo_cache_options, max_seq);
  FIELD(kvo_cache_options, slots);
  FIELD(kvo_cache_options, dtype);
  FIELD(kvo_cache_options, resident_layers);
  FIELD(kvo_cache_options, ring_depth);
  FIELD(kvo_cache_options, device_budget);
  FIELD(kvo_cache_options, backend);
  FIELD(kvo_cache_options, device);
  FIELD(kvo_cache_options, host_max_delay_us);
  FIELD(kvo_cache_options, host_delay_seed);
  FIELD(kvo_cache_options, v_head_dim);
  FIELD(kvo_cache_options, layer_windows);
  FIELD(kvo_cache_options, max_append);
  FIELD(kvo_cache_options, split_mode);
  FIELD(kvo_cache_options, split_rows);
  FIELD(kvo_cache_options, split_h2d_bytes_per_s);
  FIELD(kvo_cache_options, split_host_bytes_per_s);
  FIELD(kvo_cache_options, kv_head_begin);
  FIELD(kvo_cache_options, model_kv_heads);
  FIELD(kvo_cache_options, ranks_per_node);
  FIELD(kvo_cache_options, node_available_bytes);
  SIZE(kvo_cache_options);

  FIELD(kvo_layer_view, struct_size);
  FIELD(kvo_layer_view, layer);
  FIELD(kvo_layer_view, resident);
  FIELD(kvo_layer_view, k);
  FIELD(kvo_layer_view, v);
  FIELD(kvo_layer_view, slot_stride);
  FIELD(kvo_layer_view, token_stride);
  FIELD(kvo_layer_view, head_stride);
  FIELD(kvo_layer_view, slots);
  FIELD(kvo_layer_view, max_seq);
  FIELD(kvo_layer_view, kv_heads);
  FIELD(kvo_layer_view, head_dim);
  FIELD(kvo_layer_view, dtype);
  FIELD(kvo_layer_view, lengths);
  FIELD(kvo_layer_view, new_tokens);
  FIELD(kvo_layer_view, v_slot_stride);
  FIELD(kvo_layer_view, v_token_stride);
  FIELD(kvo_layer_view, v_head_stride);
  FIELD(kvo_layer_view, v_head_dim);
  FIELD(kvo_layer_view, k_scale_offset);
  FIELD(kvo_layer_view, v_scale_offset);
  FIELD(kvo_layer_view, window);
  FIELD(kvo_layer_view, first_positions);
  FIELD(kvo_layer_view, split_rows);
  FIELD(kvo_layer_view, host_k);
  FIELD(kvo_layer_view, host_v);
  SIZE(kvo_layer_view);

  FIELD(kvo_cache_stats, struct_size);
  FIELD(kvo_cache_stats, steps);
  FIELD(kvo_cache_stats, h2d_bytes_total);
  FIELD(kvo_cache_stats, d2h_bytes_total);
  FIELD(kvo_cache_stats, h2d_bytes_last_step);
  FIELD(kvo_cache_stats, d2h_bytes_last_step);
  FIELD(kvo_cache_stats, acquire_wait_s);
  FIELD(kvo_cache_stats, prefetch_reissues);
  FIELD(kvo_cache_stats, device_allocations);
  FIELD(kvo_cache_stats, resident_layers);
  FIELD(kvo_cache_stats, streamed_layers);
  FIELD(kvo_cache_stats, ring_depth);
  FIELD(kvo_cache_stats, row_bytes);
  FIELD(kvo_cache_stats, layer_bytes);
  FIELD(kvo_cache_stats, resident_bytes);
  FIELD(kvo_cache_stats, staging_bytes);
  FIELD(kvo_cache_stats, device_bytes);
  FIELD(kvo_cache_stats, host_bytes);
  FIELD(kvo_cache_stats, budget);
  FIELD(kvo_cache_stats, v_row_bytes);
  FIELD(kvo_cache_stats, reorder_bytes);
  FIELD(kvo_cache_stats, window_layers);
  FIELD(kvo_cache_stats, window_bytes);
  FIELD(kvo_cache_stats, split_h2d_bytes_per_s);
  FIELD(kvo_cache_stats, split_host_bytes_per_s);
  FIELD(kvo_cache_stats, kv_head_begin);
  FIELD(kvo_cache_stats, model_kv_heads);
  FIELD(kvo_cache_stats, ranks_per_node);
  FIELD(kvo_cache_stats, host_share_bytes);
  FIELD(kvo_cache_stats, layers);
  FIELD(kvo_cache_stats, tensor_bytes);
  FIELD(kvo_cache_stats, reserved_bytes);
  SIZE(kvo_cache_stats);

  FIELD(kvo_saved_context_info, struct_size);
  FIELD(kvo_saved_context_info, layers);
  FIELD(kvo_saved_context_info, kv_heads);
  FIELD(kvo_saved_context_info, head_dim);
  FIELD(kvo_saved_context_info, v_head_dim);
  FIELD(kvo_saved_context_info, max_seq);
  FIELD(kvo_saved_context_info, dtype);
  FIELD(kvo_saved_context_info, records);
  SIZE(kvo_saved_context_info);
  return 0;
}
