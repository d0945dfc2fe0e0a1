/* The C ABI, from C99: a small engine drives a cache on the host backend (random copy delays)
 * through prefills, decodes, chunked appends, idle slots, truncations, resets and an aborted
 * step, and checks every acquired view against its own copy of what every layer and slot must
 * hold. It then provokes each error code and checks that the cache is still usable and its data
 * intact. Runs once with the synchronous NULL stream and once with an asynchronous stream. */
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvoffload/kvoffload.h"

#define LAYERS 5
#define RESIDENT 1
#define KV_HEADS 2
#define HEAD_DIM 8
#define MAX_SEQ 64
#define SLOTS 3
#define ROW (KV_HEADS * HEAD_DIM) /* floats in one token of one tensor */
#define ROW_BYTES (ROW * sizeof(float))

static int failures = 0;

#define CHECK(cond)                                                            \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      ++failures;                                                              \
    }                                                                          \
  } while (0)

/* A call that must succeed; on failure prints the cache's message and stops the test. */
#define MUST(cache, call)                                                       \
  do {                                                                          \
    kvo_status must_status_ = (call);                                           \
    if (must_status_ != KVO_OK) {                                               \
      fprintf(stderr, "%s:%d: %s returned %s: %s\n", __FILE__, __LINE__, #call, \
              kvo_status_name(must_status_), kvo_last_error(cache));            \
      exit(1);                                                                  \
    }                                                                           \
  } while (0)

/* A call that must fail with `expected` and a message containing `needle`. */
static void expect_status(const kvo_cache_t* cache, kvo_status got, kvo_status expected,
                          const char* needle, int line) {
  const char* message = kvo_last_error(cache);
  if (got != expected) {
    fprintf(stderr, "line %d: got %s, expected %s (%s)\n", line, kvo_status_name(got),
            kvo_status_name(expected), message);
    ++failures;
  } else if (strstr(message, needle) == NULL) {
    fprintf(stderr, "line %d: message '%s' lacks '%s'\n", line, message, needle);
    ++failures;
  }
}
#define EXPECT_STATUS(cache, call, expected, needle) \
  expect_status(cache, call, expected, needle, __LINE__)

/* ---- the engine ---------------------------------------------------------------------------- */

typedef struct engine {
  kvo_cache_t* cache;
  void* stream;          /* NULL: synchronous */
  uint64_t rng;          /* xorshift64 state */
  int32_t length[SLOTS]; /* what the engine believes each slot holds */
  float* expected;       /* [layer][kv][slot][MAX_SEQ][ROW]: what the cache must hold */
  float* rows;           /* [kv][slot][MAX_SEQ][ROW]: this step's new rows of one layer */
  float* scratch;        /* [MAX_SEQ][ROW]: a slot's rows read back */
  int views_checked;
} engine;

static uint64_t next_random(engine* e) {
  e->rng ^= e->rng << 13;
  e->rng ^= e->rng >> 7;
  e->rng ^= e->rng << 17;
  return e->rng;
}
static int uniform(engine* e, int lo, int hi) { /* [lo, hi] */
  return lo + (int)(next_random(e) % (uint64_t)(hi - lo + 1));
}
static int chance(engine* e, int percent) {
  return uniform(e, 0, 99) < percent;
}

static float* expected_row(engine* e, int layer, int kv, int slot, int token) {
  return e->expected +
         ((((size_t)layer * 2 + (size_t)kv) * SLOTS + (size_t)slot) * MAX_SEQ + (size_t)token) *
             ROW;
}
static float* new_row(engine* e, int kv, int slot, int token) {
  return e->rows + (((size_t)kv * SLOTS + (size_t)slot) * MAX_SEQ + (size_t)token) * ROW;
}

static kvo_cache_options small_options(uint64_t seed) {
  kvo_cache_options options;
  MUST(NULL, kvo_cache_options_init(&options, sizeof options));
  options.layers = LAYERS;
  options.kv_heads = KV_HEADS;
  options.head_dim = HEAD_DIM;
  options.max_seq = MAX_SEQ;
  options.slots = SLOTS;
  options.dtype = KVO_DTYPE_F32;
  options.resident_layers = RESIDENT;
  options.ring_depth = 2;
  options.backend = KVO_BACKEND_HOST;
  options.host_max_delay_us = 30;
  options.host_delay_seed = seed;
  return options;
}

static void engine_init(engine* e, uint64_t seed, int async_stream) {
  kvo_cache_options options = small_options(seed);
  memset(e, 0, sizeof(*e));
  e->rng = seed * 0x9E3779B97F4A7C15ull + 1;
  MUST(NULL, kvo_cache_create(&options, &e->cache));
  if (async_stream) MUST(e->cache, kvo_stream_create(e->cache, &e->stream));
  e->expected = (float*)calloc((size_t)LAYERS * 2 * SLOTS * MAX_SEQ * ROW, sizeof(float));
  e->rows = (float*)calloc((size_t)2 * SLOTS * MAX_SEQ * ROW, sizeof(float));
  e->scratch = (float*)calloc((size_t)MAX_SEQ * ROW, sizeof(float));
  if (e->expected == NULL || e->rows == NULL || e->scratch == NULL) exit(1);
}

static void engine_free(engine* e) {
  MUST(e->cache, kvo_stream_destroy(e->cache, e->stream));
  kvo_cache_destroy(e->cache);
  free(e->expected);
  free(e->rows);
  free(e->scratch);
}

/* Checks that rows [0, rows) of every slot of the view (K and V) hold what they must. Waits for
 * the engine's stream first, as an engine's kernels would be ordered after the acquire. */
static void check_view(engine* e, const kvo_layer_view* view, const int32_t* rows) {
  int s, kv;
  MUST(e->cache, kvo_stream_synchronize(e->cache, e->stream));
  for (s = 0; s < SLOTS; ++s) {
    for (kv = 0; kv < 2; ++kv) {
      const char* base = (const char*)(kv == 0 ? view->k : view->v);
      const char* slot_rows = base + (size_t)s * (size_t)view->slot_stride * sizeof(float);
      if (rows[s] == 0) continue;
      MUST(e->cache,
           kvo_copy_to_host(e->cache, e->scratch, slot_rows, (size_t)rows[s] * ROW_BYTES));
      if (memcmp(e->scratch, expected_row(e, view->layer, kv, s, 0), (size_t)rows[s] * ROW_BYTES) !=
          0) {
        fprintf(stderr, "layer %d %s slot %d: rows [0, %d) differ\n", view->layer,
                kv == 0 ? "K" : "V", s, rows[s]);
        ++failures;
      }
    }
  }
  ++e->views_checked;
}

/* One step: n[s] new tokens for each slot, appended in random chunks, every view checked before
 * and after the appends. abort_at >= 0 aborts the step after acquiring that layer. */
static void engine_step(engine* e, const int32_t* n, int abort_at) {
  kvo_cache_stats before, after;
  int32_t total_new = 0, total_len = 0, sum[SLOTS];
  int layer, s, kv, t, i;
  before.struct_size = after.struct_size = sizeof before;
  MUST(e->cache, kvo_stats(e->cache, &before));
  MUST(e->cache, kvo_begin_step(e->cache, n, SLOTS));
  for (layer = 0; layer < LAYERS; ++layer) {
    kvo_layer_view view;
    view.struct_size = sizeof view;
    MUST(e->cache, kvo_acquire(e->cache, layer, &view, e->stream));
    CHECK(view.layer == layer);
    CHECK(view.resident == (layer < RESIDENT));
    CHECK(view.slots == SLOTS && view.max_seq == MAX_SEQ);
    CHECK(view.kv_heads == KV_HEADS && view.head_dim == HEAD_DIM);
    CHECK(view.dtype == KVO_DTYPE_F32);
    CHECK(view.head_stride == HEAD_DIM && view.token_stride == ROW);
    CHECK(view.slot_stride == (int64_t)MAX_SEQ * ROW);
    for (s = 0; s < SLOTS; ++s) {
      CHECK(view.lengths[s] == e->length[s]);
      CHECK(view.new_tokens[s] == n[s]);
    }
    check_view(e, &view, e->length); /* what the prefetch brought */

    /* Fresh random rows for this layer; the engine's copy learns them as they are appended. */
    for (kv = 0; kv < 2; ++kv) {
      for (s = 0; s < SLOTS; ++s) {
        for (t = 0; t < n[s]; ++t) {
          float* row = new_row(e, kv, s, t);
          for (i = 0; i < ROW; ++i) row[i] = (float)(int32_t)next_random(e) / 65536.0f;
        }
      }
    }
    if (layer == abort_at) {
      /* Some rows appended, then the step is abandoned: nothing of it may stay. */
      if (n[0] > 0) {
        MUST(e->cache, kvo_append(e->cache, layer, 0, new_row(e, 0, 0, 0), new_row(e, 1, 0, 0), 1,
                                  e->stream));
      }
      MUST(e->cache, kvo_abort_step(e->cache, e->stream));
      return;
    }
    for (s = 0; s < SLOTS; ++s) {
      int done = 0;
      while (done < n[s]) {
        const int piece = chance(e, 50) ? n[s] - done : uniform(e, 1, n[s] - done);
        MUST(e->cache, kvo_append(e->cache, layer, s, new_row(e, 0, s, done),
                                  new_row(e, 1, s, done), piece, e->stream));
        done += piece;
      }
      for (kv = 0; kv < 2; ++kv) {
        if (n[s] > 0) {
          memcpy(expected_row(e, layer, kv, s, e->length[s]), new_row(e, kv, s, 0),
                 (size_t)n[s] * ROW_BYTES);
        }
      }
      sum[s] = e->length[s] + n[s];
    }
    check_view(e, &view, sum); /* what attention reads */
    MUST(e->cache, kvo_release(e->cache, layer, e->stream));
  }
  MUST(e->cache, kvo_end_step(e->cache));

  for (s = 0; s < SLOTS; ++s) {
    int32_t length = -1;
    total_len += e->length[s];
    total_new += n[s];
    e->length[s] += n[s];
    MUST(e->cache, kvo_length(e->cache, s, &length));
    CHECK(length == e->length[s]);
  }
  MUST(e->cache, kvo_stats(e->cache, &after));
  CHECK(after.steps == before.steps + 1);
  /* Only the appended rows of the streamed layers went back to the host. */
  CHECK(after.d2h_bytes_last_step ==
        2u * (uint64_t)(LAYERS - RESIDENT) * (uint64_t)total_new * ROW_BYTES);
  CHECK(after.device_allocations == before.device_allocations);
  (void)total_len;
}

/* Host-side changes between steps, mirrored in the engine's own lengths. */
static void engine_edit(engine* e) {
  int s;
  for (s = 0; s < SLOTS; ++s) {
    if (chance(e, 5)) {
      MUST(e->cache, kvo_reset_slot(e->cache, s));
      e->length[s] = 0;
    } else if (e->length[s] > 0 && chance(e, 8)) {
      e->length[s] = uniform(e, 0, e->length[s] - 1);
      MUST(e->cache, kvo_truncate_slot(e->cache, s, e->length[s]));
    }
  }
}

/* Random steps: a prefill now and then, mostly decodes, some idle slots, never past max_seq. */
static void engine_run(engine* e, int steps) {
  int step, s;
  for (step = 0; step < steps; ++step) {
    int32_t n[SLOTS];
    engine_edit(e);
    for (s = 0; s < SLOTS; ++s) {
      const int room = MAX_SEQ - e->length[s];
      int want = chance(e, 20) ? uniform(e, 2, 12) : (chance(e, 15) ? 0 : 1);
      if (want > room) {
        MUST(e->cache, kvo_reset_slot(e->cache, s));
        e->length[s] = 0;
      }
      n[s] = want;
    }
    engine_step(e, n, chance(e, 5) ? uniform(e, 0, LAYERS - 1) : -1);
  }
}

/* ---- errors --------------------------------------------------------------------------------- */

static void provoke_errors(engine* e) {
  kvo_cache_t* cache = e->cache;
  /* Not a cache, never dereferenced: a failed create must overwrite it with NULL. */
  kvo_cache_t* const not_a_cache = (kvo_cache_t*)&failures;
  kvo_cache_options options;
  kvo_layer_view view;
  int32_t n[SLOTS] = {1, 1, 1};
  int32_t length = 0, devices = -1;
  float row[ROW] = {0};
  int s;
  view.struct_size = sizeof view;

  for (s = 0; s < SLOTS; ++s) { /* room for the one-token step below */
    if (e->length[s] == MAX_SEQ) {
      e->length[s] = MAX_SEQ - 1;
      MUST(cache, kvo_truncate_slot(cache, s, e->length[s]));
    }
  }

  /* Invalid arguments. */
  EXPECT_STATUS(cache, kvo_reset_slot(cache, SLOTS), KVO_ERROR_INVALID_ARGUMENT,
                "slot 3 is out of range");
  EXPECT_STATUS(cache, kvo_truncate_slot(cache, 0, e->length[0] + 1), KVO_ERROR_INVALID_ARGUMENT,
                "cannot truncate");
  EXPECT_STATUS(cache, kvo_begin_step(cache, n, SLOTS - 1), KVO_ERROR_INVALID_ARGUMENT,
                "one new-token count per slot");
  {
    const int32_t one = 1, outside[SLOTS] = {0, SLOTS, 1};
    EXPECT_STATUS(cache, kvo_reorder_slots(cache, NULL, SLOTS), KVO_ERROR_INVALID_ARGUMENT,
                  "source is NULL");
    EXPECT_STATUS(cache, kvo_reorder_slots(cache, &one, 1 << 20), KVO_ERROR_INVALID_ARGUMENT,
                  "count is 1048576, the cache has 3 slots");
    EXPECT_STATUS(cache, kvo_reorder_slots(cache, outside, SLOTS), KVO_ERROR_INVALID_ARGUMENT,
                  "source[1] is 3, not a slot");
  }
  EXPECT_STATUS(cache, kvo_begin_step(cache, NULL, SLOTS), KVO_ERROR_INVALID_ARGUMENT,
                "new_tokens is NULL");
  /* A count far past the array: refused before a single int is read (AddressSanitizer catches a
   * read past `one`). */
  {
    const int32_t one = 1;
    EXPECT_STATUS(cache, kvo_begin_step(cache, &one, 1 << 20), KVO_ERROR_INVALID_ARGUMENT,
                  "count is 1048576, the cache has 3 slots");
    EXPECT_STATUS(cache, kvo_begin_step(cache, &one, -1), KVO_ERROR_INVALID_ARGUMENT,
                  "count is -1");
  }
  EXPECT_STATUS(cache, kvo_length(cache, 0, NULL), KVO_ERROR_INVALID_ARGUMENT,
                "out_length is NULL");
  EXPECT_STATUS(cache, kvo_stats(cache, NULL), KVO_ERROR_INVALID_ARGUMENT, "out_stats is NULL");
  n[1] = MAX_SEQ + 1 - e->length[1];
  EXPECT_STATUS(cache, kvo_begin_step(cache, n, SLOTS), KVO_ERROR_INVALID_ARGUMENT,
                "would pass max_seq");
  n[1] = 1;
  /* A NULL cache: reported on the thread, the cache's own message untouched. */
  EXPECT_STATUS(NULL, kvo_end_step(NULL), KVO_ERROR_INVALID_ARGUMENT, "kvo_end_step");
  CHECK(strstr(kvo_last_error(NULL), "NULL") != NULL);
  CHECK(strstr(kvo_last_error(cache), "would pass max_seq") != NULL);

  /* Protocol misuse, between steps and inside one. */
  EXPECT_STATUS(cache, kvo_acquire(cache, 0, &view, e->stream), KVO_ERROR_PROTOCOL,
                "begin_step first");
  EXPECT_STATUS(cache, kvo_end_step(cache), KVO_ERROR_PROTOCOL, "without begin_step");
  EXPECT_STATUS(cache, kvo_abort_step(cache, e->stream), KVO_ERROR_PROTOCOL, "without an open");
  MUST(cache, kvo_begin_step(cache, n, SLOTS));
  EXPECT_STATUS(cache, kvo_begin_step(cache, n, SLOTS), KVO_ERROR_PROTOCOL, "step is open");
  EXPECT_STATUS(cache, kvo_acquire(cache, 1, &view, e->stream), KVO_ERROR_PROTOCOL, "out of order");
  EXPECT_STATUS(cache, kvo_acquire(cache, LAYERS, &view, e->stream), KVO_ERROR_INVALID_ARGUMENT,
                "out of range");
  EXPECT_STATUS(cache, kvo_acquire(cache, 0, NULL, e->stream), KVO_ERROR_INVALID_ARGUMENT,
                "out_view is NULL");
  EXPECT_STATUS(cache, kvo_append(cache, 0, 0, row, row, 1, e->stream), KVO_ERROR_PROTOCOL,
                "without acquire");
  EXPECT_STATUS(cache, kvo_reset_slot(cache, 0), KVO_ERROR_PROTOCOL, "between steps");
  MUST(cache, kvo_acquire(cache, 0, &view, e->stream));
  EXPECT_STATUS(cache, kvo_release(cache, 0, e->stream), KVO_ERROR_PROTOCOL, "new rows appended");
  EXPECT_STATUS(cache, kvo_append(cache, 0, 0, row, row, 2, e->stream), KVO_ERROR_INVALID_ARGUMENT,
                "declared 1");
  EXPECT_STATUS(cache, kvo_append(cache, 0, 0, NULL, NULL, 1, e->stream),
                KVO_ERROR_INVALID_ARGUMENT, "null");
  /* One row, then INT32_MAX more: 1 + INT32_MAX overflows an int32 sum, and must still be
   * refused (else about 2^31 rows would be copied past the layer). */
  MUST(cache, kvo_append(cache, 0, 0, row, row, 1, e->stream));
  EXPECT_STATUS(cache, kvo_append(cache, 0, 0, row, row, INT32_MAX, e->stream),
                KVO_ERROR_INVALID_ARGUMENT, "would get 2147483648 rows");
  EXPECT_STATUS(cache, kvo_append(cache, 0, 0, row, row, -1, e->stream), KVO_ERROR_INVALID_ARGUMENT,
                "negative");
  EXPECT_STATUS(cache, kvo_end_step(cache), KVO_ERROR_PROTOCOL, "still held");
  MUST(cache, kvo_abort_step(cache, e->stream));              /* nothing of this step may stay */
  CHECK(strstr(kvo_last_error(cache), "still held") != NULL); /* success does not clear it */
  /* `row` lives on this frame and the append above reads it on the stream: it must stay valid
   * until the stream has run the copy. */
  MUST(cache, kvo_stream_synchronize(cache, e->stream));

  /* Out of memory: a budget that cannot hold even the staging ring names the missing bytes. */
  options = small_options(1);
  options.resident_layers = KVO_AUTO_RESIDENT_LAYERS;
  options.device_budget = 1000;
  cache = not_a_cache;
  EXPECT_STATUS(NULL, kvo_cache_create(&options, &cache), KVO_ERROR_OUT_OF_MEMORY, "missing");
  CHECK(cache == NULL);

  /* Bad options: each names what is wrong, and nothing is created. */
  options = small_options(1);
  options.dtype = (kvo_dtype)7;
  EXPECT_STATUS(NULL, kvo_cache_create(&options, &cache), KVO_ERROR_INVALID_ARGUMENT, "dtype");
  options = small_options(1);
  options.backend = (kvo_backend)-9;
  EXPECT_STATUS(NULL, kvo_cache_create(&options, &cache), KVO_ERROR_INVALID_ARGUMENT, "backend");
  options = small_options(1);
  options.head_dim = 0;
  EXPECT_STATUS(NULL, kvo_cache_create(&options, &cache), KVO_ERROR_INVALID_ARGUMENT,
                "head_dim must be positive");
  EXPECT_STATUS(NULL, kvo_cache_create(NULL, &cache), KVO_ERROR_INVALID_ARGUMENT,
                "options is NULL");
  CHECK(cache == NULL);

  /* Device error: the CUDA backend where no GPU is usable. Needs a machine without one. */
  MUST(NULL, kvo_cuda_device_count(&devices));
  CHECK(devices >= 0);
  if (devices == 0) {
    options = small_options(1);
    options.backend = KVO_BACKEND_CUDA;
    EXPECT_STATUS(NULL, kvo_cache_create(&options, &cache), KVO_ERROR_DEVICE, "host backend");
    CHECK(cache == NULL);
  } else {
    printf("a CUDA device is present: KVO_ERROR_DEVICE not provoked\n");
  }
  /* KVO_ERROR_INTERNAL is a broken invariant inside the library: no call can provoke it. */

  /* Streams: a handle the cache never made, and one it made and freed, are refused. */
  {
    void* made = NULL;
    EXPECT_STATUS(e->cache, kvo_stream_destroy(e->cache, (void*)&failures),
                  KVO_ERROR_INVALID_ARGUMENT, "not a stream this cache made");
    MUST(e->cache, kvo_stream_create(e->cache, &made));
    MUST(e->cache, kvo_stream_destroy(e->cache, made));
    EXPECT_STATUS(e->cache, kvo_stream_destroy(e->cache, made), KVO_ERROR_INVALID_ARGUMENT,
                  "not a stream this cache made");
    MUST(e->cache, kvo_stream_destroy(e->cache, NULL)); /* a no-op */
  }

  /* kvo_cache_options_init with a struct_size past this library's struct (a newer header's):
   * refused, and not a byte of the caller's memory written. */
  {
    struct {
      kvo_cache_options options;
      unsigned char newer[64];
    } big;
    const unsigned char* bytes = (const unsigned char*)&big;
    size_t i;
    int untouched = 1;
    memset(&big, 0xAB, sizeof big);
    EXPECT_STATUS(NULL, kvo_cache_options_init(&big.options, (uint32_t)sizeof big),
                  KVO_ERROR_INVALID_ARGUMENT, "more than this library's kvo_cache_options");
    EXPECT_STATUS(NULL, kvo_cache_options_init(&big.options, UINT32_MAX),
                  KVO_ERROR_INVALID_ARGUMENT, "newer kvoffload");
    for (i = 0; i < sizeof big; ++i) untouched = untouched && bytes[i] == 0xAB;
    CHECK(untouched);
  }

  /* After all that, the engine's cache still works and holds what it held. */
  for (s = 0; s < SLOTS; ++s) {
    MUST(e->cache, kvo_length(e->cache, s, &length));
    CHECK(length == e->length[s]);
  }
}

/* ---- the test ------------------------------------------------------------------------------- */

/* Saves slot 0 with its token ids, empties it, refuses a load for another model, then loads it
 * back: the engine's own copy of the rows stays what the cache must hold, and the steps after
 * check it. */
static void save_and_restore(engine* e, uint64_t seed) {
  char path[64];
  int32_t ids[MAX_SEQ];
  int32_t back[MAX_SEQ];
  int32_t count = -1;
  int32_t length = -1;
  int32_t i;
  snprintf(path, sizeof(path), "c_api_test_context_%llu.kvo", (unsigned long long)seed);
  for (i = 0; i < e->length[0]; ++i) ids[i] = 1000 + i;
  MUST(e->cache, kvo_save_slot(e->cache, 0, path, ids, e->length[0], "model=c-test"));
  MUST(e->cache, kvo_reset_slot(e->cache, 0));
  EXPECT_STATUS(e->cache, kvo_load_slot(e->cache, 0, path, "model=other", back, MAX_SEQ, &count),
                KVO_ERROR_INVALID_ARGUMENT, "saved for another model");
  MUST(e->cache, kvo_length(e->cache, 0, &length));
  CHECK(length == 0);
  EXPECT_STATUS(e->cache, kvo_load_slot(e->cache, 0, NULL, NULL, NULL, 0, &count),
                KVO_ERROR_INVALID_ARGUMENT, "path is NULL");
  EXPECT_STATUS(e->cache, kvo_save_slot(e->cache, 0, path, ids, e->length[0] + 1, NULL),
                KVO_ERROR_INVALID_ARGUMENT, "token ids were given");
  MUST(e->cache, kvo_load_slot(e->cache, 0, path, "model=c-test", back, MAX_SEQ, &count));
  MUST(e->cache, kvo_length(e->cache, 0, &length));
  CHECK(length == e->length[0]);
  CHECK(count == e->length[0]);
  for (i = 0; i < count; ++i) CHECK(back[i] == ids[i]);
  remove(path);
}

/* Several slots to one file and back (kvo_save_slots, kvo_load_slots), the file read without a
 * cache (kvo_inspect_saved_context, kvo_saved_context_model), and a load whose token ids would
 * not fit refused before anything changed. */
static void save_and_restore_slots(engine* e, uint64_t seed) {
  char path[64];
  int32_t slots[2] = {1, 0};
  int32_t ids[2 * MAX_SEQ];
  int32_t counts[2];
  int32_t back[2 * MAX_SEQ];
  int32_t back_counts[2] = {-1, -1};
  int32_t lengths[3] = {-1, -1, -1};
  int32_t length = -1;
  char model[64];
  size_t model_length = 0;
  kvo_saved_context_info info;
  int32_t i, n = 0;
  snprintf(path, sizeof(path), "c_api_test_slots_%llu.kvo", (unsigned long long)seed);
  counts[0] = e->length[1];
  counts[1] = 0; /* slot 0 saved without its ids */
  for (i = 0; i < counts[0]; ++i) ids[n++] = 7000 + i;
  MUST(e->cache, kvo_save_slots(e->cache, slots, 2, path, ids, counts, "model=c-test"));

  memset(&info, 0, sizeof info);
  info.struct_size = sizeof info;
  MUST(NULL, kvo_inspect_saved_context(path, &info, lengths, 3));
  CHECK(info.records == 2 && info.layers == LAYERS && info.kv_heads == KV_HEADS);
  CHECK(info.head_dim == HEAD_DIM && info.v_head_dim == HEAD_DIM && info.max_seq == MAX_SEQ);
  CHECK(info.dtype == KVO_DTYPE_F32);
  CHECK(lengths[0] == e->length[1] && lengths[1] == e->length[0] && lengths[2] == -1);
  MUST(NULL, kvo_saved_context_model(path, 1, model, sizeof model, &model_length));
  CHECK(model_length == strlen("model=c-test") && strcmp(model, "model=c-test") == 0);
  MUST(NULL, kvo_saved_context_model(path, 0, model, 6, &model_length)); /* cut to fit */
  CHECK(model_length == strlen("model=c-test") && strcmp(model, "model") == 0);
  EXPECT_STATUS(NULL, kvo_saved_context_model(path, 2, model, sizeof model, &model_length),
                KVO_ERROR_INVALID_ARGUMENT, "record 2");
  EXPECT_STATUS(NULL, kvo_inspect_saved_context("no-such-file.kvo", &info, NULL, 0),
                KVO_ERROR_INVALID_ARGUMENT, "no-such-file.kvo");

  MUST(e->cache, kvo_reset_slot(e->cache, 0));
  MUST(e->cache, kvo_reset_slot(e->cache, 1));
  EXPECT_STATUS(
      e->cache,
      kvo_load_slots(e->cache, slots, 2, path, "model=c-test", back, counts[0] - 1, back_counts),
      KVO_ERROR_INVALID_ARGUMENT, "more than tokens_capacity");
  EXPECT_STATUS(
      e->cache,
      kvo_load_slots(e->cache, slots, 2, path, "model=other", back, 2 * MAX_SEQ, back_counts),
      KVO_ERROR_INVALID_ARGUMENT, "saved for another model");
  MUST(e->cache, kvo_length(e->cache, 1, &length));
  CHECK(length == 0 && back_counts[0] == -1);
  MUST(e->cache,
       kvo_load_slots(e->cache, slots, 2, path, "model=c-test", back, 2 * MAX_SEQ, back_counts));
  CHECK(back_counts[0] == counts[0] && back_counts[1] == 0);
  for (i = 0; i < counts[0]; ++i) CHECK(back[i] == ids[i]);
  MUST(e->cache, kvo_length(e->cache, 1, &length));
  CHECK(length == e->length[1]);
  MUST(e->cache, kvo_length(e->cache, 0, &length));
  CHECK(length == e->length[0]);
  remove(path);
}

/* The calls without a cache: sizes, the default budget, a plan equal to a cache's, fingerprints
 * and the digests they are made of. */
static void calls_without_a_cache(void) {
  uint64_t bytes = 0;
  char text[160];
  size_t length = 0;
  unsigned char data[1000];
  char whole[40], pieces[40], first[40], second[40];
  const char* keys[3] = {"b", "a", "b"};
  const char* values[3] = {"1", "x y", "2"};
  int64_t shape[2] = {4, 250};
  kvo_bytes_digest_t* digest = NULL;
  kvo_weights_digest_t* w1 = NULL;
  kvo_weights_digest_t* w2 = NULL;
  kvo_cache_options options;
  kvo_cache_stats plan, stats;
  kvo_cache_t* cache = NULL;
  uint64_t state = 12345;
  int i;

  MUST(NULL, kvo_parse_size("1.5GiB", &bytes));
  CHECK(bytes == 3ull << 29);
  EXPECT_STATUS(NULL, kvo_parse_size("lots", &bytes), KVO_ERROR_INVALID_ARGUMENT, "lots");
  MUST(NULL, kvo_format_bytes(3ull << 29, text, sizeof text, &length));
  CHECK(length == strlen(text) && strncmp(text, "1.50 GiB", 8) == 0);
  MUST(NULL, kvo_format_bytes(3ull << 29, text, 5, &length)); /* cut to fit */
  CHECK(strlen(text) == 4 && length > 4);
  EXPECT_STATUS(NULL, kvo_format_bytes(1, NULL, 8, &length), KVO_ERROR_INVALID_ARGUMENT,
                "buffer is NULL");
  MUST(NULL, kvo_default_device_budget(10ull << 30, 80ull << 30, &bytes));
  CHECK(bytes == 6ull << 30); /* less 5% of 80 GiB */
  MUST(NULL, kvo_default_device_budget(1ull << 29, 8ull << 30, &bytes));
  CHECK(bytes == 0); /* less than the 1 GiB headroom */
  MUST(NULL, kvo_host_available_bytes(&bytes));
  CHECK(bytes > 0);

  /* A plan is what a cache of the same options allocates. */
  options = small_options(9);
  options.resident_layers = 2;
  plan.struct_size = stats.struct_size = sizeof plan;
  MUST(NULL, kvo_plan(&options, &plan));
  MUST(NULL, kvo_cache_create(&options, &cache));
  MUST(cache, kvo_stats(cache, &stats));
  CHECK(plan.layers == LAYERS && plan.resident_layers == 2 && plan.steps == 0);
  CHECK(plan.resident_layers == stats.resident_layers && plan.ring_depth == stats.ring_depth);
  CHECK(plan.device_bytes == stats.device_bytes && plan.host_bytes == stats.host_bytes);
  CHECK(plan.tensor_bytes == stats.tensor_bytes && plan.layer_bytes == 2 * plan.tensor_bytes);
  kvo_cache_destroy(cache);
  options.device_budget = plan.staging_bytes / 2;
  EXPECT_STATUS(NULL, kvo_plan(&options, &plan), KVO_ERROR_OUT_OF_MEMORY, "");

  MUST(NULL, kvo_fingerprint_number(1e-05, text, sizeof text, &length));
  CHECK(strcmp(text, "1e-05") == 0);
  MUST(NULL, kvo_fingerprint_number(500000.0, text, sizeof text, &length));
  CHECK(strcmp(text, "500000") == 0);
  EXPECT_STATUS(NULL, kvo_fingerprint_number(0.0 / 0.0, text, sizeof text, &length),
                KVO_ERROR_INVALID_ARGUMENT, "");
  MUST(NULL, kvo_fingerprint_text(keys, values, 3, text, sizeof text, &length));
  CHECK(strcmp(text, "kvoffload-fingerprint 2\na=x y\nb=2") == 0);
  EXPECT_STATUS(NULL, kvo_fingerprint_text(values, keys, 3, text, sizeof text, &length),
                KVO_ERROR_INVALID_ARGUMENT, "");

  for (i = 0; i < 1000; ++i) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    data[i] = (unsigned char)state;
  }
  MUST(NULL, kvo_digest_bytes(data, sizeof data, whole, sizeof whole, &length));
  CHECK(length == 32);
  MUST(NULL, kvo_bytes_digest_create(&digest));
  MUST(NULL, kvo_bytes_digest_update(digest, data, 1));
  MUST(NULL, kvo_bytes_digest_update(digest, data + 1, 600));
  MUST(NULL, kvo_bytes_digest_update(digest, data + 601, 399));
  MUST(NULL, kvo_bytes_digest_hex(digest, pieces, sizeof pieces, &length));
  CHECK(strcmp(whole, pieces) == 0);
  kvo_bytes_digest_destroy(digest);
  data[999] ^= 1;
  MUST(NULL, kvo_digest_bytes(data, sizeof data, pieces, sizeof pieces, &length));
  CHECK(strcmp(whole, pieces) != 0);

  MUST(NULL, kvo_weights_digest_create(&w1));
  MUST(NULL, kvo_weights_digest_create(&w2));
  MUST(NULL, kvo_weights_digest_add(w1, "a.weight", "F32", shape, 2, whole));
  MUST(NULL, kvo_weights_digest_add(w1, "b.weight", "F32", shape, 2, pieces));
  MUST(NULL, kvo_weights_digest_add(w2, "b.weight", "F32", shape, 2, pieces));
  MUST(NULL, kvo_weights_digest_add(w2, "a.weight", "F32", shape, 2, whole));
  EXPECT_STATUS(NULL, kvo_weights_digest_add(w2, "a.weight", "F32", shape, 2, whole),
                KVO_ERROR_INVALID_ARGUMENT, "a.weight");
  MUST(NULL, kvo_weights_digest_hex(w1, first, sizeof first, &length));
  MUST(NULL, kvo_weights_digest_hex(w2, second, sizeof second, &length));
  CHECK(length == 32 && strcmp(first, second) == 0); /* any order */
  kvo_weights_digest_destroy(w1);
  kvo_weights_digest_destroy(w2);
  kvo_bytes_digest_destroy(NULL);
  kvo_weights_digest_destroy(NULL);
  MUST(NULL, kvo_tokenizer_digest(".", text, sizeof text, &length));
  CHECK(length == 0); /* no tokenizer files here */
}

static void check_defaults(void) {
  kvo_cache_options d;
  MUST(NULL, kvo_cache_options_init(&d, sizeof d));
  CHECK(d.struct_size == sizeof d && d.v_head_dim == 0);
  CHECK(d.layers == 32 && d.kv_heads == 8 && d.head_dim == 128);
  CHECK(d.max_seq == 4096 && d.slots == 1 && d.dtype == KVO_DTYPE_BF16);
  CHECK(d.resident_layers == KVO_AUTO_RESIDENT_LAYERS && d.ring_depth == 2);
  CHECK(d.device_budget == 0 && d.backend == KVO_BACKEND_AUTO && d.device == 0);
  CHECK(d.host_max_delay_us == 0);
  CHECK(strcmp(kvo_version(), KVO_EXPECTED_VERSION) == 0);
  CHECK(strcmp(kvo_status_name(KVO_OK), "ok") == 0);
  CHECK(strcmp(kvo_status_name(KVO_ERROR_PROTOCOL), "protocol misuse") == 0);
  CHECK(strcmp(kvo_last_error(NULL), "") == 0); /* nothing failed on this thread yet */
}

static void run(uint64_t seed, int async_stream) {
  engine e;
  kvo_cache_stats stats;
  kvo_backend backend = KVO_BACKEND_AUTO;
  int32_t prompt[SLOTS] = {17, 4, 0};
  stats.struct_size = sizeof stats;
  engine_init(&e, seed, async_stream);
  MUST(e.cache, kvo_cache_backend(e.cache, &backend));
  CHECK(backend == KVO_BACKEND_HOST);
  CHECK(strcmp(kvo_last_error(e.cache), "") == 0);
  MUST(e.cache, kvo_stats(e.cache, &stats));
  CHECK(stats.resident_layers == RESIDENT && stats.streamed_layers == LAYERS - RESIDENT);
  CHECK(stats.ring_depth == 2 && stats.row_bytes == ROW_BYTES);
  CHECK(stats.layer_bytes == 2u * SLOTS * MAX_SEQ * ROW_BYTES);
  CHECK(stats.device_bytes == stats.resident_bytes + stats.staging_bytes);
  CHECK(stats.steps == 0 && stats.device_allocations == 1);

  engine_step(&e, prompt, -1); /* prefill of different lengths, slot 2 idle */
  engine_run(&e, 40);
  provoke_errors(&e);
  engine_run(&e, 40);
  save_and_restore(&e, seed);
  engine_run(&e, 20);
  save_and_restore_slots(&e, seed);
  engine_run(&e, 20);
  MUST(e.cache, kvo_stats(e.cache, &stats));
  CHECK(stats.h2d_bytes_total > 0 && stats.d2h_bytes_total > 0);
  printf("seed %llu, %s stream: %d views checked, %llu steps, %llu bytes in, %llu out\n",
         (unsigned long long)seed, async_stream ? "async" : "NULL", e.views_checked,
         (unsigned long long)stats.steps, (unsigned long long)stats.h2d_bytes_total,
         (unsigned long long)stats.d2h_bytes_total);
  CHECK(e.views_checked > 2 * 80 * LAYERS / 2);
  engine_free(&e);
}

/* ---- quantized rows ---------------------------------------------------------------------- */

/* Rows quantized through the C ABI read back within the format's error, a quantized cache moves
 * them as opaque rows with their scales, and its views say where the scales are. */
static void quantized_rows(void) {
  enum { HEADS = 3, DIM = 6, ROWS = 5 };
  const kvo_dtype dtypes[2] = {KVO_DTYPE_FP8_E4M3, KVO_DTYPE_INT8};
  float x[ROWS * HEADS * DIM], back[ROWS * HEADS * DIM];
  unsigned char rows[ROWS * 64];
  uint64_t row_bytes = 0;
  int d, i;
  kvo_cache_options options;
  kvo_cache_t* cache = NULL;
  kvo_layer_view view;
  for (i = 0; i < ROWS * HEADS * DIM; ++i) x[i] = (float)((i * 37) % 23 - 11) / (float)(1 + i % 5);

  MUST(NULL, kvo_row_bytes(KVO_DTYPE_BF16, 8, 128, &row_bytes));
  CHECK(row_bytes == 2048);
  MUST(NULL, kvo_row_bytes(KVO_DTYPE_FP8_E4M3, 8, 128, &row_bytes));
  CHECK(row_bytes == 8 * 128 + 8 * 4);
  MUST(NULL, kvo_row_bytes(KVO_DTYPE_INT8, HEADS, DIM, &row_bytes));
  CHECK(row_bytes == 20 + HEADS * 4); /* 18 bytes padded to 20, then the scales */
  for (d = 0; d < 2; ++d) {
    double worst = 0;
    memset(back, 0, sizeof back);
    MUST(NULL, kvo_quantize_rows(dtypes[d], HEADS, DIM, x, ROWS, rows));
    MUST(NULL, kvo_dequantize_rows(dtypes[d], HEADS, DIM, rows, ROWS, back));
    for (i = 0; i < ROWS * HEADS * DIM; ++i) {
      const double err = fabs((double)back[i] - x[i]) / (fabs((double)x[i]) + 0.1);
      if (err > worst) worst = err;
    }
    CHECK(worst < (dtypes[d] == KVO_DTYPE_INT8 ? 0.1 : 0.2));
  }
  EXPECT_STATUS(NULL, kvo_quantize_rows(KVO_DTYPE_BF16, HEADS, DIM, x, 1, rows),
                KVO_ERROR_INVALID_ARGUMENT, "not quantized");
  EXPECT_STATUS(NULL, kvo_quantize_rows((kvo_dtype)9, HEADS, DIM, x, 1, rows),
                KVO_ERROR_INVALID_ARGUMENT, "not a kvo_dtype");
  EXPECT_STATUS(NULL, kvo_quantize_rows(KVO_DTYPE_INT8, 0, DIM, x, 1, rows),
                KVO_ERROR_INVALID_ARGUMENT, "positive");
  EXPECT_STATUS(NULL, kvo_dequantize_rows(KVO_DTYPE_INT8, HEADS, DIM, NULL, 1, back),
                KVO_ERROR_INVALID_ARGUMENT, "src is NULL");
  EXPECT_STATUS(NULL, kvo_row_bytes(KVO_DTYPE_INT8, HEADS, DIM, NULL), KVO_ERROR_INVALID_ARGUMENT,
                "NULL");

  /* A host-backend int8 cache: append quantized rows, read them back through the view. */
  MUST(NULL, kvo_cache_options_init(&options, sizeof options));
  options.layers = 3; /* more than the ring holds: the layers stream */
  options.kv_heads = HEADS;
  options.head_dim = DIM;
  options.max_seq = 16;
  options.slots = 1;
  options.dtype = KVO_DTYPE_INT8;
  options.resident_layers = 0;
  options.backend = KVO_BACKEND_HOST;
  options.host_max_delay_us = 30;
  MUST(NULL, kvo_cache_create(&options, &cache));
  MUST(NULL, kvo_quantize_rows(KVO_DTYPE_INT8, HEADS, DIM, x, ROWS, rows));
  for (i = 0; i < 2; ++i) {
    const int32_t n[1] = {i == 0 ? ROWS : 0};
    int layer;
    MUST(cache, kvo_begin_step(cache, n, 1));
    for (layer = 0; layer < 3; ++layer) {
      memset(&view, 0, sizeof view);
      view.struct_size = sizeof view;
      MUST(cache, kvo_acquire(cache, layer, &view, NULL));
      CHECK(view.dtype == KVO_DTYPE_INT8);
      CHECK(view.token_stride == 32 && view.head_stride == DIM);
      CHECK(view.k_scale_offset == 20 && view.v_scale_offset == 20);
      if (i == 1) { /* the rows came back from the host store */
        CHECK(memcmp(view.k, rows, ROWS * 32) == 0);
        CHECK(memcmp(view.v, rows, ROWS * 32) == 0);
      } else {
        MUST(cache, kvo_append(cache, layer, 0, rows, rows, ROWS, NULL));
      }
      MUST(cache, kvo_release(cache, layer, NULL));
    }
    MUST(cache, kvo_end_step(cache));
  }
  kvo_cache_destroy(cache);
}

/* ---- window layers ------------------------------------------------------------------------ */

/* Since 0.3: a cache whose second layer attends through a window of 6 keys keeps it as a window
 * of 64 rows per slot (5 + 8 + 1, in whole 64s) on the device; its views say which position row
 * 0 holds, and after every append the window's rows are there in position order while the three
 * full layers, streamed through a ring of two, hold every row. What it cannot serve is refused. */
static void window_layers(void) {
  enum { L = 4, HEADS = 2, DIM = 4, SEQ = 512, W = 6, APPEND = 8, RF = HEADS * DIM };
  static float history[L][2][SEQ][RF]; /* what layer l's K and V must hold at each position */
  static float rows[2][APPEND][RF];
  const int32_t windows[L] = {0, W, 0, 0};
  const int32_t bad_windows[L] = {W, W, W, W};
  kvo_cache_options options;
  kvo_cache_stats stats;
  kvo_layer_view view;
  kvo_cache_t* cache = NULL;
  int32_t length = 0;
  uint64_t rng = 7;
  int step;
  MUST(NULL, kvo_cache_options_init(&options, sizeof options));
  CHECK(options.layer_windows == NULL && options.max_append == 0);
  options.layers = L;
  options.kv_heads = HEADS;
  options.head_dim = DIM;
  options.max_seq = SEQ;
  options.slots = 1;
  options.dtype = KVO_DTYPE_F32;
  options.resident_layers = 0;
  options.backend = KVO_BACKEND_HOST;
  options.layer_windows = windows;
  EXPECT_STATUS(NULL, kvo_cache_create(&options, &cache), KVO_ERROR_INVALID_ARGUMENT, "max_append");
  CHECK(cache == NULL);
  options.max_append = APPEND;
  options.layer_windows = bad_windows;
  EXPECT_STATUS(NULL, kvo_cache_create(&options, &cache), KVO_ERROR_INVALID_ARGUMENT,
                "at least one must stay full");
  options.layer_windows = windows;
  MUST(NULL, kvo_cache_create(&options, &cache));
  memset(&stats, 0, sizeof stats);
  stats.struct_size = sizeof stats;
  MUST(cache, kvo_stats(cache, &stats));
  CHECK(stats.window_layers == 1 && stats.streamed_layers == 3 && stats.resident_layers == 0);
  CHECK(stats.window_bytes == 2u * 64 * RF * sizeof(float));
  CHECK(stats.host_bytes == 3u * stats.layer_bytes);

  for (step = 0; step < 200; ++step) {
    int32_t n[1];
    int layer;
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    n[0] = 1 + (int32_t)((rng >> 33) % APPEND);
    if (length + n[0] > SEQ) break;
    MUST(cache, kvo_begin_step(cache, n, 1));
    for (layer = 0; layer < L; ++layer) {
      int kv, t, e, from, p;
      memset(&view, 0, sizeof view);
      view.struct_size = sizeof view;
      MUST(cache, kvo_acquire(cache, layer, &view, NULL));
      for (kv = 0; kv < 2; ++kv) {
        for (t = 0; t < n[0]; ++t) {
          for (e = 0; e < RF; ++e) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            rows[kv][t][e] = history[layer][kv][length + t][e] = (float)(rng >> 40);
          }
        }
      }
      MUST(cache, kvo_append(cache, layer, 0, rows[0], rows[1], n[0], NULL));
      CHECK(view.window == windows[layer]);
      CHECK((view.first_positions != NULL) == (layer == 1));
      from = 0;
      if (layer == 1) { /* the first new row's window, then the new rows */
        CHECK(view.max_seq == 64 && view.resident == 1);
        from = length - (W - 1) > 0 ? length - (W - 1) : 0;
        if (view.first_positions[0] > from) {
          CHECK(view.first_positions[0] <= from);
          break;
        }
      }
      for (p = from; p < length + n[0]; ++p) {
        const int row = p - (view.first_positions != NULL ? view.first_positions[0] : 0);
        const float* k = (const float*)view.k + (int64_t)row * view.token_stride;
        const float* v = (const float*)view.v + (int64_t)row * view.v_token_stride;
        CHECK(memcmp(k, history[layer][0][p], sizeof(float) * RF) == 0);
        CHECK(memcmp(v, history[layer][1][p], sizeof(float) * RF) == 0);
      }
      MUST(cache, kvo_release(cache, layer, NULL));
    }
    MUST(cache, kvo_end_step(cache));
    length += n[0];
  }
  CHECK(length > 4 * 64); /* the window's rows moved to its front several times */
  EXPECT_STATUS(cache, kvo_save_slot(cache, 0, "/tmp/kvo-c-windows.kvo", NULL, 0, NULL),
                KVO_ERROR_INVALID_ARGUMENT, "window layers");
  kvo_cache_destroy(cache);
}

/* ---- split attention ------------------------------------------------------------------------ */

/* Since 0.3: kvo_begin_step_split leaves each slot's rows before its split row in the host store
 * (the views' host_k and host_v) and stages the rest; the bytes moved are the tails' alone once
 * the step before guessed the split; KVO_SPLIT_ROWS plans the split itself; bad splits and modes
 * are refused. */
static void split_attention(void) {
  enum { L = 4, HEADS = 2, DIM = 4, SEQ = 256, SL = 2, RF = HEADS * DIM };
  static float history[L][2][SL][SEQ][RF];
  static float rows[2][SEQ][RF];
  kvo_cache_options options;
  kvo_cache_stats stats;
  kvo_layer_view view;
  kvo_cache_t* cache = NULL;
  int32_t length[SL] = {0, 0};
  const int32_t prompt[SL] = {100, 70};
  const int32_t one[SL] = {1, 1};
  const int32_t split[SL] = {40, 70};
  uint64_t rng = 11;
  int step, mode;
  for (mode = 0; mode < 2; ++mode) {
    MUST(NULL, kvo_cache_options_init(&options, sizeof options));
    CHECK(options.split_mode == KVO_SPLIT_OFF);
    options.layers = L;
    options.kv_heads = HEADS;
    options.head_dim = DIM;
    options.max_seq = SEQ;
    options.slots = SL;
    options.dtype = KVO_DTYPE_F32;
    options.resident_layers = 0;
    options.backend = KVO_BACKEND_HOST;
    options.host_max_delay_us = 20;
    if (mode == 1) { /* planned: 64 rows stay on the host */
      options.split_mode = KVO_SPLIT_ROWS;
      options.split_rows = 64;
    }
    MUST(NULL, kvo_cache_create(&options, &cache));
    length[0] = length[1] = 0;
    for (step = 0; step < 6; ++step) {
      const int32_t* n = step == 0 ? prompt : one;
      int layer, s;
      if (mode == 0 && step > 0) {
        MUST(cache, kvo_begin_step_split(cache, n, split, SL));
      } else {
        MUST(cache, kvo_begin_step(cache, n, SL));
      }
      for (layer = 0; layer < L; ++layer) {
        memset(&view, 0, sizeof view);
        view.struct_size = sizeof view;
        MUST(cache, kvo_acquire(cache, layer, &view, NULL));
        CHECK((view.split_rows != NULL) == (step > 0));
        for (s = 0; s < SL; ++s) {
          const int cut = view.split_rows != NULL ? view.split_rows[s] : 0;
          int kv, t, e;
          if (step > 0) CHECK(cut == (mode == 0 ? split[s] : 64));
          for (t = 0; t < length[s]; ++t) { /* before the split in the store, after it staged */
            const int64_t at = (int64_t)s * view.slot_stride + (int64_t)t * view.token_stride;
            const float* k = (const float*)(t < cut ? view.host_k : view.k) + at;
            const float* v = (const float*)(t < cut ? view.host_v : view.v) + at;
            CHECK(memcmp(k, history[layer][0][s][t], sizeof(float) * RF) == 0);
            CHECK(memcmp(v, history[layer][1][s][t], sizeof(float) * RF) == 0);
          }
          for (kv = 0; kv < 2; ++kv) {
            for (t = 0; t < n[s]; ++t) {
              for (e = 0; e < RF; ++e) {
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                rows[kv][t][e] = history[layer][kv][s][length[s] + t][e] = (float)(rng >> 40);
              }
            }
          }
          MUST(cache, kvo_append(cache, layer, s, rows[0], rows[1], n[s], NULL));
        }
        MUST(cache, kvo_release(cache, layer, NULL));
      }
      MUST(cache, kvo_end_step(cache));
      length[0] += n[0];
      length[1] += n[1];
      if (step >= 2) { /* the step before knew the split: the tails alone, K and V, 4 layers */
        const int32_t* cut = mode == 0 ? split : NULL;
        const uint64_t tails = (uint64_t)(length[0] - 1 - (cut ? cut[0] : 64)) +
                               (uint64_t)(length[1] - 1 - (cut ? cut[1] : 64));
        memset(&stats, 0, sizeof stats);
        stats.struct_size = sizeof stats;
        MUST(cache, kvo_stats(cache, &stats));
        CHECK(stats.h2d_bytes_last_step == 2u * L * tails * RF * sizeof(float));
      }
    }
    /* Refused, nothing changed: a split past the length, a split of a prefill step. */
    {
      const int32_t past[SL] = {length[0] + 1, 0};
      const int32_t prefill[SL] = {2, 1};
      EXPECT_STATUS(cache, kvo_begin_step_split(cache, one, past, SL), KVO_ERROR_INVALID_ARGUMENT,
                    "is not within");
      EXPECT_STATUS(cache, kvo_begin_step_split(cache, prefill, split, SL),
                    KVO_ERROR_INVALID_ARGUMENT, "decode steps");
      EXPECT_STATUS(cache, kvo_begin_step_split(cache, one, NULL, SL), KVO_ERROR_INVALID_ARGUMENT,
                    "NULL");
    }
    kvo_cache_destroy(cache);
    cache = NULL;
  }
  MUST(NULL, kvo_cache_options_init(&options, sizeof options));
  options.backend = KVO_BACKEND_HOST;
  options.split_mode = (kvo_split_mode)7;
  EXPECT_STATUS(NULL, kvo_cache_create(&options, &cache), KVO_ERROR_INVALID_ARGUMENT,
                "kvo_split_mode");
  CHECK(cache == NULL);
}

/* Since 0.5: split attention's host part. A cache of f32 or bf16 rows (GQA: 4 query heads on 2
 * kv heads, 16 elements, 700 keys, so that a row's keys are cut in parts and merged) splits a
 * decode step; kvo_host_attention_run attends each slot's host rows [begin, split) in place and
 * its outputs and log-sum-exps match a double-precision reference, with and without a soft cap.
 * Views without host rows, keys past the committed rows, a slot twice, another dtype and too many
 * rows are refused, naming why. */
static uint16_t bf16_bits(float x) { /* truncated: the reference reads the same value */
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (uint16_t)(u >> 16);
}
static float bf16_float(uint16_t h) {
  const uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

static void host_attention(void) {
  enum { QH = 4, KVH = 2, DIM = 16, SEQ = 768, SL = 2, RF = KVH * DIM, PROMPT = 700 };
  static float keys[2][SL][SEQ][RF]; /* the values every row holds, K then V */
  static uint16_t half[2][SEQ][RF];
  static float rows[2][SEQ][RF];
  float q[SL][QH][DIM], out[SL][QH][DIM], lse[SL][QH];
  const int32_t prompt[SL] = {PROMPT, PROMPT}, one[SL] = {1, 1};
  const int32_t split[SL] = {600, 333};
  const int32_t slots[SL] = {0, 1}, begin[SL] = {17, 0};
  uint64_t rng = 29;
  int type, cap;
  for (type = 0; type < 2; ++type) {
    const kvo_dtype dtype = type == 0 ? KVO_DTYPE_F32 : KVO_DTYPE_BF16;
    kvo_cache_options options;
    kvo_cache_t* cache = NULL;
    kvo_host_attention_t* attention = NULL;
    kvo_layer_view view;
    int s, kv, t, e, h, step;
    MUST(NULL, kvo_cache_options_init(&options, sizeof options));
    options.layers = 2;
    options.kv_heads = KVH;
    options.head_dim = DIM;
    options.max_seq = SEQ;
    options.slots = SL;
    options.dtype = dtype;
    options.resident_layers = 0;
    options.ring_depth = 1;
    options.backend = KVO_BACKEND_HOST;
    MUST(NULL, kvo_cache_create(&options, &cache));
    for (step = 0; step < 2; ++step) {
      int layer;
      if (step == 0) {
        MUST(cache, kvo_begin_step(cache, prompt, SL));
      } else {
        MUST(cache, kvo_begin_step_split(cache, one, split, SL));
      }
      for (layer = 0; layer < 2; ++layer) {
        memset(&view, 0, sizeof view);
        view.struct_size = sizeof view;
        MUST(cache, kvo_acquire(cache, layer, &view, NULL));
        if (step == 1 && layer == 1) break; /* held: attended below */
        for (s = 0; s < SL; ++s) {
          const int n = step == 0 ? PROMPT : 1;
          const int at = step == 0 ? 0 : PROMPT;
          for (kv = 0; kv < 2; ++kv) {
            for (t = 0; t < n; ++t) {
              for (e = 0; e < RF; ++e) {
                float x;
                rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                x = (float)((double)(rng >> 11) / 9007199254740992.0 * 4.0 - 2.0);
                half[kv][t][e] = bf16_bits(x);
                rows[kv][t][e] = type == 0 ? x : bf16_float(half[kv][t][e]);
                if (layer == 1) keys[kv][s][at + t][e] = rows[kv][t][e];
              }
            }
          }
          if (type == 0) {
            MUST(cache, kvo_append(cache, layer, s, rows[0], rows[1], n, NULL));
          } else {
            MUST(cache, kvo_append(cache, layer, s, half[0], half[1], n, NULL));
          }
        }
        MUST(cache, kvo_release(cache, layer, NULL));
      }
      if (step == 0) MUST(cache, kvo_end_step(cache));
    }
    CHECK(view.host_k != NULL && view.split_rows != NULL);
    for (s = 0; s < SL; ++s) {
      for (h = 0; h < QH; ++h) {
        for (e = 0; e < DIM; ++e) {
          rng = rng * 6364136223846793005ull + 1442695040888963407ull;
          q[s][h][e] = (float)((double)(rng >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        }
      }
    }
    for (cap = 0; cap < 2; ++cap) {
      const float scale = 0.3f, softcap = cap ? 2.5f : 0.0f;
      int32_t end[SL];
      end[0] = split[0];
      end[1] = split[1];
      MUST(NULL, kvo_host_attention_create(QH, KVH, DIM, dtype, SL, 2, scale, softcap, &attention));
      MUST(NULL, kvo_host_attention_run(attention, &view, &q[0][0][0], SL, slots, begin, end,
                                        &out[0][0][0], &lse[0][0]));
      for (s = 0; s < SL; ++s) {
        for (h = 0; h < QH; ++h) {
          const int g = h / (QH / KVH);
          double m = -INFINITY, sum = 0, acc[DIM] = {0}, worst = 0;
          static double score[SEQ];
          for (t = begin[s]; t < end[s]; ++t) {
            double dot = 0;
            for (e = 0; e < DIM; ++e) dot += (double)q[s][h][e] * keys[0][s][t][g * DIM + e];
            dot *= scale;
            if (cap) dot = softcap * tanh(dot / softcap);
            score[t] = dot;
            if (dot > m) m = dot;
          }
          for (t = begin[s]; t < end[s]; ++t) {
            const double p = exp(score[t] - m);
            sum += p;
            for (e = 0; e < DIM; ++e) acc[e] += p * keys[1][s][t][g * DIM + e];
          }
          for (e = 0; e < DIM; ++e) {
            const double d = fabs(acc[e] / sum - out[s][h][e]);
            if (d > worst) worst = d;
          }
          CHECK(worst < 2e-5);
          CHECK(fabs((m + log(sum)) / log(2.0) - lse[s][h]) < 2e-5 * (1 + fabs(lse[s][h])));
        }
      }
      /* Refused, naming why. */
      end[1] = PROMPT + 1;
      EXPECT_STATUS(NULL,
                    kvo_host_attention_run(attention, &view, &q[0][0][0], SL, slots, begin, end,
                                           &out[0][0][0], NULL),
                    KVO_ERROR_INVALID_ARGUMENT, "committed rows");
      end[1] = split[1];
      {
        const int32_t twice[SL] = {1, 1};
        EXPECT_STATUS(NULL,
                      kvo_host_attention_run(attention, &view, &q[0][0][0], SL, twice, begin, end,
                                             &out[0][0][0], NULL),
                      KVO_ERROR_INVALID_ARGUMENT, "given twice");
      }
      EXPECT_STATUS(NULL,
                    kvo_host_attention_run(attention, &view, &q[0][0][0], SL + 1, slots, begin, end,
                                           &out[0][0][0], NULL),
                    KVO_ERROR_INVALID_ARGUMENT, "takes 1 to 2");
      kvo_host_attention_destroy(attention);
    }
    /* Another dtype's attention; a view with no host rows (layer 0 of a prefill). */
    MUST(NULL, kvo_host_attention_create(QH, KVH, DIM, type == 0 ? KVO_DTYPE_BF16 : KVO_DTYPE_F32,
                                         1, 0, 0.0f, 0.0f, &attention));
    EXPECT_STATUS(NULL,
                  kvo_host_attention_run(attention, &view, &q[0][0][0], 1, slots, begin, split,
                                         &out[0][0][0], NULL),
                  KVO_ERROR_INVALID_ARGUMENT, "this attention reads");
    view.host_k = NULL;
    EXPECT_STATUS(NULL,
                  kvo_host_attention_run(attention, &view, &q[0][0][0], 1, slots, begin, split,
                                         &out[0][0][0], NULL),
                  KVO_ERROR_INVALID_ARGUMENT, "has no host rows");
    kvo_host_attention_destroy(attention);
    kvo_host_attention_destroy(NULL); /* a no-op */
    EXPECT_STATUS(NULL, kvo_host_attention_create(3, 2, DIM, dtype, 1, 0, 0.0f, 0.0f, &attention),
                  KVO_ERROR_INVALID_ARGUMENT, "not a multiple");
    CHECK(attention == NULL);
    MUST(cache, kvo_abort_step(cache, NULL));
    kvo_cache_destroy(cache);
  }
}

/* A tensor-parallel rank: heads [kv_head_begin, + kv_heads) of model_kv_heads, on one of
 * ranks_per_node ranks. The plan reports them; a range past the model is refused; a context saved
 * by one rank is refused by a cache holding another rank's heads, naming both ranges. */
static void shard(void) {
  kvo_cache_options options = small_options(5);
  kvo_cache_t* rank0 = NULL;
  kvo_cache_t* rank1 = NULL;
  kvo_cache_t* bad = NULL;
  kvo_cache_stats stats;
  int32_t n[SLOTS] = {0};
  int32_t count = -1;
  const char* path = "c_api_test_shard.kvo";
  float rows[3 * KV_HEADS * HEAD_DIM];
  int i;
  CHECK(options.kv_head_begin == 0 && options.model_kv_heads == 0 && options.ranks_per_node == 1);
  options.model_kv_heads = 2 * KV_HEADS;
  options.ranks_per_node = 2;
  options.kv_head_begin = KV_HEADS + 1; /* [KV_HEADS + 1, 2 KV_HEADS + 1): past the model */
  EXPECT_STATUS(NULL, kvo_cache_create(&options, &bad), KVO_ERROR_INVALID_ARGUMENT,
                "CacheConfig.shard holds KV heads");
  CHECK(bad == NULL);
  options.kv_head_begin = 0;
  MUST(NULL, kvo_cache_create(&options, &rank0));
  options.kv_head_begin = KV_HEADS;
  MUST(NULL, kvo_cache_create(&options, &rank1));
  stats.struct_size = sizeof stats;
  MUST(rank1, kvo_stats(rank1, &stats));
  CHECK(stats.kv_head_begin == KV_HEADS && stats.model_kv_heads == 2 * KV_HEADS);
  CHECK(stats.ranks_per_node == 2 && stats.host_share_bytes > 0);
  for (i = 0; i < 3 * KV_HEADS * HEAD_DIM; ++i) rows[i] = (float)i;
  n[0] = 3;
  MUST(rank1, kvo_begin_step(rank1, n, SLOTS));
  for (i = 0; i < LAYERS; ++i) {
    kvo_layer_view view;
    view.struct_size = sizeof view;
    MUST(rank1, kvo_acquire(rank1, i, &view, NULL));
    MUST(rank1, kvo_append(rank1, i, 0, rows, rows, 3, NULL));
    MUST(rank1, kvo_release(rank1, i, NULL));
  }
  MUST(rank1, kvo_end_step(rank1));
  MUST(rank1, kvo_save_slot(rank1, 0, path, NULL, 0, "model=c-test"));
  EXPECT_STATUS(rank0, kvo_load_slot(rank0, 0, path, "model=c-test", NULL, 0, &count),
                KVO_ERROR_INVALID_ARGUMENT,
                "holding KV heads [2, 4) of 4, this one holds KV heads [0, 2) of 4");
  kvo_cache_destroy(rank0);
  kvo_cache_destroy(rank1);
  remove(path);
}

int main(void) {
  check_defaults();
  calls_without_a_cache();
  shard();
  quantized_rows();
  window_layers();
  split_attention();
  host_attention();
  run(1, 0);
  run(2, 1);
  run(3, 1);
  kvo_cache_destroy(NULL); /* a no-op */
  if (failures > 0) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("all checks passed\n");
  return 0;
}
