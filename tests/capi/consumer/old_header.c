/* Built against a copy of kvoffload.h without its newest fields (every field a "Since" comment
 * introduces), then run against the current library: the library must read and write only what
 * this older caller's structs hold, and give what they lack its defaults. Each struct sits in a
 * buffer with guard bytes after it, which must survive every call. */
#include <stdio.h>
#include <string.h>

#include <kvoffload/kvoffload.h>

#define GUARD 64
#define LAYERS 4
#define KV_HEADS 2
#define HEAD_DIM 4
#define ROW (KV_HEADS * HEAD_DIM)

static int failures = 0;
#define CHECK(cond)                                             \
  do {                                                          \
    if (!(cond)) {                                              \
      fprintf(stderr, "old_header: %d: %s\n", __LINE__, #cond); \
      ++failures;                                               \
    }                                                           \
  } while (0)

static int guards_intact(const unsigned char* buffer, size_t size) {
  size_t i;
  for (i = size; i < size + GUARD; ++i) {
    if (buffer[i] != 0xab) return 0;
  }
  return 1;
}

int main(void) {
  union {
    kvo_cache_options options;
    unsigned char bytes[sizeof(kvo_cache_options) + GUARD];
  } o;
  union {
    kvo_layer_view view;
    unsigned char bytes[sizeof(kvo_layer_view) + GUARD];
  } v;
  union {
    kvo_cache_stats stats;
    unsigned char bytes[sizeof(kvo_cache_stats) + GUARD];
  } s;
  kvo_cache_t* cache = NULL;
  float k[3 * ROW], vv[3 * ROW];
  int32_t n = 3;
  int layer, i;
  memset(&o, 0xab, sizeof o);
  memset(&v, 0xab, sizeof v);
  memset(&s, 0xab, sizeof s);

  CHECK(kvo_cache_options_init(&o.options, sizeof o.options) == KVO_OK);
  CHECK(o.options.struct_size == sizeof o.options);
  CHECK(guards_intact(o.bytes, sizeof o.options));
  o.options.layers = LAYERS;
  o.options.kv_heads = KV_HEADS;
  o.options.head_dim = HEAD_DIM;
  o.options.max_seq = 16;
  o.options.dtype = KVO_DTYPE_F32;
  o.options.resident_layers = 1;
  o.options.backend = KVO_BACKEND_HOST;
  if (kvo_cache_create(&o.options, &cache) != KVO_OK) {
    fprintf(stderr, "old_header: kvo_cache_create: %s\n", kvo_last_error(NULL));
    return 1;
  }
  for (i = 0; i < 3 * ROW; ++i) {
    k[i] = (float)i;
    vv[i] = (float)(1000 + i);
  }
  CHECK(kvo_begin_step(cache, &n, 1) == KVO_OK);
  for (layer = 0; layer < LAYERS; ++layer) {
    v.view.struct_size = sizeof v.view;
    CHECK(kvo_acquire(cache, layer, &v.view, NULL) == KVO_OK);
    CHECK(guards_intact(v.bytes, sizeof v.view));
    CHECK(v.view.head_dim == HEAD_DIM && v.view.token_stride == ROW);
    CHECK(kvo_append(cache, layer, 0, k, vv, 3, NULL) == KVO_OK);
    CHECK(((const float*)v.view.v)[2 * ROW + 1] == vv[2 * ROW + 1]); /* V at K's strides */
    CHECK(kvo_release(cache, layer, NULL) == KVO_OK);
  }
  CHECK(kvo_end_step(cache) == KVO_OK);
  s.stats.struct_size = sizeof s.stats;
  CHECK(kvo_stats(cache, &s.stats) == KVO_OK);
  CHECK(guards_intact(s.bytes, sizeof s.stats));
  CHECK(s.stats.steps == 1 && s.stats.row_bytes == ROW * sizeof(float));
  /* A struct_size below any version of the struct is refused, naming the field. */
  s.stats.struct_size = 4;
  CHECK(kvo_stats(cache, &s.stats) == KVO_ERROR_INVALID_ARGUMENT);
  CHECK(strstr(kvo_last_error(cache), "struct_size") != NULL);
  kvo_cache_destroy(cache);
  if (failures == 0) {
    printf("old header (options %u, view %u, stats %u bytes) against library %s: ok\n",
           (unsigned)sizeof o.options, (unsigned)sizeof v.view, (unsigned)sizeof s.stats,
           kvo_version());
  }
  return failures == 0 ? 0 : 1;
}
