// kvo-generate: generates tokens with a Llama-family model whose K/V cache lives in an
// OffloadedStaticCache. The model is a Hugging Face checkpoint directory or a preset with
// weights drawn from a seed; the prompt is text (tools/generate/generate_text.hpp), a file of token
// ids or a seeded synthetic one. Reports what moved and how fast: prefill and decode tokens/s, H2D
// bytes per token, the bandwidth achieved, the time spent waiting for prefetches, and device bytes.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/cuda/cuda_ops.hpp"
#include "model/decoder/decoder.hpp"
#include "tools/cli/cli.hpp"
#include "tools/cli/progress_bar.hpp"
#include "tools/generate/generate_options.hpp"

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

int run(const kvo::cli::GenerateRun& o) {
  // With text, stdout carries the generated text (and the JSON line last); the report goes to
  // stderr.
  kvo::tools::TextSession& text = *o.text;
  std::FILE* json_out = stdout;
  std::FILE* text_out = nullptr;
  if (text.active()) {
    std::fflush(stdout);
    const int fd = ::dup(STDOUT_FILENO);
    text_out = fd < 0 ? nullptr : ::fdopen(fd, "w");
    if (text_out == nullptr) {
      throw kvo::Error(kvo::ErrorCode::kInternal,
                       std::string("cannot keep the output open: ") + std::strerror(errno));
    }
    json_out = text_out;
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
  }
  const bool cuda = kvo::resolve_backend(o.decoder.backend) == kvo::BackendKind::kCuda;
  const std::uint64_t in_use_before = cuda ? kvo::model::cuda_device_bytes_in_use() : 0;
  std::uint64_t peak_in_use = in_use_before;
  auto sample_memory = [&] {
    if (cuda) peak_in_use = std::max(peak_in_use, kvo::model::cuda_device_bytes_in_use());
  };

  const auto setup_start = Clock::now();
  kvo::cli::ProgressBar weights_bar(
      o.source.checkpoint.empty() ? "weights (drawing)" : "weights (loading)", 0, "");
  kvo::model::Decoder decoder(
      o.config, o.source, o.decoder,
      [&](std::int64_t done, std::int64_t total) { weights_bar.update(done, total); });
  const double setup_s = seconds_since(setup_start);
  sample_memory();
  const kvo::model::ModelConfig& c = decoder.config();
  const int slots = o.decoder.slots;
  const kvo::CachePlan plan = decoder.cache().stats().plan;
  std::printf(
      "kvo-generate  %s (%s, %d layers, hidden %d, %d/%d heads, vocab %d, weights %s, K/V %s), "
      "backend %s\n",
      o.model_name.c_str(), c.architecture.c_str(), c.layers, c.hidden_size, c.heads, c.kv_heads,
      c.vocab_size, decoder.weights_text().c_str(), kvo::dtype_name(decoder.cache().config().dtype),
      kvo::backend_name(decoder.backend()));
  if (text.saves() || text.loads()) {
    kvo::cli::check_contexts_hold(plan, text.saves() ? "--save-context" : "--load-context");
  }
  const std::string windows =
      plan.window_layers > 0 ? " + " + std::to_string(plan.window_layers) + " window layers (" +
                                   kvo::format_bytes(plan.window_bytes) + ")"
                             : "";
  std::printf(
      "  plan            %d resident + %d streamed layers%s, ring %d; device %s "
      "(weights %s, activations %s), host %s\n",
      plan.resident_layers, plan.streamed_layers, windows.c_str(), plan.ring_depth,
      kvo::format_bytes(plan.device_bytes).c_str(),
      kvo::format_bytes(decoder.weight_bytes()).c_str(),
      kvo::format_bytes(decoder.activation_bytes()).c_str(),
      kvo::format_bytes(plan.host_bytes).c_str());
  if (plan.split == kvo::SplitMode::kAuto) {
    const std::string measured =
        plan.split_probe_s > 0
            ? " (measured in " + std::to_string(std::lround(plan.split_probe_s * 1e3)) + " ms)"
            : "";
    std::printf("  split           auto: host %.1f GB/s, bus %.1f GB/s%s\n",
                plan.split_host_bytes_per_s / 1e9, plan.split_h2d_bytes_per_s / 1e9,
                measured.c_str());
  } else if (plan.split == kvo::SplitMode::kRows) {
    std::printf("  split           %d rows of each streamed layer attended on the host\n",
                decoder.cache().config().split.rows);
  }
  std::printf("  attention       %s\n", decoder.attention_kernels().c_str());
  std::printf("  gemm            %s\n", decoder.gemm_kernels().c_str());
  std::fflush(stdout);

  // The decoder draws the tokens on its backend (on CUDA only the ids come back), draw d of slot
  // s as Sampler(sampling, seed, s) would.
  decoder.set_sampling(o.sampling, o.seed);
  std::vector<std::int32_t> first(static_cast<std::size_t>(slots), -1);
  std::vector<std::vector<std::int32_t>> generated(static_cast<std::size_t>(slots));
  const bool stream_tokens = !o.quiet;

  // A saved context instead of a prefill: only the question is prefilled after it.
  std::vector<std::int32_t> question;
  if (text.loads()) question = text.load_context(decoder, o.source, stdout);

  // Prefill, slot by slot, each a layer-major step.
  std::int64_t prompt_tokens = 0;
  std::int64_t longest_prompt = 0;
  // A prompt in k pieces of p tokens: the later pieces re-read p k(k-1)/2 rows of each streamed
  // layer's K and V.
  const std::uint64_t piece = static_cast<std::uint64_t>(decoder.options().max_prompt);
  std::uint64_t reread_bytes = 0;
  const auto prefill_start = Clock::now();
  for (int s = 0; s < slots; ++s) {
    const std::vector<std::int32_t> prompt = text.loads() ? question : o.prompt(s);
    kvo::cli::ProgressBar bar("prefill", static_cast<double>(prompt.size()), "tok");
    auto progress = [&](std::int64_t done, std::int64_t total) { bar.update(done, total); };
    first[static_cast<std::size_t>(s)] = decoder.prefill_sample(s, prompt, progress);
    prompt_tokens += static_cast<std::int64_t>(prompt.size());
    longest_prompt = std::max(longest_prompt, static_cast<std::int64_t>(prompt.size()));
    const std::uint64_t k = (prompt.size() + piece - 1) / piece;
    reread_bytes += piece * (k * (k - (k > 0 ? 1 : 0)) / 2) * 2 * plan.row_bytes *
                    static_cast<std::uint64_t>(plan.streamed_layers);
    sample_memory();
  }
  const double prefill_s = seconds_since(prefill_start);
  if (text.saves()) text.save_context(decoder, o.source, stdout);
  const kvo::CacheStats after_prefill = decoder.cache().stats();

  // Decode: the first token comes from the prefill's logits.
  const auto decode_start = Clock::now();
  std::vector<std::int32_t> next(static_cast<std::size_t>(slots), -1);
  std::int64_t decode_tokens = 0;
  // A slot that drew its end-of-sequence token (text mode) sits out the steps after it (-1).
  std::vector<bool> done(static_cast<std::size_t>(slots), false);
  int active = slots;
  for (int step = 0; step < o.max_new && active > 0; ++step) {
    for (int s = 0; s < slots; ++s) {
      if (done[static_cast<std::size_t>(s)]) next[static_cast<std::size_t>(s)] = -1;
    }
    if (step == 0) {
      next = first;
    } else {
      decoder.decode_sample(next, next.data());
      decode_tokens += active;
      sample_memory();
    }
    for (int s = 0; s < slots; ++s) {
      const auto index = static_cast<std::size_t>(s);
      if (done[index]) continue;
      generated[index].push_back(next[index]);
      if (text.active()) {
        text.push(s, next[index], stream_tokens && slots == 1 ? text_out : nullptr);
        if (text.stops(next[index])) {
          done[index] = true;
          --active;
        }
      }
    }
    if (stream_tokens && !text.active()) {
      if (slots == 1) {
        std::printf(step == 0 ? "  tokens          %d" : " %d", next[0]);
      } else {
        std::printf("  step %-10d", step);
        for (int s = 0; s < slots; ++s) std::printf(" %d", next[static_cast<std::size_t>(s)]);
        std::printf("\n");
      }
      std::fflush(stdout);
    }
  }
  if (stream_tokens && slots == 1 && o.max_new > 0 && !text.active()) std::printf("\n");
  if (text.active()) {
    for (int s = 0; s < slots; ++s) {
      const bool streamed = stream_tokens && slots == 1;
      text.finish(s, streamed ? text_out : nullptr);
      if (stream_tokens && !streamed) {
        std::fprintf(text_out, "[slot %d] %s\n", s, text.json_text(s).c_str());
      }
    }
    if (stream_tokens && slots == 1) std::fputc('\n', text_out);
    std::fflush(text_out);
  }
  decoder.cache().synchronize();
  const double decode_s = seconds_since(decode_start);

  const kvo::CacheStats st = decoder.cache().stats();
  const std::uint64_t decode_h2d = st.h2d_bytes_total - after_prefill.h2d_bytes_total;
  const double prefill_tps = prefill_s > 0 ? static_cast<double>(prompt_tokens) / prefill_s : 0;
  const double decode_tps = decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0;
  const double h2d_per_token =
      decode_tokens > 0 ? static_cast<double>(decode_h2d) / static_cast<double>(decode_tokens) : 0;
  const double h2d_gbps = decode_s > 0 ? static_cast<double>(decode_h2d) / decode_s * 1e-9 : 0;
  const std::uint64_t peak =
      cuda ? peak_in_use - std::min(peak_in_use, in_use_before) : plan.device_bytes;

  std::printf("  setup           %.3f s\n", setup_s);
  std::printf("  prefill         %lld tokens in %.3f s: %.1f tokens/s\n",
              static_cast<long long>(prompt_tokens), prefill_s, prefill_tps);
  if (static_cast<std::int64_t>(piece) < longest_prompt) {
    std::printf(
        "  prefill pieces  %lld of at most %llu tokens (the longest prompt), each attending "
        "over the ones before: %s of H2D re-read\n",
        static_cast<long long>((static_cast<std::uint64_t>(longest_prompt) + piece - 1) / piece),
        static_cast<unsigned long long>(piece), kvo::format_bytes(reread_bytes).c_str());
  }
  std::printf("  decode          %lld tokens in %.3f s: %.2f tokens/s\n",
              static_cast<long long>(decode_tokens), decode_s, decode_tps);
  std::printf(
      "  H2D             %s per decoded token, %.2f GB/s achieved; total H2D %s, "
      "D2H %s\n",
      kvo::format_bytes(static_cast<std::uint64_t>(h2d_per_token)).c_str(), h2d_gbps,
      kvo::format_bytes(st.h2d_bytes_total).c_str(), kvo::format_bytes(st.d2h_bytes_total).c_str());
  std::printf("  prefetch stall  %.6f s\n", st.acquire_wait_s);
  std::printf("  device bytes    peak %s (%s), planned %s\n", kvo::format_bytes(peak).c_str(),
              cuda ? "cudaMemGetInfo" : "arena, exact",
              kvo::format_bytes(plan.device_bytes).c_str());
  if (o.json) {
    nlohmann::ordered_json j;
    j["tokens"] = generated;
    j["prefill_tokens"] = prompt_tokens;
    j["prefill_piece"] = piece;
    j["prefill_reread_h2d_bytes"] = reread_bytes;
    j["decode_tokens"] = decode_tokens;
    j["prefill_tokens_per_s"] = prefill_tps;
    j["decode_tokens_per_s"] = decode_tps;
    j["h2d_bytes_per_token"] = h2d_per_token;
    j["h2d_GBps"] = h2d_gbps;
    j["h2d_bytes_total"] = st.h2d_bytes_total;
    j["d2h_bytes_total"] = st.d2h_bytes_total;
    j["prefetch_stall_s"] = st.acquire_wait_s;
    j["peak_device_bytes"] = peak;
    j["planned_device_bytes"] = plan.device_bytes;
    j["weight_bytes"] = decoder.weight_bytes();
    j["activation_bytes"] = decoder.activation_bytes();
    j["resident_layers"] = plan.resident_layers;
    j["streamed_layers"] = plan.streamed_layers;
    j["window_layers"] = plan.window_layers;
    j["window_bytes"] = plan.window_bytes;
    j["ring_depth"] = plan.ring_depth;
    j["split_h2d_bytes_per_s"] = plan.split_h2d_bytes_per_s;
    j["split_host_bytes_per_s"] = plan.split_host_bytes_per_s;
    j["split"] = plan.split == kvo::SplitMode::kOff    ? "off"
                 : plan.split == kvo::SplitMode::kAuto ? "auto"
                                                       : "rows";
    j["backend"] = kvo::backend_name(decoder.backend());
    j["weight_dtype"] = kvo::dtype_name(decoder.weight_dtype());
    j["weights"] = decoder.weights_text();
    j["weight_bytes"] = decoder.weight_bytes();
    j["kv_dtype"] = kvo::dtype_name(decoder.kv_dtype());
    j["slots"] = slots;
    j["max_seq"] = o.decoder.max_seq;
    j["chunk"] = o.decoder.chunk;
    j["prefill_s"] = prefill_s;
    j["decode_s"] = decode_s;
    j["attention"] = decoder.attention_kernels();
    j["gemm"] = decoder.gemm_kernels();
    j["activations"] = decoder.options().q8_activations ? "q8" : "f32";
    if (text.active()) {
      nlohmann::json texts = nlohmann::json::array();
      for (int s = 0; s < slots; ++s) texts.push_back(nlohmann::json::parse(text.json_text(s)));
      j["text"] = texts;
      j["context_loaded_tokens"] = text.loaded_tokens();
      j["context_load_s"] = text.load_seconds();
      j["prefill_skipped"] = text.loads();
    }
    std::fprintf(json_out, "%s\n",
                 j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).c_str());
  }
  // The text (and the JSON line) went to the real stdout, which cli::run no longer sees.
  if (std::fflush(json_out) != 0 || std::ferror(json_out) != 0) {
    throw kvo::Error(kvo::ErrorCode::kInternal,
                     std::string("cannot write the output: ") + std::strerror(errno));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("", "kvo-generate");
  kvo::cli::GenerateArgs args;
  kvo::cli::declare_options(app, args);
  return kvo::cli::run(app, argc, argv, [&] { return run(kvo::cli::resolve(args, app)); });
}
