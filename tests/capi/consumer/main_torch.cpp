// A LibTorch program that knows kvoffload only through the installed package: a prefill and a
// decode through the adapter, the returned keys compared with what went in.
#include <ATen/ATen.h>

#include <cstdio>

#include <kvoffload/torch.hpp>

int main() {
  kvo::CacheConfig config;
  config.layers = 2;
  config.kv_heads = 2;
  config.head_dim = 8;
  config.max_seq = 16;
  config.slots = 1;
  config.dtype = kvo::DType::kF32;
  config.resident_layers = 0;
  config.ring_depth = 1;
  config.backend = kvo::BackendKind::kHost;
  kvo::torch::OffloadedStaticCache cache(config);
  at::Tensor all[2];
  for (std::int64_t n : {4, 1}) {
    for (int layer = 0; layer < config.layers; ++layer) {
      const at::Tensor k = at::randn({1, 2, n, 8});
      all[layer] = all[layer].defined() ? at::cat({all[layer], k}, 2) : k;
      auto [keys, values] = cache.update(k, k, layer);
      if (!at::equal(keys, all[layer]) || !at::equal(values, all[layer])) {
        std::fprintf(stderr, "consumer: layer %d returned other rows\n", layer);
        return 1;
      }
    }
  }
  std::printf("kvoffload %s (LibTorch): %lld tokens\n", kvo::version(),
              static_cast<long long>(cache.get_seq_length()));
  return cache.get_seq_length() == 5 ? 0 : 1;
}
