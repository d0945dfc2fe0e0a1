// A C++ program that knows kvoffload only through the installed package: the C++ API.
#include <cstdio>
#include <vector>

#include <kvoffload/kvoffload.hpp>

int main() {
  kvo::CacheConfig config;
  config.layers = 4;
  config.kv_heads = 1;
  config.head_dim = 8;
  config.max_seq = 32;
  config.dtype = kvo::DType::kF16;
  config.resident_layers = 1;
  config.backend = kvo::BackendKind::kHost;
  try {
    kvo::OffloadedStaticCache cache(config);
    const std::vector<std::uint16_t> rows(3 * 8, 0x3c00);  // three rows of 1.0 in f16
    for (int n : {3, 1}) {
      cache.begin_step({n});
      for (int layer = 0; layer < config.layers; ++layer) {
        cache.acquire(layer);
        cache.append(layer, 0, rows.data(), rows.data(), n);
        cache.release(layer);
      }
      cache.end_step();
    }
    if (cache.length(0) != 4 || cache.stats().steps != 2) {
      std::fprintf(stderr, "consumer: length %d after 2 steps\n", cache.length(0));
      return 1;
    }
    std::printf("kvoffload %s (C++): %d tokens, %llu bytes written back\n", kvo::version(),
                cache.length(0), static_cast<unsigned long long>(cache.stats().d2h_bytes_total));
  } catch (const kvo::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
  return 0;
}
