// The CUDA path against the host path on the same synthetic weights. Skipped without a GPU.
#include "kvoffload/types.hpp"
#include "model/model_test_util.hpp"

namespace kvo::model {
namespace {

void compare_backends(DType dtype, int slots, double tolerance) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  ModelConfig c = testing::small_config();
  c.vocab_size = 1000;
  DecoderOptions o = testing::host_options(300, slots);
  o.override_dtype = true;
  o.dtype = dtype;
  o.chunk = 64;
  o.resident_layers = 1;
  Decoder host(c, WeightSource{"", 17}, o);
  o.backend = BackendKind::kCuda;
  Decoder cuda(c, WeightSource{"", 17}, o);
  ASSERT_EQ(cuda.backend(), BackendKind::kCuda);
  std::vector<float> a(static_cast<std::size_t>(slots) * c.vocab_size), b(a.size());
  std::vector<std::int32_t> next(static_cast<std::size_t>(slots));
  for (int s = 0; s < slots; ++s) {
    const auto prompt = testing::random_prompt(150 + 40 * s, c.vocab_size, 30 + s);
    host.prefill(s, prompt, a.data() + s * c.vocab_size);
    cuda.prefill(s, prompt, b.data() + s * c.vocab_size);
    EXPECT_LT(testing::relative_error(b.data() + s * c.vocab_size, a.data() + s * c.vocab_size,
                                      c.vocab_size),
              tolerance)
        << "prefill slot " << s;
    next[s] = argmax(a.data() + s * c.vocab_size, c.vocab_size);
  }
  for (int step = 0; step < 5; ++step) {
    host.decode(next, a.data());
    cuda.decode(next, b.data());
    for (int s = 0; s < slots; ++s) {
      EXPECT_LT(testing::relative_error(b.data() + s * c.vocab_size, a.data() + s * c.vocab_size,
                                        c.vocab_size),
                tolerance)
          << "decode step " << step << " slot " << s;
      next[s] = argmax(a.data() + s * c.vocab_size, c.vocab_size);
    }
  }
}

TEST(CudaModel, MatchesHostPathF32) {
  compare_backends(DType::kF32, 2, 2e-3);
}
TEST(CudaModel, MatchesHostPathBf16) {
  compare_backends(DType::kBF16, 3, 3e-2);
}

}  // namespace
}  // namespace kvo::model
