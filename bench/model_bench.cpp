// The model on the cache: prefill and one decode step at several context lengths, on the host
// backend (the tiny preset) and on CUDA when there is a GPU (the Llama-3-8B shape, synthetic
// weights, every layer streamed).
//
//   kvo_bench_model [--backend=auto|cuda|host] [--preset=NAME] [--max-context=N]
#include <benchmark/benchmark.h>

#include <cstdio>
#include <map>
#include <memory>
#include <vector>

#include "bench/bench_common.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/decoder/decoder.hpp"

namespace kvo::bench {
namespace {

struct Setup {
  model::ModelConfig config;
  BackendKind backend = BackendKind::kHost;
  std::vector<int> contexts;
};
Setup g_setup;
constexpr int kContextDrift = 64;

std::vector<std::int32_t> prompt(int n) {
  std::vector<std::int32_t> tokens(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    tokens[static_cast<std::size_t>(i)] = (i * 7919 + 13) % g_setup.config.vocab_size;
  }
  return tokens;
}

// One decoder per context, sized for it, every layer streamed through a ring of two.
model::Decoder& decoder_for(int context) {
  static std::map<int, std::unique_ptr<model::Decoder>> decoders;
  auto& d = decoders[context];
  if (!d) {
    decoders.clear();  // one at a time: an 8B-shaped decoder holds its weights
    model::DecoderOptions options;
    options.max_seq = context + kContextDrift + 1;
    options.resident_layers = 0;
    options.backend = g_setup.backend;
    auto& slot = decoders[context];
    slot = std::make_unique<model::Decoder>(g_setup.config, model::WeightSource{"", 1}, options);
    return *slot;
  }
  return *d;
}

void BM_Prefill(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  model::Decoder& d = decoder_for(context);
  const auto tokens = prompt(context);
  std::vector<float> logits(static_cast<std::size_t>(g_setup.config.vocab_size));
  for (auto _ : state) {
    d.reset(0);
    const auto start = Clock::now();
    d.prefill(0, tokens, logits.data());
    state.SetIterationTime(seconds_since(start));
  }
  state.counters["context"] = context;
  state.counters["tokens_per_s"] =
      benchmark::Counter(context, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_DecodeStep(benchmark::State& state) {
  const int context = static_cast<int>(state.range(0));
  model::Decoder& d = decoder_for(context);
  std::vector<float> logits(static_cast<std::size_t>(g_setup.config.vocab_size));
  d.reset(0);
  d.prefill(0, prompt(context), logits.data());
  double total_s = 0;
  for (auto _ : state) {
    const auto start = Clock::now();
    d.decode({1}, logits.data());
    const double seconds = seconds_since(start);
    total_s += seconds;
    state.SetIterationTime(seconds);
    // Back to the context every kContextDrift steps: a truncation discards what was prefetched
    // for the next step, which should not weigh on every measured step.
    if (d.length(0) >= context + kContextDrift) d.cache().truncate_slot(0, context);
  }
  const CacheStats st = d.cache().stats();
  const double step_s = total_s / static_cast<double>(state.iterations());
  state.counters["context"] = context;
  state.counters["step_s"] = step_s;
  state.counters["tokens_per_s"] = 1.0 / step_s;
  state.counters["h2d_bytes_per_step"] = static_cast<double>(st.h2d_bytes_last_step);
  state.counters["h2d_GBps"] = static_cast<double>(st.h2d_bytes_last_step) / step_s * 1e-9;
}

}  // namespace
}  // namespace kvo::bench

int main(int argc, char** argv) {
  using namespace kvo::bench;
  try {
    g_setup.backend =
        resolve_backend(kvo::parse_backend(take_flag(&argc, argv, "backend", "auto")));
    const bool cuda = g_setup.backend == kvo::BackendKind::kCuda;
    g_setup.config =
        kvo::model::preset(take_flag(&argc, argv, "preset", cuda ? "llama3-8b" : "tiny"));
    const int max_context =
        std::stoi(take_flag(&argc, argv, "max-context", cuda ? "131072" : "4096"));
    for (int c = 1024; c <= max_context; c *= 4) g_setup.contexts.push_back(c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvo_bench_model: %s\n", e.what());
    return 1;
  }
  for (auto* b : {benchmark::RegisterBenchmark("BM_Prefill", BM_Prefill),
                  benchmark::RegisterBenchmark("BM_DecodeStep", BM_DecodeStep)}) {
    for (int c : g_setup.contexts) b->Arg(c);
    b->ArgName("context")->UseManualTime()->Unit(benchmark::kMillisecond);
  }
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
