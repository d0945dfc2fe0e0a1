// kvo-generate: generates tokens with a Llama-family model whose K/V cache lives in an
// OffloadedStaticCache. The model is a Hugging Face checkpoint directory or a preset with
// weights drawn from a seed; the prompt is a file of token ids or a seeded synthetic one.
// Reports what moved and how fast: prefill and decode tokens/s, H2D bytes per token, the
// bandwidth achieved, the time spent waiting for prefetches, and device bytes.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "model/cuda_ops.hpp"
#include "model/decoder.hpp"
#include "model/model_config.hpp"
#include "model/sampler.hpp"
#include "tools/cli.hpp"

namespace {

constexpr const char* kUsage = R"(usage: kvo-generate [options]

Model (default: --preset tiny):
  --model DIR          Hugging Face checkpoint: config.json + model.safetensors (or sharded)
  --preset NAME        tiny, llama3-8b, mistral-7b, qwen2.5-7b, with weights drawn from
                       --weight-seed (1) on the device itself
  --dtype T            weights and K/V: f32, f16 or bf16 (the model's)
Prompt (default: --prompt-len 32):
  --prompt-tokens FILE token ids separated by spaces or commas; one line per slot, or one
                       line for every slot
  --prompt-len N       a synthetic prompt of N ids drawn from --seed (different per slot)
Generation:
  --max-new N          tokens to generate per slot (32)
  --max-seq N          tokens per slot in the cache (prompt + max-new)
  --slots N            sequences decoded together (1)
  --chunk N            prefill tokens per attention/MLP chunk (512)
  --temperature X      0: greedy (0)        --top-k N   (0: off)      --top-p X   (1: off)
  --seed N             prompt and sampling seed (1)
Cache:
  --vram-budget SIZE   device budget, e.g. 24GiB; the planner picks the resident layers
  --resident N|all|auto  layers kept on the device (auto: as many as the budget holds)
  --ring D             staging buffers (2)
  --backend B          auto, cuda or host (auto: cuda when there is a GPU)
  --threads N          host backend: threads computing each step (default: the cores)
Output:
  --json               print one JSON object as the last line
  --quiet              do not print tokens as they come
)";

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

struct Options {
  kvo::model::ModelConfig config;
  kvo::model::WeightSource source;
  kvo::model::DecoderOptions decoder;
  kvo::model::SamplingParams sampling;
  std::vector<std::vector<std::int32_t>> prompts;  // [slots]
  std::string model_name;
  int max_new = 32;
  std::uint64_t seed = 1;
  bool json = false;
  bool quiet = false;
};

std::vector<std::vector<std::int32_t>> read_prompt_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw kvo::cli::UsageError("cannot open --prompt-tokens file " + path);
  std::vector<std::vector<std::int32_t>> prompts;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    std::replace(line.begin(), line.end(), ',', ' ');
    std::istringstream words(line);
    std::vector<std::int32_t> ids;
    std::string word;
    while (words >> word) {
      std::size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size() || id < 0 || id > INT32_MAX) {
        throw kvo::cli::UsageError(path + ":" + std::to_string(line_no) + ": '" + word +
                                   "' is not a token id");
      }
      ids.push_back(static_cast<std::int32_t>(id));
    }
    if (!ids.empty()) prompts.push_back(std::move(ids));
  }
  if (prompts.empty()) throw kvo::cli::UsageError(path + " holds no token ids");
  return prompts;
}

Options parse(int argc, char** argv) {
  const kvo::cli::Args args(
      argc, argv,
      {"model", "preset", "dtype", "weight-seed", "prompt-tokens", "prompt-len", "max-new",
       "max-seq", "slots", "chunk", "temperature", "top-k", "top-p", "seed", "vram-budget",
       "resident", "ring", "backend", "max-delay-us", "threads"},
      {"json", "quiet", "help"});
  if (args.has("help")) {
    std::cout << kUsage;
    std::exit(0);
  }
  Options o;
  if (args.has("model") && args.has("preset")) {
    throw kvo::cli::UsageError("--model and --preset exclude each other");
  }
  if (args.has("model")) {
    o.source.checkpoint_dir = args.get("model", "");
    o.config = kvo::model::load_model_config(o.source.checkpoint_dir + "/config.json");
    o.model_name = o.source.checkpoint_dir;
  } else {
    o.model_name = args.get("preset", "tiny");
    o.config = kvo::model::preset(o.model_name);
    o.source.seed = static_cast<std::uint64_t>(args.get_int("weight-seed", 1, 0, INT64_MAX));
  }
  kvo::model::DecoderOptions& d = o.decoder;
  if (args.has("dtype")) {
    d.override_dtype = true;
    d.dtype = kvo::parse_dtype(args.get("dtype", ""));
  }
  o.seed = static_cast<std::uint64_t>(args.get_int("seed", 1, 0, INT64_MAX));
  d.slots = static_cast<int>(args.get_int("slots", 1, 1, 4096));
  constexpr std::int64_t kMax = 1 << 30;
  if (args.has("prompt-tokens") && args.has("prompt-len")) {
    throw kvo::cli::UsageError("--prompt-tokens and --prompt-len exclude each other");
  }
  if (args.has("prompt-tokens")) {
    o.prompts = read_prompt_file(args.get("prompt-tokens", ""));
    if (o.prompts.size() == 1) o.prompts.resize(static_cast<std::size_t>(d.slots), o.prompts[0]);
    if (static_cast<int>(o.prompts.size()) != d.slots) {
      throw kvo::cli::UsageError("--prompt-tokens holds " + std::to_string(o.prompts.size()) +
                                 " prompts for " + std::to_string(d.slots) + " slots");
    }
  } else {
    const int len = static_cast<int>(args.get_int("prompt-len", 32, 1, kMax));
    for (int s = 0; s < d.slots; ++s) {
      std::vector<std::int32_t> ids(static_cast<std::size_t>(len));
      for (int i = 0; i < len; ++i) {
        const std::uint64_t bits = kvo::model::splitmix64(
            kvo::model::splitmix64(o.seed * 1000003ull + static_cast<std::uint64_t>(s)) +
            static_cast<std::uint64_t>(i));
        ids[static_cast<std::size_t>(i)] =
            static_cast<std::int32_t>(bits % static_cast<std::uint64_t>(o.config.vocab_size));
      }
      o.prompts.push_back(std::move(ids));
    }
  }
  std::size_t longest = 0;
  for (const auto& p : o.prompts) longest = std::max(longest, p.size());
  o.max_new = static_cast<int>(args.get_int("max-new", 32, 0, kMax));
  d.max_seq = static_cast<int>(args.get_int(
      "max-seq", static_cast<std::int64_t>(longest) + std::max(o.max_new, 1), 1, kMax));
  if (static_cast<std::int64_t>(longest) > d.max_seq) {
    throw kvo::cli::UsageError("the prompt has " + std::to_string(longest) +
                               " tokens, longer than --max-seq " + std::to_string(d.max_seq));
  }
  if (static_cast<std::int64_t>(longest) + o.max_new - 1 > d.max_seq) {
    throw kvo::cli::UsageError("prompt (" + std::to_string(longest) + ") + --max-new (" +
                               std::to_string(o.max_new) + ") - 1 exceeds --max-seq " +
                               std::to_string(d.max_seq));
  }
  d.max_prompt = static_cast<int>(longest);
  d.chunk = static_cast<int>(args.get_int("chunk", 512, 1, kMax));
  d.ring_depth = static_cast<int>(args.get_int("ring", 2, 1, 64));
  const std::string resident = args.get("resident", "auto");
  d.resident_layers = resident == "all" ? o.config.layers
                      : resident == "auto"
                          ? kvo::kAutoResidentLayers
                          : static_cast<int>(args.get_int("resident", 0, 0, o.config.layers));
  if (args.has("vram-budget")) d.device_budget = kvo::parse_size(args.get("vram-budget", ""));
  d.backend = kvo::parse_backend(args.get("backend", "auto"));
  if (args.has("threads")) d.threads = static_cast<int>(args.get_int("threads", 0, 1, 4096));
  if (args.has("max-delay-us")) {
    d.host.max_delay_us = static_cast<std::uint32_t>(args.get_int("max-delay-us", 0, 0, 1000000));
    d.host.delay_seed = o.seed;
  }
  o.sampling.temperature = std::stof(args.get("temperature", "0"));
  o.sampling.top_k = static_cast<int>(args.get_int("top-k", 0, 0, kMax));
  o.sampling.top_p = std::stof(args.get("top-p", "1"));
  o.json = args.has("json");
  o.quiet = args.has("quiet");
  return o;
}

// A one-line progress bar on a terminal: layers of the prefill done, tokens/s, ETA.
class ProgressBar {
 public:
  ProgressBar(int tokens, bool enabled)
      : tokens_(tokens), enabled_(enabled), start_(Clock::now()) {}
  void update(int done, int total) {
    if (!enabled_) return;
    const double elapsed = seconds_since(start_);
    const double fraction = static_cast<double>(done) / total;
    const double rate = elapsed > 0 ? fraction * tokens_ / elapsed : 0;
    const double eta = fraction > 0 ? elapsed * (1 - fraction) / fraction : 0;
    const int width = 30;
    const int filled = static_cast<int>(fraction * width);
    std::fprintf(stderr, "\rprefill [%s%s] %3d%% %9.0f tok/s ETA %5.1fs",
                 std::string(static_cast<std::size_t>(filled), '#').c_str(),
                 std::string(static_cast<std::size_t>(width - filled), ' ').c_str(),
                 static_cast<int>(fraction * 100), rate, eta);
    if (done == total) std::fprintf(stderr, "\n");
    std::fflush(stderr);
  }

 private:
  int tokens_;
  bool enabled_;
  Clock::time_point start_;
};

std::string join(const std::vector<std::int32_t>& ids) {
  std::string s;
  for (std::size_t i = 0; i < ids.size(); ++i) s += (i ? "," : "") + std::to_string(ids[i]);
  return s;
}

int run(const Options& o) {
  const bool cuda = kvo::resolve_backend(o.decoder.backend) == kvo::BackendKind::kCuda;
  const std::uint64_t in_use_before = cuda ? kvo::model::cuda_device_bytes_in_use() : 0;
  std::uint64_t peak_in_use = in_use_before;
  auto sample_memory = [&] {
    if (cuda) peak_in_use = std::max(peak_in_use, kvo::model::cuda_device_bytes_in_use());
  };

  const auto setup_start = Clock::now();
  kvo::model::Decoder decoder(o.config, o.source, o.decoder);
  const double setup_s = seconds_since(setup_start);
  sample_memory();
  const kvo::model::ModelConfig& c = decoder.config();
  const int slots = o.decoder.slots;
  const kvo::CachePlan plan = decoder.cache().stats().plan;
  std::printf(
      "kvo-generate  %s (%s, %d layers, hidden %d, %d/%d heads, vocab %d, %s), "
      "backend %s\n",
      o.model_name.c_str(), c.architecture.c_str(), c.layers, c.hidden_size, c.heads, c.kv_heads,
      c.vocab_size, kvo::dtype_name(decoder.cache().config().dtype),
      kvo::backend_name(decoder.backend()));
  std::printf(
      "  plan            %d resident + %d streamed layers, ring %d; device %s "
      "(weights %s, activations %s), host %s\n",
      plan.resident_layers, plan.streamed_layers, plan.ring_depth,
      kvo::format_bytes(plan.device_bytes).c_str(),
      kvo::format_bytes(decoder.weight_bytes()).c_str(),
      kvo::format_bytes(decoder.activation_bytes()).c_str(),
      kvo::format_bytes(plan.host_bytes).c_str());
  std::fflush(stdout);

  // On CUDA the tokens are drawn on the device (only the ids come back); on the host, by a
  // Sampler per slot over the logits. Both follow the same rule and draws, so pick the same.
  const bool device_sampling = decoder.backend() == kvo::BackendKind::kCuda;
  if (device_sampling) decoder.set_sampling(o.sampling, o.seed);
  std::vector<kvo::model::Sampler> samplers;
  for (int s = 0; s < slots; ++s) samplers.emplace_back(o.sampling, o.seed, s);
  std::vector<std::int32_t> first(static_cast<std::size_t>(slots), -1);
  std::vector<std::vector<std::int32_t>> generated(static_cast<std::size_t>(slots));
  std::vector<float> logits(static_cast<std::size_t>(slots) * c.vocab_size);
  const bool stream_tokens = !o.quiet;
  const bool tty = ::isatty(STDERR_FILENO) != 0;

  // Prefill, slot by slot, each a layer-major step.
  std::int64_t prompt_tokens = 0;
  const auto prefill_start = Clock::now();
  for (int s = 0; s < slots; ++s) {
    const auto& prompt = o.prompts[static_cast<std::size_t>(s)];
    ProgressBar bar(static_cast<int>(prompt.size()), tty && prompt.size() >= 1024);
    auto progress = [&](int done, int total) { bar.update(done, total); };
    if (device_sampling) {
      first[static_cast<std::size_t>(s)] = decoder.prefill_sample(s, prompt, progress);
    } else {
      decoder.prefill(s, prompt, logits.data() + static_cast<std::int64_t>(s) * c.vocab_size,
                      progress);
    }
    prompt_tokens += static_cast<std::int64_t>(prompt.size());
    sample_memory();
  }
  const double prefill_s = seconds_since(prefill_start);
  const kvo::CacheStats after_prefill = decoder.cache().stats();

  // Decode: the first token comes from the prefill's logits.
  const auto decode_start = Clock::now();
  std::vector<std::int32_t> next(static_cast<std::size_t>(slots), -1);
  std::int64_t decode_tokens = 0;
  for (int step = 0; step < o.max_new; ++step) {
    if (device_sampling) {
      if (step == 0) {
        next = first;
      } else {
        decoder.decode_sample(next, next.data());
        decode_tokens += slots;
        sample_memory();
      }
      for (int s = 0; s < slots; ++s) {
        generated[static_cast<std::size_t>(s)].push_back(next[static_cast<std::size_t>(s)]);
      }
    } else {
      if (step > 0) {
        decoder.decode(next, logits.data());
        decode_tokens += slots;
        sample_memory();
      }
      for (int s = 0; s < slots; ++s) {
        const std::int32_t token = samplers[static_cast<std::size_t>(s)].sample(
            logits.data() + static_cast<std::int64_t>(s) * c.vocab_size, c.vocab_size);
        generated[static_cast<std::size_t>(s)].push_back(token);
        next[static_cast<std::size_t>(s)] = token;
      }
    }
    if (stream_tokens) {
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
  if (stream_tokens && slots == 1 && o.max_new > 0) std::printf("\n");
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
    std::string tokens = "[";
    for (int s = 0; s < slots; ++s) {
      tokens += (s ? ",[" : "[") + join(generated[static_cast<std::size_t>(s)]) + "]";
    }
    tokens += "]";
    std::printf(
        "{\"tokens\":%s,\"prefill_tokens\":%lld,\"decode_tokens\":%lld,"
        "\"prefill_tokens_per_s\":%.3f,\"decode_tokens_per_s\":%.3f,"
        "\"h2d_bytes_per_token\":%.1f,\"h2d_GBps\":%.4f,\"h2d_bytes_total\":%llu,"
        "\"d2h_bytes_total\":%llu,\"prefetch_stall_s\":%.6f,\"peak_device_bytes\":%llu,"
        "\"planned_device_bytes\":%llu,\"weight_bytes\":%llu,\"activation_bytes\":%llu,"
        "\"resident_layers\":%d,\"streamed_layers\":%d,\"ring_depth\":%d,\"backend\":\"%s\","
        "\"slots\":%d,\"max_seq\":%d,\"chunk\":%d,\"prefill_s\":%.6f,\"decode_s\":%.6f}\n",
        tokens.c_str(), static_cast<long long>(prompt_tokens),
        static_cast<long long>(decode_tokens), prefill_tps, decode_tps, h2d_per_token, h2d_gbps,
        static_cast<unsigned long long>(st.h2d_bytes_total),
        static_cast<unsigned long long>(st.d2h_bytes_total), st.acquire_wait_s,
        static_cast<unsigned long long>(peak), static_cast<unsigned long long>(plan.device_bytes),
        static_cast<unsigned long long>(decoder.weight_bytes()),
        static_cast<unsigned long long>(decoder.activation_bytes()), plan.resident_layers,
        plan.streamed_layers, plan.ring_depth, kvo::backend_name(decoder.backend()), slots,
        o.decoder.max_seq, o.decoder.chunk, prefill_s, decode_s);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(parse(argc, argv));
  } catch (const kvo::cli::UsageError& e) {
    std::cerr << "kvo-generate: " << e.what() << "\n\n" << kUsage;
    return 2;
  } catch (const kvo::Error& e) {
    std::cerr << "kvo-generate: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "kvo-generate: " << e.what() << "\n";
    return 1;
  }
}
