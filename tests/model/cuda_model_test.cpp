// The CUDA path against the host path on the same synthetic weights: logits after prefill
// (several chunk sizes, GQA ratios, dtypes, starting positions, a sliding window, the families
// and the rope scalings whose tables change with the length) and decode,
// with most layers streamed through the staging ring; FlashInfer's kernels against the built-in
// ones over contexts of several thousand tokens; and device sampling against host sampling.
// Skipped without a GPU.
//
// Tolerances. Against the host path (f32 arithmetic over the same weights), a bf16 run differs by
// the rounding of every activation that is stored in bf16 (K/V rows, GEMM inputs: u = 2^-9 each)
// and, with FlashInfer, of the attention weights and output (2u max|v| per attention, see
// cuda_attention_test.cpp). Through a few layers and the final projection these add to a few
// percent of the logits' range at most: 3e-2 (bf16), 1e-2 (f16: u = 2^-12), 2e-3 (f32: cuBLAS
// and the host sum in different orders).
#include <cmath>
#include <functional>

#include "cuda_required.hpp"
#include "kvoffload/quant.hpp"
#include "kvoffload/types.hpp"
#include "model/decoder/memory_plan.hpp"
#include "model/families/family.hpp"
#include "model/model_test_util.hpp"

namespace kvo::model {
namespace {

struct Case {
  DType dtype = DType::kF32;
  DType kv_dtype = DType::kF32;  // used when quantized (fp8, int8); else the weights' dtype
  int slots = 1;
  double tolerance = 2e-3;
  int layers = 5;  // 1 resident, 4 streamed through a ring of 2
  int heads = 4;
  int kv_heads = 2;
  int head_dim = 16;
  int chunk = 64;
  int sliding_window = 0;
  int prompt = 150;      // slot s prefills prompt + 40 s tokens...
  int continuation = 0;  // ...then, when > 0, this many more in a second prefill
  std::function<void(ModelConfig&)> family;  // another family or rope scaling, when set
  SplitOptions split;                        // split attention at decode, on both paths
};

void compare_backends(const Case& k) {
  KVO_SKIP_WITHOUT_CUDA();
  ModelConfig c = testing::small_config();
  c.vocab_size = 1000;
  c.layers = k.layers;
  c.heads = k.heads;
  c.kv_heads = k.kv_heads;
  c.head_dim = k.head_dim;
  c.sliding_window = k.sliding_window;
  if (k.family) k.family(c);
  DecoderOptions o = testing::host_options(1200, k.slots);
  o.override_dtype = true;
  o.dtype = k.dtype;
  o.override_kv_dtype = is_quantized(k.kv_dtype);
  o.kv_dtype = k.kv_dtype;
  o.chunk = k.chunk;
  o.resident_layers = 1;
  o.split = k.split;
  Decoder host(c, WeightSource{"", 17}, o);
  o.backend = BackendKind::kCuda;
  Decoder cuda(c, WeightSource{"", 17}, o);
  ASSERT_EQ(cuda.backend(), BackendKind::kCuda);
  const CachePlan plan = cuda.cache().stats().plan;
  EXPECT_EQ(plan.resident_layers, 1);
  // Streamed: the ring really runs on CUDA (window layers stay on the device as windows).
  EXPECT_EQ(plan.streamed_layers, k.layers - 1 - plan.window_layers);
  const int vocab = c.vocab_size;
  std::vector<float> a(static_cast<std::size_t>(k.slots) * vocab), b(a.size());
  std::vector<std::int32_t> next(static_cast<std::size_t>(k.slots));
  for (int s = 0; s < k.slots; ++s) {
    std::vector<std::vector<std::int32_t>> parts = {
        testing::random_prompt(k.prompt + 40 * s, vocab, 30 + s)};
    if (k.continuation > 0) parts.push_back(testing::random_prompt(k.continuation, vocab, 90 + s));
    for (const auto& part : parts) {
      host.prefill(s, part, a.data() + s * vocab);
      cuda.prefill(s, part, b.data() + s * vocab);
      EXPECT_LT(testing::relative_error(b.data() + s * vocab, a.data() + s * vocab, vocab),
                k.tolerance)
          << "prefill slot " << s << " at " << cuda.length(s);
    }
    next[s] = argmax(a.data() + s * vocab, vocab);
  }
  for (int step = 0; step < 5; ++step) {
    host.decode(next, a.data());
    cuda.decode(next, b.data());
    for (int s = 0; s < k.slots; ++s) {
      EXPECT_LT(testing::relative_error(b.data() + s * vocab, a.data() + s * vocab, vocab),
                k.tolerance)
          << "decode step " << step << " slot " << s;
      next[s] = argmax(a.data() + s * vocab, vocab);
    }
  }
}

// The small config as a model of family `model_type`, with the family's defaults.
void become(ModelConfig& c, const char* model_type) {
  const Family& f = family_of_model_type(model_type, "test");
  c.architecture = f.architectures.front();
  c.model_type = f.model_type;
  c.qkv_bias = c.o_bias = false;
  f.settle(c);
}

TEST(CudaModel, MatchesHostPathF32) {
  compare_backends(Case{});
}
// Each family's block and each length-dependent rope on the device: Qwen3's per-head norms under
// yarn's scaled cos and sin, Phi-3's fused projections under longrope (its long factors from
// position 128, inside the prompt), dynamic NTK growing past 128 during decode.
TEST(CudaModel, FamiliesAndRopeScalingsMatchTheHost) {
  const auto family = [](const char* model_type) {
    return [model_type](ModelConfig& c) {
      become(c, model_type);
      c.max_position_embeddings = 512;
      RopeScaling& r = c.rope_scaling;
      r = RopeScaling{};
      r.original_max_position = 128;
      if (c.model_type == "qwen3") {
        r.type = RopeType::kYarn;
        r.factor = 4;
        r.attention_factor = 0.1 * std::log(4.0) + 1;
      } else if (c.model_type == "phi3") {
        r.type = RopeType::kLongRope;
        r.factor = 4;
        r.attention_factor = std::sqrt(1 + std::log(4.0) / std::log(128.0));
        for (int i = 0; i < c.head_dim / 2; ++i) {
          r.short_factor.push_back(1 + 0.05 * i);
          r.long_factor.push_back(1 + 0.7 * i);
        }
      } else {
        r.type = RopeType::kDynamic;
        r.factor = 2;
        c.max_position_embeddings = 152;  // the 150-token prompt, then growth in decode
      }
    };
  };
  for (const char* model_type : {"qwen3", "phi3", "llama"}) {
    SCOPED_TRACE(model_type);
    Case k;
    k.family = family(model_type);
    compare_backends(k);
  }
}
// Gemma 2 and Gemma 3 on the device in bf16 at head_dim 256, where FlashInfer attends: Gemma 2's
// soft-capped scores (a cap of 2, which tanh bends) through its run-time variant, the window
// layers (40 keys on three of five layers) kept as windows in the cache, rows moving to the
// front of their buffers as two slots' prompts, continuations and decode pass them.
TEST(CudaModel, GemmaFamiliesThroughFlashInferMatchTheHost) {
  for (const char* model_type : {"gemma2", "gemma3_text"}) {
    SCOPED_TRACE(model_type);
    Case k;
    k.dtype = DType::kBF16;
    k.tolerance = 3e-2;
    k.head_dim = 256;
    k.slots = 2;
    k.sliding_window = 40;
    k.continuation = 70;
    k.family = [model_type](ModelConfig& c) {
      become(c, model_type);
      c.sliding_layers = {1, 0, 1, 1, 0};
      if (c.model_type == "gemma2") {
        c.attn_softcap = 2;
        c.query_pre_attn_scalar = 200;
      }
    };
    compare_backends(k);
  }
}
// Split attention on the device: each streamed layer's first 64 rows attended by the host pool
// from the host store while the device attends the rest (the built-in kernels, with their
// log-sum-exps), merged on the device; against the host path splitting the same way. f32 and bf16
// (FlashInfer elsewhere, the built-in kernels for the split layers), two slots.
TEST(CudaModel, SplitAttentionMatchesTheHost) {
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Case k;
    k.dtype = dtype;
    k.tolerance = dtype == DType::kF32 ? 2e-3 : 3e-2;
    k.slots = 2;
    k.head_dim = dtype == DType::kF32 ? 16 : 64;
    k.split.mode = SplitMode::kRows;
    k.split.rows = 64;
    compare_backends(k);
  }
}
TEST(CudaModel, MatchesHostPathBf16) {
  Case k;
  k.dtype = DType::kBF16;
  k.slots = 3;
  k.tolerance = 3e-2;
  compare_backends(k);
}
// Quantized K/V: the device quantizes the rows to the host's bits (cuda_quant_test.cpp), so what
// differs is the attention's f32 arithmetic and cuBLAS's sum order, as in f32; a quantized row
// that straddles a rounding boundary in one path and not the other moves one element by a step,
// which the bf16 tolerance covers.
TEST(CudaModel, MatchesHostPathWithFp8AndInt8Kv) {
  for (DType kv : {DType::kFP8E4M3, DType::kInt8}) {
    Case k;
    k.dtype = DType::kF32;
    k.kv_dtype = kv;
    k.slots = 2;
    k.tolerance = 3e-2;
    compare_backends(k);
  }
}

TEST(CudaModel, PrefillOverSeveralKeyBlocksF16Gqa4) {
  Case k;  // 700-token prompts in chunks of 300: chunks and key blocks cross each other
  k.dtype = DType::kF16;
  k.tolerance = 1e-2;
  k.heads = 8;
  k.kv_heads = 2;
  k.chunk = 300;
  k.prompt = 700;
  compare_backends(k);
}
TEST(CudaModel, PrefillWithoutGroupingAndSmallChunks) {
  Case k;  // heads == kv_heads, one-row and odd chunks, a second prefill at position 333
  k.heads = 4;
  k.kv_heads = 4;
  k.chunk = 7;
  k.prompt = 333;
  k.continuation = 290;
  compare_backends(k);
}
TEST(CudaModel, PrefillHonoursTheSlidingWindow) {
  Case k;  // Mistral: keys before position - window + 1 are masked, whole blocks skipped
  k.dtype = DType::kBF16;
  k.tolerance = 3e-2;
  k.heads = 4;
  k.kv_heads = 1;
  k.chunk = 256;
  k.sliding_window = 100;
  k.prompt = 600;
  k.continuation = 50;
  compare_backends(k);
}
TEST(CudaModel, FlashInferLlama3HeadsGqa4Bf16) {
  Case k;  // head_dim 128, 8 KV heads, 4 query heads each: FlashInfer's kernels
  k.dtype = DType::kBF16;
  k.tolerance = 3e-2;
  k.heads = 32;
  k.kv_heads = 8;
  k.head_dim = 128;
  k.layers = 4;  // 1 resident, 3 streamed
  k.slots = 2;
  k.chunk = 256;
  k.prompt = 500;
  k.continuation = 70;
  compare_backends(k);
}
TEST(CudaModel, FlashInferHeadDim64GroupOf3F16) {
  Case k;  // SmolLM2's attention shape
  k.dtype = DType::kF16;
  k.tolerance = 1e-2;
  k.heads = 9;
  k.kv_heads = 3;
  k.head_dim = 64;
  k.chunk = 100;
  k.prompt = 333;
  k.sliding_window = 200;
  compare_backends(k);
}

// FlashInfer's kernels against the built-in ones on the same bf16 weights, over a context of
// several thousand tokens (several of the built-in prefill's key blocks, a decode split over the
// GPU): the two differ only in attention's rounding.
TEST(CudaModel, FlashInferMatchesTheBuiltInKernelsOverLongContexts) {
  KVO_SKIP_WITHOUT_CUDA();
  ModelConfig c = testing::small_config();
  c.vocab_size = 1000;
  c.layers = 4;
  c.heads = 32;
  c.kv_heads = 8;
  c.head_dim = 128;
  DecoderOptions o = testing::host_options(9000, 2);
  o.backend = BackendKind::kCuda;
  o.override_dtype = true;
  o.dtype = DType::kBF16;
  o.chunk = 1024;
  o.resident_layers = 1;
  Decoder fast(c, WeightSource{"", 5}, o);
  o.builtin_attention = true;
  Decoder builtin(c, WeightSource{"", 5}, o);
  ASSERT_NE(fast.attention_kernels(), builtin.attention_kernels());
  EXPECT_EQ(fast.attention_kernels().rfind("FlashInfer", 0), 0u) << fast.attention_kernels();
  const int vocab = c.vocab_size;
  std::vector<float> a(2 * static_cast<std::size_t>(vocab)), b(a.size());
  std::vector<std::int32_t> next(2);
  for (int s = 0; s < 2; ++s) {
    const auto prompt = testing::random_prompt(s == 0 ? 8300 : 2100, vocab, 40 + s);
    fast.prefill(s, prompt, a.data() + s * vocab);
    builtin.prefill(s, prompt, b.data() + s * vocab);
    EXPECT_LT(testing::relative_error(a.data() + s * vocab, b.data() + s * vocab, vocab), 3e-2)
        << "prefill slot " << s;
    next[s] = argmax(b.data() + s * vocab, vocab);
  }
  for (int step = 0; step < 8; ++step) {
    fast.decode(next, a.data());
    builtin.decode(next, b.data());
    for (int s = 0; s < 2; ++s) {
      EXPECT_LT(testing::relative_error(a.data() + s * vocab, b.data() + s * vocab, vocab), 3e-2)
          << "decode step " << step << " slot " << s;
      next[s] = argmax(b.data() + s * vocab, vocab);
    }
  }
}

TEST(CudaModel, PrefillOneRowChunks) {
  Case k;
  k.chunk = 1;
  k.prompt = 40;
  compare_backends(k);
}

// Device sampling against host sampling of the same logits: the CUDA decoder runs twice in
// lockstep, once handing its logits to sample_token, once drawing on the device. Greedy must
// agree exactly; seeded draws share the counter-based RNG, so they agree too unless a draw lands
// within float rounding of a cumulative boundary (the device sums in float, the host in double).
void compare_sampling(const SamplingParams& params, int allowed_mismatches) {
  KVO_SKIP_WITHOUT_CUDA();
  ModelConfig c = testing::small_config();
  c.vocab_size = 3000;
  const int slots = 3;
  DecoderOptions o = testing::host_options(400, slots);
  o.backend = BackendKind::kCuda;
  o.chunk = 64;
  Decoder logits_run(c, WeightSource{"", 23}, o);
  Decoder sampled_run(c, WeightSource{"", 23}, o);
  const std::uint64_t seed = 77;
  sampled_run.set_sampling(params, seed);
  const int vocab = c.vocab_size;
  std::vector<float> logits(static_cast<std::size_t>(slots) * vocab);
  std::vector<float> scratch;
  std::vector<std::int32_t> next(slots), device(slots, -1);
  int draws = 0, mismatches = 0;
  for (int s = 0; s < slots; ++s) {
    const auto prompt = testing::random_prompt(60 + 25 * s, vocab, 5 + s);
    logits_run.prefill(s, prompt, logits.data() + s * vocab);
    next[s] = sample_token(logits.data() + s * vocab, vocab, params,
                           sampling_uniform(seed, static_cast<std::uint64_t>(s), 0), scratch);
    device[s] = sampled_run.prefill_sample(s, prompt);
    ++draws;
    mismatches += device[s] != next[s];
  }
  for (int step = 1; step < 25; ++step) {
    logits_run.decode(next, logits.data());
    sampled_run.decode_sample(next, device.data());
    for (int s = 0; s < slots; ++s) {
      next[s] = sample_token(
          logits.data() + s * vocab, vocab, params,
          sampling_uniform(seed, static_cast<std::uint64_t>(s), static_cast<std::uint64_t>(step)),
          scratch);
      ++draws;
      mismatches += device[s] != next[s];
    }
  }
  EXPECT_LE(mismatches, allowed_mismatches) << "of " << draws << " draws";
}

TEST(CudaSampling, GreedyMatchesTheHostExactly) {
  compare_sampling(SamplingParams{}, 0);
}
TEST(CudaSampling, TemperatureMatchesTheHost) {
  compare_sampling(SamplingParams{0.7f, 0, 1.0f}, 1);
}
TEST(CudaSampling, TopKAndTopPMatchTheHost) {
  compare_sampling(SamplingParams{1.3f, 40, 1.0f}, 1);
  compare_sampling(SamplingParams{1.0f, 0, 0.8f}, 1);
  compare_sampling(SamplingParams{0.9f, 200, 0.6f}, 1);
}

}  // namespace
}  // namespace kvo::model
