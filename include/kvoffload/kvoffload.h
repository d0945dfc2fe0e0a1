/* kvoffload's C ABI: an offloaded static K/V cache that any engine with a C FFI can drive without
 * our C++ types or our build. Compiles as C99 and as C++.
 *
 * The per-step protocol is the one of kvo::OffloadedStaticCache (kvoffload/cache.hpp):
 *
 *   kvo_begin_step(cache, n, slots);            n[s] >= 0 new tokens for each slot s
 *   for (layer = 0; layer < layers; ++layer) {
 *     kvo_acquire(cache, layer, &view, stream); stream waits until the layer's prefix is there
 *     kvo_append(cache, layer, s, k, v, count, stream);   once or more per slot, until the
 *                                                         counts add up to n[s]
 *     ... attention over rows [0, view.lengths[s] + view.new_tokens[s]) on `stream` ...
 *     kvo_release(cache, layer, stream);        the caller's work on this layer is enqueued
 *   }
 *   kvo_end_step(cache);                        lengths[s] += n[s]
 *
 * Conventions:
 * - Every call that can fail returns a kvo_status; on anything but KVO_OK, kvo_last_error(cache)
 *   gives the message. A failed call changes nothing: the cache stays usable, and a step that
 *   was open stays open (kvo_abort_step ends it without committing).
 * - No C++ exception crosses this boundary.
 * - A stream is a `void*`, passed last: a cudaStream_t on the CUDA backend (NULL is the legacy
 *   default stream); on the host backend NULL (the calling thread, synchronous) or a stream made
 *   by kvo_stream_create.
 * - One thread at a time calls into one cache. Different caches are independent.
 * - "Device" memory is GPU memory on the CUDA backend and host memory on the host backend.
 *
 * Layout of K and V (NHD per slot): [slot][token][kv_head][head_dim]; a slot's valid prefix
 * [0, length) is contiguous. Strides in views are in elements, never bytes.
 *
 * Growing without breaking: kvo_cache_options, kvo_layer_view and kvo_cache_stats begin with
 * `struct_size`, the size of the struct as the caller was compiled. The caller sets it (sizeof)
 * before handing the struct over; the library reads and writes only the fields that fit, gives
 * options it was not told their defaults, and never writes past struct_size. New fields are only
 * ever appended (each says "Since x.y"), and numeric values of enums never change, so a program
 * built against an older header runs against any newer library of the same major version
 * (libkvoffload.so.0).
 */
#ifndef KVOFFLOAD_KVOFFLOAD_H_
#define KVOFFLOAD_KVOFFLOAD_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kvoffload/api.h"

/* Opaque handle to one cache. Made by kvo_cache_create, freed by kvo_cache_destroy. */
typedef struct kvo_cache kvo_cache_t;

/* What a call returned. The numeric values are part of the ABI and never change. */
typedef enum kvo_status {
  KVO_OK = 0,
  /* A bad shape, dtype, size, slot, layer, count or position, or a NULL where a pointer is
   * required. Nothing changed. */
  KVO_ERROR_INVALID_ARGUMENT = 1,
  /* A call out of the per-step order (append without acquire, reset_slot inside a step, ...).
   * Nothing changed. */
  KVO_ERROR_PROTOCOL = 2,
  /* The plan does not fit the device budget (the message names the missing bytes), or an
   * allocation failed (the message names its size). */
  KVO_ERROR_OUT_OF_MEMORY = 3,
  /* A CUDA runtime call failed, or a CUDA backend was asked for where none is usable. */
  KVO_ERROR_DEVICE = 4,
  /* A broken invariant inside the library; please report it with the message. */
  KVO_ERROR_INTERNAL = 5
} kvo_status;

/* Storage type of K and V. The cache moves bytes and never converts.
 * Since 0.2, two quantized dtypes: a row (one token of every kv head) holds kv_heads x head_dim
 * one-byte elements in the usual order, then, from byte kvo_view.k_scale_offset (the element
 * bytes rounded up to 4), kv_heads float scales; element e of head h reads as
 * decode(byte) * scale[h]. FP8_E4M3: OCP E4M3 ("e4m3fn", largest finite 448), scale = max|x| /
 * 448; INT8: a signed byte in [-127, 127], scale = max|x| / 127. kvo_quantize_rows writes them,
 * kvo_dequantize_rows reads them; kvoffload/quant.hpp is the same arithmetic for C++ and CUDA. */
typedef enum kvo_dtype {
  KVO_DTYPE_F32 = 0,
  KVO_DTYPE_F16 = 1,
  KVO_DTYPE_BF16 = 2,
  KVO_DTYPE_FP8_E4M3 = 3,
  KVO_DTYPE_INT8 = 4
} kvo_dtype;

/* Where "device" memory lives. AUTO: CUDA when a GPU is usable and the library was built with
 * CUDA, else HOST. HOST runs the whole runtime on worker threads over host memory, no GPU. */
typedef enum kvo_backend {
  KVO_BACKEND_AUTO = 0,
  KVO_BACKEND_CUDA = 1,
  KVO_BACKEND_HOST = 2
} kvo_backend;

/* New in 0.3: split attention at decode (kvo_cache_options.split_mode). */
typedef enum kvo_split_mode {
  KVO_SPLIT_OFF = 0,
  KVO_SPLIT_AUTO = 1, /* the split row from the two rates (measured when the cache is made) */
  KVO_SPLIT_ROWS = 2  /* min(split_rows, length) rows */
} kvo_split_mode;

/* kvo_cache_options.resident_layers: as many layers resident as the device budget holds. */
#define KVO_AUTO_RESIDENT_LAYERS (-1)

/* Everything a cache is built from. Start from kvo_cache_options_init(&options, sizeof options)
 * and change what differs, so that fields added in later versions keep their defaults. */
typedef struct kvo_cache_options {
  uint32_t struct_size; /* sizeof(kvo_cache_options) as the caller was compiled */
  /* Shape: K and V are each [layers][slots][max_seq][kv_heads][head_dim]. */
  int32_t layers;   /* default 32 */
  int32_t kv_heads; /* default 8 */
  int32_t head_dim; /* default 128 */
  int32_t max_seq;  /* tokens per slot, statically allocated; default 4096 */
  int32_t slots;    /* sequences decoded together (the batch); default 1 */
  kvo_dtype dtype;  /* default KVO_DTYPE_BF16 */
  /* Layers [0, resident_layers) stay whole on the device; the rest stream through ring_depth
   * staging buffers. Default KVO_AUTO_RESIDENT_LAYERS; ring_depth default 2. */
  int32_t resident_layers;
  int32_t ring_depth;
  /* Device bytes the whole plan must fit. 0 (default): on CUDA the device's free memory at
   * creation less a headroom of max(1 GiB, 5% of its memory) for cuBLAS, kernel modules and the
   * caller's tensors; on the host backend unlimited. */
  uint64_t device_budget;
  kvo_backend backend; /* default KVO_BACKEND_AUTO */
  int32_t device;      /* CUDA device ordinal; default 0 */
  /* Host backend only, for tests: each copy first sleeps a random 0..host_max_delay_us
   * microseconds (seeded by host_delay_seed), so that a missing ordering shows up as wrong data.
   * Default 0 (off). */
  uint32_t host_max_delay_us;
  uint64_t host_delay_seed;
  /* Since 0.2: V's head_dim when it differs from K's (multi-head latent attention caches a wide K
   * and a narrow V); 0 (default): head_dim. */
  int32_t v_head_dim;
  /* Since 0.3: sliding-window layers (Gemma's local layers, Mistral's). NULL (default): every
   * layer is full. Else `layers` entries, read at kvo_cache_create only: the keys layer l's
   * attention sees (the last N, its own included), 0 for a full layer. A layer whose window
   * buffer, (N - 1) + max_append + ceil((N - 1) / 8) rows in whole 64s, is shorter than max_seq
   * is kept as a window: those rows per slot on the device, resident, never stored on the host,
   * streamed or written back; its views say which position each row holds (first_positions).
   * At least one layer must stay full. Saving a slot of such a cache is refused. */
  const int32_t* layer_windows;
  /* Since 0.3: the most rows one kvo_append gives a slot of a window layer (a prefill chunk);
   * required (>= 1) with layer_windows. */
  int32_t max_append;
  /* Since 0.3: split attention at decode (kvo::CacheConfig::split). A slot that appends one row
   * in a step leaves rows [0, s) of each streamed layer in the host store (its views' host_k and
   * host_v) and gets [s, length) on the device; attend both, merge by log-sum-exp. KVO_SPLIT_AUTO
   * picks s = length * host / (host + h2d) in whole 64s, a rate of 0 measured when the cache is
   * made; KVO_SPLIT_ROWS takes split_rows. kvo_begin_step_split gives the rows per step. */
  kvo_split_mode split_mode;
  int32_t split_rows;
  double split_h2d_bytes_per_s;
  double split_host_bytes_per_s;
  /* Since 0.3: one rank of a tensor-parallel engine, which shards attention by KV heads
   * (kvo::CacheConfig::shard). The cache holds the model's KV heads [kv_head_begin, kv_head_begin
   * + kv_heads) of model_kv_heads; 0 (default): kv_heads, the whole model. A saved context records
   * the range and loading another range is refused. ranks_per_node: the processes of this node
   * sharing its host memory (0 or 1, the default: one); the pinned store is checked against the
   * node's available memory / ranks_per_node, that memory being node_available_bytes where the
   * ranks measured it together before any allocated (0, the default: measured at creation, when
   * the stores of ranks created earlier count as taken). */
  int32_t kv_head_begin;
  int32_t model_kv_heads;
  int32_t ranks_per_node;
  uint64_t node_available_bytes;
} kvo_cache_options;

/* A non-owning view of one layer's K and V in device memory, valid from kvo_acquire until
 * kvo_release of that layer (or kvo_abort_step). Row (slot s, token t) of K starts at element
 * s * slot_stride + t * token_stride of `k`; head h of that row at + h * head_stride. V the same
 * with its v_ strides (equal to K's unless v_head_dim differs). */
typedef struct kvo_layer_view {
  uint32_t struct_size; /* set by the caller: sizeof(kvo_layer_view) as it was compiled */
  int32_t layer;
  int32_t resident;     /* 1 when the layer is kept whole on the device (no copies), else 0 */
  void* k;              /* [slots][max_seq][kv_heads][head_dim] */
  void* v;              /* [slots][max_seq][kv_heads][v_head_dim], with the v_ strides below */
  int64_t slot_stride;  /* elements */
  int64_t token_stride; /* elements */
  int64_t head_stride;  /* elements */
  int32_t slots;
  int32_t max_seq;
  int32_t kv_heads;
  int32_t head_dim;
  kvo_dtype dtype;
  /* Host arrays of `slots` entries, owned by the cache, valid until kvo_end_step or
   * kvo_abort_step: rows valid before this step, and rows this step appends. */
  const int32_t* lengths;
  const int32_t* new_tokens;
  /* Since 0.2: V's own strides (elements) and head_dim. */
  int64_t v_slot_stride;
  int64_t v_token_stride;
  int64_t v_head_stride;
  int32_t v_head_dim;
  /* Quantized dtypes: where a K row's, and a V row's, kv_heads float scales start, in bytes from
   * the row's first byte (elements are bytes, so rows start at the strides above); else 0. */
  int64_t k_scale_offset;
  int64_t v_scale_offset;
  /* Since 0.3: a window layer's window (keys) and, per slot, the position its row 0 holds (a
   * host array owned by the cache, valid as `lengths`): rows are in position order, max_seq of
   * them per slot, and the append's rows follow the window - 1 before them. A full layer: 0 and
   * NULL (row t holds position t). */
  int32_t window;
  const int32_t* first_positions;
  /* Since 0.3: split attention: a streamed layer of a step that splits holds, for slot s, only
   * rows [split_rows[s], lengths[s] + new_tokens[s]) in k and v; rows before are in host memory
   * at host_k and host_v (the same strides), readable by the host once kvo_acquire returns. All
   * NULL when the layer does not split this step. */
  const int32_t* split_rows;
  const void* host_k;
  const void* host_v;
} kvo_layer_view;

/* The figures of kvo::CacheStats: traffic counters and the device plan. Bytes are exact. */
typedef struct kvo_cache_stats {
  uint32_t struct_size;         /* set by the caller: sizeof(kvo_cache_stats) as it was compiled */
  uint64_t steps;               /* committed by kvo_end_step */
  uint64_t h2d_bytes_total;     /* prefetched prefixes */
  uint64_t d2h_bytes_total;     /* written-back new rows */
  uint64_t h2d_bytes_last_step; /* prefetches made for the last committed step */
  uint64_t d2h_bytes_last_step; /* write-backs of the last committed step */
  double acquire_wait_s;        /* time acquire's waits held the caller's stream */
  uint64_t prefetch_reissues;   /* prefetches discarded by kvo_abort_step */
  uint64_t device_allocations;  /* device allocations made; fixed after creation */
  /* The plan the cache was allocated by. */
  int32_t resident_layers; /* effective: equals layers when nothing is streamed */
  int32_t streamed_layers;
  int32_t ring_depth;      /* staging buffers allocated (0 when nothing is streamed) */
  uint64_t row_bytes;      /* one token of K: kv_heads * head_dim * element size (+ scales) */
  uint64_t layer_bytes;    /* K and V of one layer, all slots, max_seq rows */
  uint64_t resident_bytes; /* device bytes of the resident layers */
  uint64_t staging_bytes;  /* device bytes of the staging ring */
  uint64_t device_bytes;   /* every device byte the cache allocated */
  uint64_t host_bytes;     /* pinned host store */
  uint64_t budget;         /* the budget the plan was made against (0: none) */
  /* Since 0.2: one token of V (differs from row_bytes when v_head_dim does). */
  uint64_t v_row_bytes;
  /* rows written by kvo_reorder_slots (K and V, every layer) */
  uint64_t reorder_bytes;
  /* Since 0.3: layers kept as windows (neither resident nor streamed) and their device bytes,
   * within device_bytes. */
  int32_t window_layers;
  uint64_t window_bytes;
  /* Since 0.3: the rates split attention is planned by (given, or measured when the cache was
   * made), bytes per second; 0 without KVO_SPLIT_AUTO. */
  double split_h2d_bytes_per_s;
  double split_host_bytes_per_s;
  /* Since 0.3: the KV heads held, [kv_head_begin, kv_head_begin + kv_heads) of model_kv_heads,
   * and the host bytes the store was checked against (this rank's share of the node's). */
  int32_t kv_head_begin;
  int32_t model_kv_heads;
  int32_t ranks_per_node;
  uint64_t host_share_bytes;
  /* Since 0.4: the layers of the plan, one layer's K (or V) bytes, and the device bytes the plan
   * leaves to the caller's own buffers (reserved regions). */
  int32_t layers;
  uint64_t tensor_bytes;
  uint64_t reserved_bytes;
} kvo_cache_stats;

/* New in 0.4: what a saved-context file holds, from its headers alone (kvo_inspect_saved_context).
 * A file holds one record per saved slot, all of one shape. */
typedef struct kvo_saved_context_info {
  uint32_t struct_size; /* set by the caller: sizeof(kvo_saved_context_info) as it was compiled */
  int32_t layers;
  int32_t kv_heads;
  int32_t head_dim;
  int32_t v_head_dim; /* head_dim when V rows are the size of K rows */
  int32_t max_seq;
  kvo_dtype dtype;
  int32_t records; /* saved slots */
} kvo_saved_context_info;

/* New in 0.4: an incremental digest (kvo_bytes_digest_create) and a model's weights' digest
 * (kvo_weights_digest_create); both opaque. */
typedef struct kvo_bytes_digest kvo_bytes_digest_t;
typedef struct kvo_weights_digest kvo_weights_digest_t;

/* ---- library -------------------------------------------------------------------------------- */

/* "MAJOR.MINOR.PATCH" of the linked library. Static storage; never NULL. */
KVO_API const char* kvo_version(void);

/* New in 0.2: bytes of one row of kv_heads heads of `dim` elements of `dtype` (with the scales of a
 * quantized dtype). */
KVO_API kvo_status kvo_row_bytes(kvo_dtype dtype, int32_t kv_heads, int32_t dim,
                                 uint64_t* out_bytes);

/* New in 0.2: `rows` rows of src [rows][kv_heads][dim] (float, host memory) written to dst as
 * quantized rows of kvo_row_bytes each, for kvo_append to a FP8_E4M3 or INT8 cache; and back. */
KVO_API kvo_status kvo_quantize_rows(kvo_dtype dtype, int32_t kv_heads, int32_t dim,
                                     const float* src, int64_t rows, void* dst);
KVO_API kvo_status kvo_dequantize_rows(kvo_dtype dtype, int32_t kv_heads, int32_t dim,
                                       const void* src, int64_t rows, float* dst);

/* A short constant name for a status ("ok", "invalid argument", ...). Static storage. */
KVO_API const char* kvo_status_name(kvo_status status);

/* Number of usable CUDA devices in *out_count: 0 when built without CUDA or without a driver.
 * REQUIRES: out_count != NULL. */
KVO_API kvo_status kvo_cuda_device_count(int32_t* out_count);

/* The message of the last failed call on `cache`, or "" when none failed. With cache == NULL:
 * the message of the last failed call on this thread that had no cache to keep it in
 * (kvo_cache_create, or any call passed a NULL cache). Successful calls do not clear it.
 * The string is owned by the cache (or the thread) and valid until the next failing call on it,
 * or kvo_cache_destroy. Never NULL. */
KVO_API const char* kvo_last_error(const kvo_cache_t* cache);

/* ---- sizes, plans and memory (since 0.4) ---------------------------------------------------- */

/* Text results of the calls below are written to `buffer`, `capacity` bytes with the final NUL,
 * cut to fit; *out_length gets the whole text's length (without the NUL), so a caller whose
 * capacity was not more than *out_length calls again with *out_length + 1 bytes. `buffer` may be
 * NULL when capacity is 0. Calls without a cache report failures through kvo_last_error(NULL). */

/* Bytes in a size such as "24GiB", "512MiB", "1.5GB" or "4096" (kvo::parse_size). */
KVO_API kvo_status kvo_parse_size(const char* text, uint64_t* out_bytes);

/* `bytes` in the text the library prints ("1.50 GiB"). */
KVO_API kvo_status kvo_format_bytes(uint64_t bytes, char* buffer, size_t capacity,
                                    size_t* out_length);

/* What this machine can give a pinned store now (KVO_HOST_MEMORY when set). */
KVO_API kvo_status kvo_host_available_bytes(uint64_t* out_bytes);

/* The budget a CUDA cache made with device_budget 0 takes, given its device's free and total
 * bytes: free less a headroom of max(1 GiB, 5% of total); 0 when nothing is left. */
KVO_API kvo_status kvo_default_device_budget(uint64_t free_bytes, uint64_t total_bytes,
                                             uint64_t* out_budget);

/* The plan kvo_cache_create would make of `options` under their device_budget (0: unlimited),
 * allocating nothing: the plan fields of *out_plan are set, the counters are 0. Refused as
 * kvo_cache_create refuses (a plan that does not fit names the missing bytes).
 * REQUIRES: options and out_plan != NULL, their struct_size set. */
KVO_API kvo_status kvo_plan(const kvo_cache_options* options, kvo_cache_stats* out_plan);

/* ---- saved contexts without a cache, and fingerprints (since 0.4) -------------------------- */

/* The shape of the saved context in `path` and its records' lengths (the first
 * min(records, lengths_capacity) of them go to `lengths`, which may be NULL when the capacity is
 * 0). Refused, naming why, for a file that cannot be read or is not a saved context. */
KVO_API kvo_status kvo_inspect_saved_context(const char* path, kvo_saved_context_info* out_info,
                                             int32_t* lengths, int32_t lengths_capacity);

/* The model fingerprint saved with record `record` of `path` (text result, above). */
KVO_API kvo_status kvo_saved_context_model(const char* path, int32_t record, char* buffer,
                                           size_t capacity, size_t* out_length);

/* A finite number in a fingerprint's canonical text (kvoffload/fingerprint.hpp): integral values
 * below 2^53 as integers, others as the shortest decimal that reads back, as Python's repr. */
KVO_API kvo_status kvo_fingerprint_number(double value, char* buffer, size_t capacity,
                                          size_t* out_length);

/* The fingerprint of `count` fields keys[i] = values[i] (each key printable ASCII without '=';
 * a key given twice keeps its last value): the format's first line, then the fields sorted. */
KVO_API kvo_status kvo_fingerprint_text(const char* const* keys, const char* const* values,
                                        int32_t count, char* buffer, size_t capacity,
                                        size_t* out_length);

/* The digest (32 hex digits) of `bytes` bytes at host address `data`, hashed on the cores this
 * process may use; the same as bytes fed to a kvo_bytes_digest in any pieces. */
KVO_API kvo_status kvo_digest_bytes(const void* data, uint64_t bytes, char* buffer, size_t capacity,
                                    size_t* out_length);

/* The same digest of bytes fed in pieces, in order. Destroy frees it (NULL is a no-op). */
KVO_API kvo_status kvo_bytes_digest_create(kvo_bytes_digest_t** out_digest);
KVO_API kvo_status kvo_bytes_digest_update(kvo_bytes_digest_t* digest, const void* data,
                                           uint64_t bytes);
KVO_API kvo_status kvo_bytes_digest_hex(const kvo_bytes_digest_t* digest, char* buffer,
                                        size_t capacity, size_t* out_length);
KVO_API void kvo_bytes_digest_destroy(kvo_bytes_digest_t* digest);

/* A model's weights' digest: each tensor's name, dtype name, shape and bytes' digest (above),
 * added in any order (a name added twice is refused); hex gives 32 hex digits. */
KVO_API kvo_status kvo_weights_digest_create(kvo_weights_digest_t** out_digest);
KVO_API kvo_status kvo_weights_digest_add(kvo_weights_digest_t* digest, const char* name,
                                          const char* dtype, const int64_t* shape, int32_t ndim,
                                          const char* bytes_digest);
KVO_API kvo_status kvo_weights_digest_hex(const kvo_weights_digest_t* digest, char* buffer,
                                          size_t capacity, size_t* out_length);
KVO_API void kvo_weights_digest_destroy(kvo_weights_digest_t* digest);

/* The digest of the tokenizer files in directory `dir` (tokenizer.json, tokenizer.model,
 * tokenizer_config.json, chat_template.jinja); "" when it holds none of them. */
KVO_API kvo_status kvo_tokenizer_digest(const char* dir, char* buffer, size_t capacity,
                                        size_t* out_length);

/* ---- create and destroy --------------------------------------------------------------------- */

/* Fills *options with the defaults (a Llama-3-8B-shaped cache of 4096 tokens, one slot, bf16,
 * auto backend) for the fields that fit in struct_size, and sets options->struct_size:
 *   kvo_cache_options options;
 *   kvo_cache_options_init(&options, sizeof options);
 * REQUIRES: options != NULL; struct_size is sizeof(kvo_cache_options) as the caller was compiled
 * (at least that of 0.2, the first version with struct_size). A struct_size larger than this
 * library's struct (a program built against a newer header) is refused with
 * KVO_ERROR_INVALID_ARGUMENT and nothing is written: this library cannot know the newer defaults.
 */
KVO_API kvo_status kvo_cache_options_init(kvo_cache_options* options, uint32_t struct_size);

/* Plans and allocates every device and host byte, and starts the copy streams. On KVO_OK,
 * *out_cache is a new cache that the caller owns and frees with kvo_cache_destroy; on failure it
 * is set to NULL and kvo_last_error(NULL) says why. `options` is only read during the call; fields
 * past its struct_size take their defaults, and fields this library does not know must be zero.
 * REQUIRES: options != NULL (its struct_size set, as kvo_cache_options_init does),
 * out_cache != NULL. */
KVO_API kvo_status kvo_cache_create(const kvo_cache_options* options, kvo_cache_t** out_cache);

/* Waits for the cache's in-flight copies, then frees everything it owns; views and the message
 * of kvo_last_error die with it. Streams made by kvo_stream_create must be destroyed first.
 * REQUIRES: no work the caller enqueued still reads a view. NULL is a no-op. Never fails.
 * Undefined (as free() twice is): destroying a cache twice, or any call on a destroyed cache. */
KVO_API void kvo_cache_destroy(kvo_cache_t* cache);

/* The backend the cache runs on (KVO_BACKEND_AUTO resolved). REQUIRES: out_backend != NULL. */
KVO_API kvo_status kvo_cache_backend(const kvo_cache_t* cache, kvo_backend* out_backend);

/* ---- the per-step protocol ------------------------------------------------------------------ */

/* Opens a step that appends new_tokens[s] rows to each slot s. The array is copied.
 * REQUIRES: no step open; count == slots (checked before the array is read, so a wrong count is
 * refused without reading past what it says); new_tokens[s] >= 0;
 * kvo_length(s) + new_tokens[s] <= max_seq. */
KVO_API kvo_status kvo_begin_step(kvo_cache_t* cache, const int32_t* new_tokens, int32_t count);

/* New in 0.3: as kvo_begin_step, with each slot's split row for split attention given: the step
 * prefetches rows [split_rows[s], length) of each streamed layer, and the views say so. Both
 * arrays are copied.
 * REQUIRES: as kvo_begin_step; 0 <= split_rows[s] <= kvo_length(s); split_rows[s] == 0 unless
 * new_tokens[s] == 1. */
KVO_API kvo_status kvo_begin_step_split(kvo_cache_t* cache, const int32_t* new_tokens,
                                        const int32_t* split_rows, int32_t count);

/* Makes `stream` wait (an event, not a host wait, on CUDA) until layer `layer`'s valid prefix is
 * on the device, and fills *out_view. The view is valid until kvo_release of this layer.
 * REQUIRES: a step is open; `layer` is the step's next layer (0, 1, ...); no layer is held;
 * out_view != NULL with out_view->struct_size set. */
KVO_API kvo_status kvo_acquire(kvo_cache_t* cache, int32_t layer, kvo_layer_view* out_view,
                               void* stream);

/* Copies `count` rows of K and of V for `slot`, each [count][kv_heads][head_dim] contiguous in
 * device memory, to the slot's next free rows of the held layer, ordered on `stream`. The
 * caller keeps ownership of k_rows and v_rows; they must stay valid until `stream` has executed
 * the copy. count == 0 is a no-op (the pointers may then be NULL).
 * REQUIRES: `layer` is held; count >= 0; rows appended to `slot` in this layer, this call's
 * included, stay <= new_tokens[slot] (counted without overflow: any count past it is refused). */
KVO_API kvo_status kvo_append(kvo_cache_t* cache, int32_t layer, int32_t slot, const void* k_rows,
                              const void* v_rows, int32_t count, void* stream);

/* Records that the caller's work on the held layer is enqueued on `stream`; the buffer is
 * written back and reused only after `stream` passes this point. The view becomes invalid.
 * REQUIRES: `layer` is held and every slot has all its new_tokens appended. */
KVO_API kvo_status kvo_release(kvo_cache_t* cache, int32_t layer, void* stream);

/* Commits the step: lengths[s] += new_tokens[s].
 * REQUIRES: a step is open and every layer was released. */
KVO_API kvo_status kvo_end_step(kvo_cache_t* cache);

/* Ends an open step without committing it: lengths stay as they were, the held layer (if any)
 * is given back once `stream` passes this call. Waits on the host for the cache's copies.
 * REQUIRES: a step is open. */
KVO_API kvo_status kvo_abort_step(kvo_cache_t* cache, void* stream);

/* ---- between steps -------------------------------------------------------------------------- */

/* Sets a slot's length to 0. REQUIRES: no step open; 0 <= slot < slots. */
KVO_API kvo_status kvo_reset_slot(kvo_cache_t* cache, int32_t slot);

/* Drops the slot's rows [length, kvo_length(slot)).
 * REQUIRES: no step open; 0 <= slot < slots; 0 <= length <= kvo_length(slot). */
KVO_API kvo_status kvo_truncate_slot(kvo_cache_t* cache, int32_t slot, int32_t length);

/* New in 0.2: slot s takes the rows and length slot source[s] held (beam search's reorder; any
 * mapping, cycles and repeats included). REQUIRES: no step open; source != NULL; count == slots;
 * 0 <= source[s] < slots. Nothing changes on an error. */
KVO_API kvo_status kvo_reorder_slots(kvo_cache_t* cache, const int32_t* source, int32_t count);

/* The slot's committed length in *out_length. REQUIRES: 0 <= slot < slots; out_length != NULL. */
KVO_API kvo_status kvo_length(const kvo_cache_t* cache, int32_t slot, int32_t* out_length);

/* ---- saved contexts (between steps) -------------------------------------------------------- */

/* Writes the slot's rows of every layer, its length, `token_count` token ids (0, or one per
 * row; `tokens` may be NULL when 0) and `model` (the caller's fingerprint of the model, "key=value"
 * lines; NULL is "") to `path`, atomically: a temporary file beside it, synced, then renamed.
 * Each layer's rows carry an XXH3 checksum. Waits first for every copy in flight and the work on
 * the callers' streams. REQUIRES: no step open; 0 <= slot < slots; path != NULL. */
KVO_API kvo_status kvo_save_slot(kvo_cache_t* cache, int32_t slot, const char* path,
                                 const int32_t* tokens, int32_t token_count, const char* model);

/* Replaces the slot's rows and length with the context saved in `path`, without a prefill.
 * *out_token_count gets the number of token ids saved with it, and the first
 * min(count, tokens_capacity) of them go to `tokens` (which may be NULL when tokens_capacity is
 * 0). Refused with KVO_ERROR_INVALID_ARGUMENT, the cache left as it was, when the file was saved
 * from another shape, dtype, max_seq or `model` fingerprint (the message names the difference),
 * or is truncated or corrupted (the message names the failing layer block).
 * REQUIRES: no step open; 0 <= slot < slots; path != NULL; out_token_count != NULL. */
KVO_API kvo_status kvo_load_slot(kvo_cache_t* cache, int32_t slot, const char* path,
                                 const char* model, int32_t* tokens, int32_t tokens_capacity,
                                 int32_t* out_token_count);

/* New in 0.4: the slots slots[0..count) of the cache, in that order, to one file (kvo_save_slot
 * for several slots: record i holds slot slots[i]). token_counts: NULL (no token ids), or one
 * count per slot (0, or the slot's length), the ids of every slot one after another in
 * `tokens`. REQUIRES: as kvo_save_slot; count >= 1; the slots distinct. */
KVO_API kvo_status kvo_save_slots(kvo_cache_t* cache, const int32_t* slots, int32_t count,
                                  const char* path, const int32_t* tokens,
                                  const int32_t* token_counts, const char* model);

/* New in 0.4: record i of `path` into slot slots[i], for every record (count must equal the
 * file's records); refused as kvo_load_slot, with the cache left as it was. Each record's token
 * ids go to `tokens`, one record after another, out_token_counts[i] of them: refused before
 * anything is loaded when they would pass tokens_capacity (max_seq * count is always enough).
 * REQUIRES: no step open; out_token_counts holds count entries. */
KVO_API kvo_status kvo_load_slots(kvo_cache_t* cache, const int32_t* slots, int32_t count,
                                  const char* path, const char* model, int32_t* tokens,
                                  int64_t tokens_capacity, int32_t* out_token_counts);

/* Copies the counters and the plan into *out_stats.
 * REQUIRES: out_stats != NULL with out_stats->struct_size set. */
KVO_API kvo_status kvo_stats(const kvo_cache_t* cache, kvo_cache_stats* out_stats);

/* ---- split attention's host part (since 0.5) ------------------------------------------------ */

/* Decode attention over the rows a split view leaves in host memory (kvo_layer_view.host_k and
 * host_v), in place, on threads of its own: what a caller attends there while the device attends
 * the rows past the split, the two merged by their log-sum-exp. Opaque; one call at a time on
 * each. Its calls report failures through kvo_last_error(NULL). */
typedef struct kvo_host_attention kvo_host_attention_t;

/* New in 0.5: an attention for rows of `dtype` with kv_heads heads of head_dim (K and V alike)
 * and `heads` query heads (a multiple of kv_heads, a GQA group per kv head), at most max_rows
 * query rows a call, on `threads` threads (0: every core this process may use). Scores are
 * q . k * scale (scale 0: 1 / sqrt(head_dim)), then softcap * tanh(score / softcap) where
 * softcap > 0. Destroy frees it (NULL is a no-op).
 * REQUIRES: out_attention != NULL; heads, kv_heads, head_dim, max_rows >= 1; threads >= 0;
 * scale and softcap finite, softcap >= 0. */
KVO_API kvo_status kvo_host_attention_create(int32_t heads, int32_t kv_heads, int32_t head_dim,
                                             kvo_dtype dtype, int32_t max_rows, int32_t threads,
                                             float scale, float softcap,
                                             kvo_host_attention_t** out_attention);
KVO_API void kvo_host_attention_destroy(kvo_host_attention_t* attention);

/* New in 0.5: row i, the query q[i] [heads][head_dim] (f32, host memory) of slot slots[i],
 * attends keys [key_begin[i], key_end[i]) of that slot's host rows in `view` (a layer held
 * between kvo_acquire and kvo_release whose view has host_k and host_v: a streamed layer of a
 * step that splits). out [rows][heads][head_dim] gets the normalized outputs; lse [rows][heads],
 * unless NULL, their log-sum-exp in log2 (FlashInfer's convention: log2 of the sum over the keys
 * of 2^(score * log2 e)). A row of no keys gives out 0 and lse -inf.
 * REQUIRES: 1 <= rows <= max_rows; the view's dtype, kv_heads and head_dim the attention's, and
 * its v_head_dim equal to head_dim; slots distinct, in [0, view->slots); 0 <= key_begin[i] <=
 * key_end[i] <= view->lengths[slots[i]] (rows committed before this step). */
KVO_API kvo_status kvo_host_attention_run(kvo_host_attention_t* attention,
                                          const kvo_layer_view* view, const float* q, int32_t rows,
                                          const int32_t* slots, const int32_t* key_begin,
                                          const int32_t* key_end, float* out, float* lse);

/* ---- streams and copies, for callers without their own runtime, and for tests --------------- */

/* A new stream in *out_stream (a cudaStream_t on CUDA, an asynchronous worker on the host
 * backend). The caller owns it and frees it with kvo_stream_destroy, before kvo_cache_destroy.
 * REQUIRES: out_stream != NULL. */
KVO_API kvo_status kvo_stream_create(kvo_cache_t* cache, void** out_stream);

/* Waits for the stream's work, then frees it. NULL is a no-op. A handle this cache did not make,
 * or has already freed, is refused with KVO_ERROR_INVALID_ARGUMENT and nothing is freed (a
 * caller's own cudaStream_t is never destroyed here).
 * REQUIRES: `stream` was made by kvo_stream_create on this cache. */
KVO_API kvo_status kvo_stream_destroy(kvo_cache_t* cache, void* stream);

/* Blocks the calling thread until everything enqueued on `stream` has run. */
KVO_API kvo_status kvo_stream_synchronize(kvo_cache_t* cache, void* stream);

/* Blocking copies of `bytes` bytes between host memory and device memory.
 * REQUIRES: both ranges are valid for `bytes` bytes. */
KVO_API kvo_status kvo_copy_to_host(kvo_cache_t* cache, void* host_dst, const void* device_src,
                                    size_t bytes);
KVO_API kvo_status kvo_copy_to_device(kvo_cache_t* cache, void* device_dst, const void* host_src,
                                      size_t bytes);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVOFFLOAD_KVOFFLOAD_H_ */
