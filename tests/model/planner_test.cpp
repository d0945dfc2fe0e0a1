// The memory planner: what it plans is what the decoder allocates, to the byte; R is the largest
// that fits; the comparison strategies follow their own formulas; bad input is a clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "expect_error.hpp"
#include "kvoffload/kvoffload.hpp"
#include "kvoffload/planner.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/checkpoint/weight_formats.hpp"
#include "model/decoder/decoder.hpp"
#include "model/decoder/memory_plan.hpp"
#include "model/host/host_gemm_q8.hpp"
#include "model/host/host_kernels.hpp"
#include "model/host/host_linear.hpp"
#include "model/host/host_workspace.hpp"
#include "model/host/thread_pool.hpp"

namespace kvo {
namespace {

MemoryQuery tiny(int max_seq, std::uint64_t budget, int slots = 1, int chunk = 64) {
  MemoryQuery q;
  q.model = "tiny";
  q.max_seq = max_seq;
  q.slots = slots;
  q.chunk = chunk;
  q.budget = budget;
  q.backend = BackendKind::kHost;
  return q;
}

std::uint64_t layer_kv_bytes(const MemoryQuery& q) {
  const model::ModelConfig c = model::preset(q.model);
  return 2ull * q.slots * c.kv_heads * q.max_seq * c.head_dim * dtype_size(c.dtype);
}

TEST(Planner, TheDecoderAllocatesExactlyThePlan) {
  const model::ModelConfig config = model::preset("tiny");
  struct Case {
    int max_seq, slots, chunk;
    double budget_in_layers;  // the budget: plan without KV + this many layers of KV
  };
  for (const Case& c : {Case{256, 1, 64, 1e9}, Case{512, 2, 100, 2.5}, Case{1000, 3, 33, 3.2},
                        Case{2048, 1, 512, 4.0}, Case{777, 2, 7, 2.0}}) {
    MemoryQuery q = tiny(c.max_seq, 0, c.slots, c.chunk);
    const MemoryPlan unbounded = plan_memory(q);
    const std::uint64_t non_kv = unbounded.total_bytes - unbounded.kv_device_bytes;
    q.budget = c.budget_in_layers > 100
                   ? 0
                   : non_kv + static_cast<std::uint64_t>(c.budget_in_layers *
                                                         static_cast<double>(layer_kv_bytes(q)));
    // The host path's options reach its scratch: 3 threads and f32 GEMMs in one case.
    q.threads = c.slots == 3 ? 3 : 0;
    q.f32_gemm = c.slots == 3;
    const MemoryPlan plan = plan_memory(q);
    model::Decoder decoder(config, {"", 7}, model::decoder_options(q));
    EXPECT_EQ(decoder.options().threads, q.threads);
    const CacheStats st = decoder.cache().stats();
    EXPECT_EQ(st.plan.device_bytes, plan.total_bytes) << c.max_seq;  // the one arena
    EXPECT_EQ(st.device_allocations, 1u);
    EXPECT_EQ(st.plan.host_bytes, plan.host_bytes);
    EXPECT_EQ(st.plan.resident_layers, plan.resident_layers);
    EXPECT_EQ(decoder.weight_bytes(), plan.weights_bytes);
    EXPECT_EQ(decoder.activation_bytes(), plan.activation_bytes);
    // The host path's scratch, carved from the arena (TheHostWorkspaceIsTheHostPathsScratch).
    EXPECT_GT(plan.workspace_bytes, 0u);
    if (q.budget != 0) {
      EXPECT_LE(plan.total_bytes, q.budget);
    }
  }
}

// On the host backend the plan's workspace is the host path's scratch (host_workspace.hpp), to
// the byte: a layout that carves it fits in it and is refused 256 bytes less; the GEMM
// panels of GGUF blocks and the 8-bit activation rows are in it when asked for.
TEST(Planner, TheHostWorkspaceIsTheHostPathsScratch) {
  const model::ModelConfig config = model::preset("tiny");
  MemoryQuery q = tiny(512, 0, 2, 64);
  const model::DecoderOptions options = model::decoder_options(q);
  const model::DecoderMemory m = model::plan_decoder_memory(config, options, BackendKind::kHost);
  const model::OpsShape shape = model::host_ops_shape(config, options, m);
  EXPECT_EQ(shape.threads, model::available_cores());
  EXPECT_EQ(shape.max_rows, m.max_rows);
  EXPECT_EQ(shape.max_decode_rows, 2);
  const std::uint64_t bytes = model::HostWorkspaceLayout(shape).bytes;
  EXPECT_EQ(m.workspace, bytes);
  EXPECT_EQ(plan_memory(q).workspace_bytes, bytes);
  // At least each thread's row of the widest input (f32 weights are read in place; a decode row
  // of another type is converted there) and the sampler's two rows of the vocabulary.
  const auto in = static_cast<std::uint64_t>(model::widest_input(config));
  const auto threads = static_cast<std::uint64_t>(shape.threads);
  EXPECT_GE(bytes, threads * in * 4 + 2ull * config.vocab_size * 4);
  model::HostRegion region(bytes);
  const model::HostWorkspaceLayout carved(shape, region.data(), bytes);
  EXPECT_EQ(carved.bytes, bytes);
  EXPECT_EQ(carved.linear.panels.size(), static_cast<std::size_t>(shape.threads));
  EXPECT_GE(reinterpret_cast<std::byte*>(carved.linear.panels[0].data()), region.data());
  EXPECT_LE(reinterpret_cast<std::byte*>(carved.sample.end()), region.data() + bytes);
  // (bytes is rounded up to 256: the buffers end within its last 256.)
  kvo::testing::expect_error([&] { model::HostWorkspaceLayout(shape, region.data(), bytes - 256); },
                             ErrorCode::kInternal, "the host workspace needs");

  // Weights in blocks with 8-bit activations: each thread's panel grows to a GEMM tile's
  // kGemmColBlock rows, and the quantized rows come in, a decode batch's and the q8 GEMM's (a
  // chunk's rows, at Q6_K's width); the spans after them start from 64-byte boundaries.
  model::DecoderOptions q8 = options;
  q8.weights_in_blocks = true;
  q8.q8_activations = true;
  const model::DecoderMemory mq = model::plan_decoder_memory(config, q8, BackendKind::kHost);
  const std::uint64_t rows =
      model::HostLinear::kGemmMinRows * model::kernels::q8_activation_bytes(static_cast<int>(in)) +
      static_cast<std::uint64_t>(mq.max_rows) *
          model::q8_gemm::activation_row_bytes(14, static_cast<int>(in));
  const std::uint64_t added = threads * (model::HostLinear::kGemmColBlock - 1) * in * 4 + rows;
  EXPECT_GE(mq.workspace - bytes, added);
  EXPECT_LT(mq.workspace - bytes, added + 3 * 64);
  // The planner's query carries the thread count: a scratch per thread.
  MemoryQuery one = q;
  one.threads = 1;
  if (shape.threads > 1) {
    EXPECT_LT(plan_memory(one).workspace_bytes, bytes);
  }
  // And split attention's regions in the CUDA workspace.
  MemoryQuery cuda = q;
  cuda.backend = BackendKind::kCuda;
  MemoryQuery split = cuda;
  split.split = SplitMode::kAuto;
  EXPECT_GT(plan_memory(split).workspace_bytes, plan_memory(cuda).workspace_bytes);
}

TEST(Planner, KeepsTheLargestResidentCountThatFits) {
  MemoryQuery q = tiny(1024, 0);
  const MemoryPlan unbounded = plan_memory(q);
  ASSERT_EQ(unbounded.resident_layers, 4);
  const std::uint64_t non_kv = unbounded.total_bytes - unbounded.kv_device_bytes;
  for (std::uint64_t kv = 2 * layer_kv_bytes(q); kv <= 5 * layer_kv_bytes(q);
       kv += layer_kv_bytes(q) / 5) {
    q.budget = non_kv + kv;
    const MemoryPlan plan = plan_memory(q);
    EXPECT_LE(plan.total_bytes, q.budget);
    if (plan.resident_layers < 4) {
      MemoryQuery more = q;
      more.budget = 0;
      more.resident_layers = plan.resident_layers + 1;
      EXPECT_GT(plan_memory(more).total_bytes, q.budget) << "R=" << plan.resident_layers;
    }
  }
}

TEST(Planner, WhenEverythingFitsNothingMoves) {
  MemoryQuery q = tiny(512, 0);
  q.budget = plan_memory(q).total_bytes;  // exactly everything resident
  const MemoryPlan plan = plan_memory(q);
  EXPECT_EQ(plan.resident_layers, 4);
  EXPECT_EQ(plan.host_bytes, 0u);
  model::Decoder decoder(model::preset("tiny"), {"", 3}, model::decoder_options(q));
  std::vector<float> logits(4096);
  decoder.prefill(0, std::vector<std::int32_t>(100, 5), logits.data());
  for (int i = 0; i < 5; ++i) decoder.decode({17}, logits.data());
  EXPECT_EQ(decoder.cache().stats().h2d_bytes_total, 0u);
  EXPECT_EQ(decoder.cache().stats().d2h_bytes_total, 0u);
}

// Gemma 3 12B: 40 of its 48 layers are windows of 1024 keys. kvoffload keeps each in a buffer
// of 1023 + chunk + 128 rows (in whole 64s) on the device and plans the 8 full layers as any
// cache's; transformers' caches keep a window's 1024 rows on the device (its offloading skips
// them) and the full layers as their formulas say. The windows are reported apart.
TEST(Planner, WindowLayersAreCountedApart) {
  MemoryQuery q;
  q.model = "gemma3-12b";
  q.max_seq = 131072;
  q.resident_layers = 0;
  const auto plans = compare_strategies(q);
  ASSERT_EQ(plans.size(), 3u);
  // K and V x 8 heads x 256 x bf16 = 8 KiB per token of a layer.
  const std::uint64_t per_token = 8192;
  const std::uint64_t full = per_token * 131072;
  const std::uint64_t hf_window = per_token * 1024;
  const std::uint64_t our_window = per_token * static_cast<std::uint64_t>(window_rows(1024, 512));
  EXPECT_EQ(window_rows(1024, 512), 1664);  // 1023 + 512 + 1023 / 8 rounded up: 1663
  const MemoryPlan& all = plans[0];
  const MemoryPlan& hf = plans[1];
  const MemoryPlan& ours = plans[2];
  EXPECT_EQ(all.window_layers, 40);
  EXPECT_EQ(all.kv_window_bytes, 40 * hf_window);
  EXPECT_EQ(all.kv_device_bytes, 8 * full + 40 * hf_window);
  EXPECT_EQ(hf.kv_device_bytes, 3 * full + 40 * hf_window);
  EXPECT_EQ(hf.host_bytes, 7 * full);
  EXPECT_EQ(ours.window_layers, 40);
  EXPECT_EQ(ours.kv_window_bytes, 40 * our_window);
  EXPECT_EQ(ours.resident_layers, 0);
  EXPECT_EQ(ours.host_bytes, 8 * full);  // the full layers alone cross the bus
  EXPECT_EQ(ours.kv_device_bytes, 2 * full + 40 * our_window);  // a ring of two, the windows
  // A sixth of the full-attention K/V bytes of 48 full layers stays on the host.
  EXPECT_EQ(ours.host_bytes * 6, 48 * full);
}

TEST(Planner, StrategiesFollowTheirFormulas) {
  for (int max_seq : {4096, 32768, 131072}) {
    MemoryQuery q;
    q.model = "llama3-8b";
    q.max_seq = max_seq;
    q.budget = 24ull << 30;
    const auto plans = compare_strategies(q);
    ASSERT_EQ(plans.size(), 3u);
    // 32 layers x K and V x 8 heads x 128 x bf16 = 128 KiB per token; a layer is 4 KiB per token.
    const std::uint64_t layer = 4096ull * max_seq;
    const MemoryPlan& all = plans[0];
    const MemoryPlan& hf = plans[1];
    EXPECT_EQ(all.strategy, Strategy::kAllOnDevice);
    EXPECT_EQ(all.kv_device_bytes, 32 * layer);
    EXPECT_EQ(all.host_bytes, 0u);
    EXPECT_EQ(hf.strategy, Strategy::kHfOffloadedStatic);
    EXPECT_EQ(hf.kv_device_bytes, 3 * layer);  // layer 0 + two full-length buffers
    EXPECT_EQ(hf.host_bytes, 31 * layer);
    for (const MemoryPlan& p : plans) {
      EXPECT_EQ(p.weights_bytes, all.weights_bytes);
      EXPECT_EQ(p.total_bytes,
                p.weights_bytes + p.kv_device_bytes + p.activation_bytes + p.workspace_bytes);
      EXPECT_EQ(p.fits, p.total_bytes <= q.budget);
    }
    EXPECT_EQ(plans[2].strategy, Strategy::kKvoffload);
  }
  // The headline: at 128K on a 24 GiB budget, everything on the device does not fit; kvoffload
  // does. Llama-3-8B's weights are 8.03e9 parameters in bf16.
  MemoryQuery q;
  q.max_seq = 131072;
  q.budget = 24ull << 30;
  const auto plans = compare_strategies(q);
  EXPECT_EQ(plans[0].weights_bytes / 2, 8030261248u);
  EXPECT_FALSE(plans[0].fits);
  EXPECT_TRUE(plans[2].fits);
  EXPECT_GT(plans[2].resident_layers, 0);
  EXPECT_LT(plans[2].resident_layers, 32);
}

// Tensor parallelism: a rank of Llama-3-8B under tp = 2 holds 16 query heads, 4 KV heads, half
// the MLP and half the vocabulary: half of every layer's K/V (8 KV heads x 128 x bf16 x K and V
// over 2), and the weights of those shards (norms whole). Under tp = 16 the 8 KV heads are
// replicated, one a rank: an eighth of the K/V. Shapes that do not divide are refused by name.
TEST(Planner, TensorParallelPlansOneRanksShard) {
  MemoryQuery q;
  q.model = "llama3-8b";
  q.max_seq = 131072;
  q.resident_layers = 0;
  const MemoryPlan whole = plan_memory(q);
  q.tp = 2;
  // Each rank plans with half the machine's available memory, read as it plans: the figure
  // moves while other processes run, so it lies between halves of readings taken around it.
  const std::uint64_t available_before = host_available_bytes();
  const MemoryPlan half = plan_memory(q);
  const std::uint64_t available_after = host_available_bytes();
  EXPECT_EQ(half.tp, 2);
  EXPECT_EQ(half.host_bytes * 2, whole.host_bytes);
  EXPECT_EQ(half.kv_device_bytes * 2, whole.kv_device_bytes);  // the ring's two layers
  // Llama-3-8B: 8.03e9 parameters, 0.26e9 of them in the 128256 x 4096 embeddings and again
  // in the head; the norms (65 x 4096) stay whole.
  const std::uint64_t norms = 2ull * 65 * 4096;
  EXPECT_EQ((half.weights_bytes - norms) * 2, whole.weights_bytes - norms);
  const std::uint64_t slack = std::uint64_t{256} << 20;  // what others may take and give back
  EXPECT_GE(half.host_available_bytes + slack, std::min(available_before, available_after) / 2);
  EXPECT_LE(half.host_available_bytes, std::max(available_before, available_after) / 2 + slack);
  EXPECT_LT(half.host_available_bytes, host_available_bytes() * 3 / 4);  // a half, not the whole
  q.tp = 16;
  const MemoryPlan replicated = plan_memory(q);
  EXPECT_EQ(replicated.host_bytes * 8, whole.host_bytes);
  const auto refused = [&](const std::string& model, int tp, const std::string& needle) {
    MemoryQuery r;
    r.model = model;
    r.tp = tp;
    kvo::testing::expect_error([&] { plan_memory(r); }, ErrorCode::kInvalidArgument, needle);
    kvo::testing::expect_error([&] { compare_strategies(r); }, ErrorCode::kInvalidArgument, needle);
  };
  refused("llama3-8b", 3, "32 query heads do not divide among them");
  refused("qwen2.5-7b", 8, "28 query heads");
  refused("llama3-8b", 0, "1 to 4096 ranks");
  check_tensor_parallel(32, 8, 14336, 4);
  kvo::testing::expect_error([] { check_tensor_parallel(24, 6, 96, 4); },
                             ErrorCode::kInvalidArgument, "6 KV heads neither divide");
  kvo::testing::expect_error([] { check_tensor_parallel(8, 8, 100, 8); },
                             ErrorCode::kInvalidArgument, "an MLP of 100 columns");
}

TEST(Planner, ImpossibleBudgetsNameTheMissingBytes) {
  MemoryQuery q = tiny(1024, 0);
  q.max_prompt = 1024;  // the whole prompt at once: the piece is not planned
  q.resident_layers = 0;
  const MemoryPlan smallest = plan_memory(q);
  q.resident_layers = kAutoResidentLayers;
  q.budget = smallest.total_bytes - 1000;
  try {
    plan_memory(q);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kOutOfMemory);
    EXPECT_NE(std::string(e.what()).find("missing 1000 B"), std::string::npos) << e.what();
  }
  const auto plans = compare_strategies(q);  // no throw: says it does not fit
  EXPECT_FALSE(plans[2].fits);
  // With the piece planned, the same budget holds a prompt prefilled in pieces, and says what
  // the later pieces re-read: k pieces of p rows re-read p k(k - 1) / 2 rows of each streamed
  // layer's K and V.
  MemoryQuery planned = q;
  planned.max_prompt = 0;
  const MemoryPlan pieces = plan_memory(planned);
  EXPECT_TRUE(pieces.fits);
  EXPECT_LE(pieces.total_bytes, q.budget);
  EXPECT_LT(pieces.prefill_piece, 1024);
  const std::uint64_t k = (1024 + pieces.prefill_piece - 1) / pieces.prefill_piece;
  const std::uint64_t row = kv_row_bytes(DType::kF32, 2, 64);
  EXPECT_EQ(pieces.piece_reread_bytes, pieces.prefill_piece * k * (k - 1) / 2 * row * 2 *
                                           static_cast<std::uint64_t>(4 - pieces.resident_layers));
  q.budget = smallest.weights_bytes - 1;
  try {
    plan_memory(q);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the weights alone need"), std::string::npos);
  }
}

TEST(Planner, ModelsByPresetOrConfigAndClearErrors) {
  MemoryQuery q = tiny(256, 0);
  q.model = "no-such-model";
  try {
    plan_memory(q);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("llama3-8b"), std::string::npos) << e.what();
  }
  // A config.json path and its directory plan the same as the preset it was written from.
  const std::string dir = ::testing::TempDir() + "/planner_model";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << model::to_config_json(model::preset("tiny"));
  const std::uint64_t expected = plan_memory(tiny(256, 0)).total_bytes;
  q.model = dir;
  EXPECT_EQ(plan_memory(q).total_bytes, expected);
  q.model = dir + "/config.json";
  EXPECT_EQ(plan_memory(q).total_bytes, expected);
  // The CUDA path has its workspace where the host path has its own, nothing else differs.
  MemoryQuery cuda = tiny(256, 0);
  cuda.backend = BackendKind::kCuda;
  EXPECT_GT(plan_memory(cuda).workspace_bytes, 32u << 20);
  const MemoryPlan host = plan_memory(tiny(256, 0));
  EXPECT_EQ(plan_memory(cuda).total_bytes - plan_memory(cuda).workspace_bytes,
            expected - host.workspace_bytes);
  EXPECT_GT(host_available_bytes(), 0u);
}

}  // namespace
}  // namespace kvo

namespace kvo {
namespace {

using kvo::testing::expect_error;

// Quantized weights are planned as llama.cpp lays a GGUF file out (weight_formats.hpp): for
// Llama-3-8B the tensors' bytes come within 0.3 % of the published Meta-Llama-3-8B-Instruct files
// (4.92, 5.73 and 8.54 GB, which also hold the tokenizer's metadata), and at 128K on 24 GiB every
// layer stays resident with Q4_K_M where bf16 weights leave 11.
TEST(Planner, QuantizedWeightsAsGgufFilesLayThemOut) {
  MemoryQuery q;
  q.model = "llama3-8b";
  q.max_seq = 4096;
  for (const auto& [format, published] :
       {std::pair<const char*, double>{"q4_k_m", 4.92e9}, {"q5_k_m", 5.73e9}, {"q8_0", 8.54e9}}) {
    q.weights = format;
    const double bytes = static_cast<double>(plan_memory(q).weights_bytes);
    EXPECT_NEAR(bytes / published, 1.0, 0.003) << format << ": " << bytes;
  }
  // int8 per output channel is kept in Q8_0 blocks that share the row's scale: q8_0's bytes.
  q.weights = "int8";
  const std::uint64_t int8_bytes = plan_memory(q).weights_bytes;
  q.weights = "q8_0";
  EXPECT_EQ(int8_bytes, plan_memory(q).weights_bytes);
  q.max_seq = 128 * 1024;
  q.budget = std::uint64_t{24} << 30;
  q.weights = "";
  const MemoryPlan plain = plan_memory(q);
  EXPECT_EQ(plain.resident_layers, 11);
  q.weights = "q4_k_m";
  const MemoryPlan quantized = plan_memory(q);
  EXPECT_EQ(quantized.resident_layers, 32);
  EXPECT_TRUE(quantized.fits);
  // On CUDA the blocks' prefill GEMMs take a tile of rows dequantized into bf16: 64 MiB of the
  // widest input (14336) holds 2340 rows, 2304 in whole 128s.
  ASSERT_EQ(q.backend, BackendKind::kCuda);
  EXPECT_EQ(quantized.workspace_bytes - plain.workspace_bytes, std::uint64_t{2304} * 14336 * 2);

  // A hand count for a small shape: rows of 256 take K-quants, rows of 96 fall back (Q4_K to Q5_0,
  // Q6_K to Q8_0), norms stay f32, each tensor rounded up to 256 bytes.
  model::ModelConfig c = model::preset("tiny");
  c.vocab_size = 1000;
  c.hidden_size = 256;
  c.intermediate_size = 96;
  c.layers = 1;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.tie_word_embeddings = false;
  const auto at = [](std::uint64_t bytes) { return (bytes + 255) / 256 * 256; };
  const auto q4k = [](std::uint64_t n) { return n / 256 * 144; };
  const auto q6k = [](std::uint64_t n) { return n / 256 * 210; };
  const auto q8 = [](std::uint64_t n) { return n / 32 * 34; };
  // Layer 0 of 1 gets more bits: v and down in Q6_K (down's rows are 96 long: Q8_0).
  const std::uint64_t expected =
      at(q4k(1000 * 256)) +                                       // embedding
      at(256 * 4) + at(q4k(256 * 256)) + at(q4k(128 * 256)) +     // norm, q, k
      at(q6k(128 * 256)) + at(q4k(256 * 256)) + at(256 * 4) +     // v, o, norm
      at(q4k(96 * 256)) + at(q4k(96 * 256)) + at(q8(256 * 96)) +  // gate, up, down
      at(256 * 4) + at(q6k(1000 * 256));                          // final norm, output
  EXPECT_EQ(model::quantized_weight_bytes(c, "q4_k_m"), expected);

  expect_error([&] { model::quantized_weight_bytes(c, "q3_k_s"); }, ErrorCode::kInvalidArgument,
               "weights \"q3_k_s\" is not a quantized format (q8_0, int8, q4_k_m, q5_k_m)");
  expect_error([&] { model::quantized_weight_bytes(model::preset("phi3-mini-128k"), "q8_0"); },
               ErrorCode::kInvalidArgument, "Phi-3's fused projections");
  // The decoder does not run them: refused before anything is read or allocated.
  model::DecoderOptions options;
  options.weight_format = "q4_k_m";
  options.backend = BackendKind::kHost;
  expect_error([&] { model::Decoder(model::preset("tiny"), model::WeightSource{}, options); },
               ErrorCode::kInvalidArgument,
               "weights in q4_k_m are planned (kvo-vram --weights), not run");
}

}  // namespace
}  // namespace kvo
