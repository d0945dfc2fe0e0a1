// kvo-eval: what a K/V dtype costs in accuracy, on a real model and real text. For each K/V dtype
// the model reads the text once (a layer-major prefill that scores every token), then generates
// greedily after it. Against a reference dtype (the first given) and against bf16:
//   - perplexity of the text, and its change in percent;
//   - top-1 agreement: the share of positions whose most likely next token is the same;
//   - greedy agreement: how many generated tokens match before the first difference, and the
//     share of positions that match.
// With --targets the exit status says whether each quantized dtype meets its target against bf16
// (int8: perplexity within 1 %, top-1 agreement >= 98 %; fp8: 2 %, 95 %).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kvoffload/error.hpp"
#include "kvoffload/quant.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/decoder/decoder.hpp"
#include "model/text/tokenizer.hpp"
#include "offload/util/input_file.hpp"
#include "offload/util/printable.hpp"
#include "tools/cli/cli.hpp"
#include "tools/cli/progress_bar.hpp"

namespace {

struct EvalArgs {
  std::string model;
  std::string text;
  std::string kv_dtypes = "f32,bf16,fp8,int8";
  int tokens = 4096;
  int generate = 256;
  int chunk = 512;
  int threads = 0;
  std::string backend = "auto";
  std::string json;
  bool json_given = false;
  bool targets = false;
};

// The largest --text read.
constexpr std::uint64_t kMaxTextBytes = std::uint64_t{1} << 30;

void declare(CLI::App& app, EvalArgs& a) {
  kvo::cli::describe(app,
                     "What a K/V dtype costs in accuracy on a real model and text: perplexity, "
                     "top-1 agreement of next-token predictions and greedy-generation agreement, "
                     "each K/V dtype against the first one given and against bf16.");
  kvo::cli::add_text(app, "--model", a.model, "DIR",
                     "Hugging Face model directory: config.json, safetensors, tokenizer, regular "
                     "files of at most: " +
                         kvo::model::model_file_bounds())
      ->required();
  kvo::cli::add_text(app, "--text", a.text, "FILE",
                     "the text to read (UTF-8): a regular file of at most 1 GiB")
      ->required();
  kvo::cli::add_tokens(app, "--tokens", a.tokens, 2, 1 << 20,
                       "tokens of the text to score (its first ones; default 4096)");
  kvo::cli::add_integer(app, "--generate", a.generate, 0, 1 << 16,
                        "greedy tokens generated after the text (default 256)");
  kvo::cli::add_text(app, "--kv-dtypes", a.kv_dtypes, "LIST",
                     "K/V dtypes to compare, the reference first (default f32,bf16,fp8,int8)");
  kvo::cli::add_tokens(app, "--chunk", a.chunk, 1, 1 << 16, "prefill rows per chunk (512)");
  kvo::cli::add_integer(app, "--threads", a.threads, 0, 4096,
                        "host backend: threads (0, the default: the cores this process may use)");
  kvo::cli::add_choice(app, "--backend", a.backend, {"auto", "cuda", "host"},
                       "where the model runs (auto: cuda when there is a GPU)");
  kvo::cli::add_text(app, "--json", a.json, "FILE",
                     "also write the figures as JSON (checked before the evaluation)")
      ->each([&a](const std::string&) { a.json_given = true; });
  kvo::cli::add_flag(app, "--targets", a.targets,
                     "exit 1 unless int8 and fp8 meet their targets against bf16");
}

// One K/V dtype's reading of the text and its greedy continuation.
struct Reading {
  kvo::DType dtype = kvo::DType::kF32;
  double nll = 0;                    // summed over the scored positions
  std::vector<std::int32_t> top1;    // [tokens - 1]: the most likely next token at each position
  std::vector<std::int32_t> greedy;  // [generate]
  double seconds = 0;
  double perplexity(std::size_t positions) const {
    return std::exp(nll / static_cast<double>(positions));
  }
};

struct Agreement {
  double top1 = 0;          // share of positions with the same top-1 token
  int greedy_prefix = 0;    // generated tokens equal before the first difference
  double greedy_share = 0;  // share of generated positions equal
};

Agreement agreement(const Reading& a, const Reading& b) {
  Agreement g;
  std::size_t same = 0;
  for (std::size_t i = 0; i < a.top1.size(); ++i) same += a.top1[i] == b.top1[i];
  g.top1 = a.top1.empty() ? 1 : static_cast<double>(same) / static_cast<double>(a.top1.size());
  same = 0;
  bool diverged = false;
  for (std::size_t i = 0; i < a.greedy.size(); ++i) {
    const bool equal = a.greedy[i] == b.greedy[i];
    same += equal;
    diverged = diverged || !equal;
    if (!diverged) ++g.greedy_prefix;
  }
  g.greedy_share =
      a.greedy.empty() ? 1 : static_cast<double>(same) / static_cast<double>(a.greedy.size());
  return g;
}

std::int32_t argmax(const float* x, int n) {
  return static_cast<std::int32_t>(std::max_element(x, x + n) - x);
}

// -log softmax(x)[target], in double.
double nll_of(const float* x, int n, std::int32_t target) {
  const double top = *std::max_element(x, x + n);
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += std::exp(static_cast<double>(x[i]) - top);
  return std::log(sum) + top - static_cast<double>(x[target]);
}

Reading read(const EvalArgs& a, const kvo::model::ModelConfig& config, kvo::DType dtype,
             const std::vector<std::int32_t>& tokens) {
  kvo::model::DecoderOptions o;
  o.max_seq = static_cast<int>(tokens.size()) + std::max(a.generate, 1);
  o.max_prompt = static_cast<int>(tokens.size());
  o.chunk = a.chunk;
  o.logit_rows = a.chunk;
  o.threads = a.threads;
  o.backend = kvo::parse_backend(a.backend);
  o.override_kv_dtype = true;
  o.kv_dtype = dtype;
  kvo::model::Decoder decoder(config, kvo::model::WeightSource{a.model, 0}, o);
  const int vocab = config.vocab_size;
  Reading r;
  r.dtype = dtype;
  const auto start = std::chrono::steady_clock::now();
  {
    kvo::cli::ProgressBar bar(std::string("reading, K/V ") + kvo::dtype_name(dtype),
                              static_cast<double>(tokens.size()), "tok");
    std::vector<float> last(static_cast<std::size_t>(vocab));
    const int n = static_cast<int>(tokens.size());
    decoder.prefill_scored(
        0, tokens,
        [&](int i, const float* logits) {
          if (i + 1 < n) {
            r.nll += nll_of(logits, vocab, tokens[static_cast<std::size_t>(i) + 1]);
            r.top1.push_back(argmax(logits, vocab));
          } else {
            std::copy(logits, logits + vocab, last.begin());
          }
        },
        [&](std::int64_t done, std::int64_t total) { bar.update(done, total); });
    std::vector<std::int32_t> next = {argmax(last.data(), vocab)};
    for (int step = 0; step < a.generate; ++step) {
      r.greedy.push_back(next[0]);
      if (step + 1 == a.generate) break;
      decoder.decode(next, last.data());
      next[0] = argmax(last.data(), vocab);
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

// The targets against bf16 (perplexity change at most, top-1 agreement at least), or none.
bool target_of(kvo::DType dtype, double& max_ppl_percent, double& min_top1) {
  if (dtype == kvo::DType::kInt8) {
    max_ppl_percent = 1;
    min_top1 = 0.98;
    return true;
  }
  if (dtype == kvo::DType::kFP8E4M3) {
    max_ppl_percent = 2;
    min_top1 = 0.95;
    return true;
  }
  return false;
}

int run(const EvalArgs& a) {
  std::vector<kvo::DType> dtypes;
  {
    std::istringstream list(a.kv_dtypes);
    std::string name;
    while (std::getline(list, name, ',')) {
      try {
        dtypes.push_back(kvo::parse_dtype(name));
      } catch (const kvo::Error& e) {
        throw kvo::cli::UsageError(std::string("--kv-dtypes: ") + e.what());
      }
    }
  }
  if (dtypes.empty()) throw kvo::cli::UsageError("--kv-dtypes names no dtype");
  // Everything that can be refused is refused before the evaluation, not after it.
  if (a.targets && std::find(dtypes.begin(), dtypes.end(), kvo::DType::kBF16) == dtypes.end()) {
    throw kvo::cli::UsageError("--targets compares against bf16: add bf16 to --kv-dtypes");
  }
  if (!a.json.empty() || a.json_given) kvo::cli::check_output_path(a.json, "--json");
  std::string text;
  try {
    text = kvo::offload::read_input_file(a.text, kMaxTextBytes, "--text");
  } catch (const kvo::Error& e) {
    throw kvo::cli::UsageError(e.what());
  }
  const kvo::model::ModelConfig config = kvo::model::load_model_config(a.model + "/config.json");
  const auto tokenizer = kvo::model::load_tokenizer(a.model);
  kvo::model::check_tokenizer_fits(*tokenizer, config.vocab_size, a.model);
  std::vector<std::int32_t> tokens = tokenizer->encode(text, true);
  if (static_cast<int>(tokens.size()) < a.tokens) {
    throw kvo::cli::UsageError("--text holds " + std::to_string(tokens.size()) +
                               " tokens, fewer than --tokens " + std::to_string(a.tokens));
  }
  tokens.resize(static_cast<std::size_t>(a.tokens));
  const std::size_t positions = tokens.size() - 1;

  std::vector<Reading> readings;
  for (kvo::DType dtype : dtypes) {
    readings.push_back(read(a, config, dtype, tokens));
    std::fprintf(stderr, "K/V %-4s  perplexity %.4f  (%.1f s)\n", kvo::dtype_name(dtype),
                 readings.back().perplexity(positions), readings.back().seconds);
  }
  const Reading& ref = readings.front();
  const Reading* bf16 = nullptr;
  for (const Reading& r : readings) {
    if (r.dtype == kvo::DType::kBF16) bf16 = &r;
  }

  std::printf("kvo-eval  %s, %zu tokens of %s, %d generated; reference K/V %s\n\n", a.model.c_str(),
              tokens.size(), a.text.c_str(), a.generate, kvo::dtype_name(ref.dtype));
  std::printf(
      "| K/V | perplexity | vs %s | vs bf16 | top-1 vs %s | top-1 vs bf16 | greedy vs %s "
      "(prefix, share) | greedy vs bf16 (prefix, share) | target |\n",
      kvo::dtype_name(ref.dtype), kvo::dtype_name(ref.dtype), kvo::dtype_name(ref.dtype));
  std::printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n");
  nlohmann::json rows = nlohmann::json::array();
  bool all_met = true;
  for (const Reading& r : readings) {
    const double ppl = r.perplexity(positions);
    const double vs_ref = 100 * (ppl / ref.perplexity(positions) - 1);
    const Agreement g_ref = agreement(r, ref);
    nlohmann::json row = {{"kv_dtype", kvo::dtype_name(r.dtype)},
                          {"perplexity", ppl},
                          {"perplexity_change_percent_vs_reference", vs_ref},
                          {"top1_agreement_vs_reference", g_ref.top1},
                          {"greedy_prefix_vs_reference", g_ref.greedy_prefix},
                          {"greedy_share_vs_reference", g_ref.greedy_share},
                          {"seconds", r.seconds}};
    std::string vs_bf16 = "-", top1_bf16 = "-", greedy_bf16 = "-", target = "-";
    if (bf16 != nullptr) {
      const double change = 100 * (ppl / bf16->perplexity(positions) - 1);
      const Agreement g = agreement(r, *bf16);
      char buffer[64];
      std::snprintf(buffer, sizeof buffer, "%+.3f %%", change);
      vs_bf16 = buffer;
      std::snprintf(buffer, sizeof buffer, "%.2f %%", 100 * g.top1);
      top1_bf16 = buffer;
      std::snprintf(buffer, sizeof buffer, "%d, %.2f %%", g.greedy_prefix, 100 * g.greedy_share);
      greedy_bf16 = buffer;
      row["perplexity_change_percent_vs_bf16"] = change;
      row["top1_agreement_vs_bf16"] = g.top1;
      row["greedy_prefix_vs_bf16"] = g.greedy_prefix;
      row["greedy_share_vs_bf16"] = g.greedy_share;
      double max_ppl = 0, min_top1 = 0;
      if (target_of(r.dtype, max_ppl, min_top1)) {
        const bool met = change <= max_ppl && g.top1 >= min_top1;
        all_met = all_met && met;
        std::snprintf(buffer, sizeof buffer, "%s (<= %g %%, >= %g %%)", met ? "met" : "MISSED",
                      max_ppl, 100 * min_top1);
        target = buffer;
        row["target_met"] = met;
      }
    }
    std::printf("| %s | %.4f | %+.3f %% | %s | %.2f %% | %s | %d, %.2f %% | %s | %s |\n",
                kvo::dtype_name(r.dtype), ppl, vs_ref, vs_bf16.c_str(), 100 * g_ref.top1,
                top1_bf16.c_str(), g_ref.greedy_prefix, 100 * g_ref.greedy_share,
                greedy_bf16.c_str(), target.c_str());
    rows.push_back(row);
  }
  if (a.json_given) {
    nlohmann::json j = {{"model", a.model},        {"text", a.text},
                        {"tokens", tokens.size()}, {"generate", a.generate},
                        {"chunk", a.chunk},        {"reference", kvo::dtype_name(ref.dtype)},
                        {"readings", rows}};
    // Paths may hold any bytes: invalid UTF-8 is written as U+FFFD, never thrown over.
    kvo::cli::write_output_file(
        a.json, j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n", "--json");
  }
  if (a.targets && !all_met) {
    std::fprintf(stderr, "kvo-eval: a quantized K/V dtype missed its target against bf16\n");
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("", "kvo-eval");
  EvalArgs args;
  declare(app, args);
  return kvo::cli::run(app, argc, argv, [&] { return run(args); });
}
