/* A C program that knows kvoffload only through the installed header and library: one prefill and
 * one decode step on the host backend, the rows read back through the view and compared. */
#include <stdio.h>
#include <string.h>

#include <kvoffload/kvoffload.h>

#define LAYERS 3
#define KV_HEADS 2
#define HEAD_DIM 4
#define ROW (KV_HEADS * HEAD_DIM)
#define PROMPT 5

static int fail(const kvo_cache_t* cache, const char* what) {
  fprintf(stderr, "consumer: %s: %s\n", what, kvo_last_error(cache));
  return 1;
}

/* The value of element i of token t of layer l, tensor kv (0: K, 1: V). */
static float value(int l, int kv, int t, int i) {
  return (float)(l * 1000 + kv * 500 + t * 10 + i);
}

static int step(kvo_cache_t* cache, int first, int32_t count) {
  float k[PROMPT * ROW], v[PROMPT * ROW], got[ROW];
  int l, t, i;
  if (kvo_begin_step(cache, &count, 1) != KVO_OK) return fail(cache, "kvo_begin_step");
  for (l = 0; l < LAYERS; ++l) {
    kvo_layer_view view;
    view.struct_size = sizeof view;
    if (kvo_acquire(cache, l, &view, NULL) != KVO_OK) return fail(cache, "kvo_acquire");
    for (t = 0; t < count; ++t) {
      for (i = 0; i < ROW; ++i) {
        k[t * ROW + i] = value(l, 0, first + t, i);
        v[t * ROW + i] = value(l, 1, first + t, i);
      }
    }
    if (kvo_append(cache, l, 0, k, v, count, NULL) != KVO_OK) return fail(cache, "kvo_append");
    for (t = 0; t < first + count; ++t) {
      const float* row = (const float*)view.v + t * view.token_stride;
      memcpy(got, row, sizeof(got));
      for (i = 0; i < ROW; ++i) {
        if (got[i] != value(l, 1, t, i)) {
          fprintf(stderr, "consumer: layer %d token %d element %d: %g\n", l, t, i, got[i]);
          return 1;
        }
      }
    }
    if (kvo_release(cache, l, NULL) != KVO_OK) return fail(cache, "kvo_release");
  }
  return kvo_end_step(cache) == KVO_OK ? 0 : fail(cache, "kvo_end_step");
}

int main(void) {
  kvo_cache_options options;
  kvo_cache_t* cache = NULL;
  int32_t length = 0;
  int failed;
  if (strcmp(kvo_version(), KVO_EXPECTED_VERSION) != 0) {
    fprintf(stderr, "consumer: kvo_version() is %s, expected %s\n", kvo_version(),
            KVO_EXPECTED_VERSION);
    return 1;
  }
  if (kvo_cache_options_init(&options, sizeof options) != KVO_OK) {
    return fail(NULL, "kvo_cache_options_init");
  }
  options.layers = LAYERS;
  options.kv_heads = KV_HEADS;
  options.head_dim = HEAD_DIM;
  options.max_seq = 16;
  options.dtype = KVO_DTYPE_F32;
  options.resident_layers = 0;
  options.ring_depth = 1;
  options.backend = KVO_BACKEND_HOST;
  if (kvo_cache_create(&options, &cache) != KVO_OK) return fail(NULL, "kvo_cache_create");
  failed = step(cache, 0, PROMPT) || step(cache, PROMPT, 1);
  if (!failed && (kvo_length(cache, 0, &length) != KVO_OK || length != PROMPT + 1)) {
    failed = fail(cache, "kvo_length");
  }
  kvo_cache_destroy(cache);
  if (!failed) printf("kvoffload %s: %d tokens through %d layers\n", kvo_version(), length, LAYERS);
  return failed;
}
