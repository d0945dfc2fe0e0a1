// kvo-vram: device memory against context length, planned for kvoffload and for the strategies
// a user would compare it with, and (on a GPU, with --measure) measured. "Will 128K fit on my
// 24 GB card, and how does that compare with what I use today?"
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "kvoffload/planner.hpp"
#include "model/cuda_ops.hpp"
#include "model/decoder.hpp"
#include "model/memory_plan.hpp"
#include "model/model_config.hpp"
#include "tools/cli.hpp"
#include "tools/svg_chart.hpp"

namespace {

constexpr const char* kUsage = R"(usage: kvo-vram [options]

  --preset NAME       tiny, llama3-8b, mistral-7b or qwen2.5-7b (llama3-8b)
  --model DIR         a Hugging Face model directory (its config.json) instead of a preset
  --contexts LIST     contexts, e.g. 4k,32k,128k,1m (powers of two from 4k to 1m)
  --vram-budget SIZE  device budget, e.g. 24GiB (24GiB)
  --slots N           sequences decoded together (1)
  --chunk N           prefill rows per chunk (512)
  --max-prompt N      longest prompt prefilled at once (the context)
  --ring D            kvoffload's staging buffers (2)
  --dtype T           weights and K/V: f32, f16 or bf16 (the model's)
  --backend B         whose workspaces to count: cuda or host (cuda)
  --csv FILE          also write the rows as CSV
  --svg FILE          draw device memory against context, one line per strategy
  --measure           GPU only: run each context (synthetic weights, a prefill, a few decode
                      steps) and add the measured peak device bytes beside kvoffload's plan
)";

int parse_context(const std::string& text) {
  std::size_t used = 0;
  long long value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = used > 0 ? text.substr(used) : "";
  long long scale = 0;
  if (unit.empty()) scale = 1;
  if (unit == "k" || unit == "K") scale = 1024;
  if (unit == "m" || unit == "M") scale = 1024 * 1024;
  if (used == 0 || scale == 0 || value <= 0 || value * scale > (1ll << 30)) {
    throw kvo::cli::UsageError("cannot read the context '" + text +
                               "' (examples: 4096, 4k, 128k, 1m; at most 1g tokens)");
  }
  return static_cast<int>(value * scale);
}

std::vector<int> parse_contexts(const std::string& list) {
  std::vector<int> contexts;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t comma = list.find(',', start);
    const std::string item =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) contexts.push_back(parse_context(item));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (contexts.empty()) throw kvo::cli::UsageError("--contexts is empty");
  return contexts;
}

std::string context_label(double tokens) {
  const auto t = static_cast<long long>(tokens);
  if (t % (1 << 20) == 0) return std::to_string(t >> 20) + "M";
  if (t % 1024 == 0) return std::to_string(t >> 10) + "K";
  return std::to_string(t);
}

std::string gib(std::uint64_t bytes) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.2f GiB", static_cast<double>(bytes) / (1ull << 30));
  return buffer;
}

std::string gib_tick(double value) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g GiB", value);
  return buffer;
}

// Runs one context for real on the GPU and returns the peak device bytes the run added.
std::uint64_t measure(const kvo::MemoryQuery& q, const kvo::model::ModelConfig& config) {
  kvo::model::DecoderOptions options = kvo::model::decoder_options(q);
  options.backend = kvo::BackendKind::kCuda;
  const std::uint64_t before = kvo::model::cuda_device_bytes_in_use();
  std::uint64_t peak = before;
  {
    kvo::model::Decoder decoder(config, {"", 1}, options);
    const int steps = std::min(4, q.max_seq - 1);
    const int prompt = std::min(q.max_seq - steps, decoder.options().max_prompt);
    std::vector<std::int32_t> tokens(static_cast<std::size_t>(prompt));
    for (int i = 0; i < prompt; ++i)
      tokens[static_cast<std::size_t>(i)] = (i * 7919) % config.vocab_size;
    std::vector<float> logits(static_cast<std::size_t>(q.slots) * config.vocab_size);
    for (int s = 0; s < q.slots; ++s) decoder.prefill(s, tokens, logits.data());
    peak = std::max(peak, kvo::model::cuda_device_bytes_in_use());
    for (int i = 0; i < steps; ++i) {
      decoder.decode(std::vector<std::int32_t>(static_cast<std::size_t>(q.slots), 1),
                     logits.data());
      peak = std::max(peak, kvo::model::cuda_device_bytes_in_use());
    }
  }
  return peak - before;
}

int run(int argc, char** argv) {
  const kvo::cli::Args args(argc, argv,
                            {"preset", "model", "contexts", "vram-budget", "slots", "chunk",
                             "max-prompt", "ring", "dtype", "backend", "csv", "svg"},
                            {"measure", "help"});
  if (args.has("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (args.has("preset") && args.has("model")) {
    throw kvo::cli::UsageError("give --preset or --model, not both");
  }
  kvo::MemoryQuery q;
  q.model = args.has("model") ? args.get("model", "") : args.get("preset", "llama3-8b");
  q.budget = kvo::parse_size(args.get("vram-budget", "24GiB"));
  if (q.budget == 0) throw kvo::cli::UsageError("--vram-budget must be more than 0 bytes");
  q.slots = static_cast<int>(args.get_int("slots", 1, 1, 4096));
  q.chunk = static_cast<int>(args.get_int("chunk", 512, 1, 1 << 20));
  const int max_prompt = static_cast<int>(args.get_int("max-prompt", 0, 0, 1 << 30));
  q.ring_depth = static_cast<int>(args.get_int("ring", 2, 1, 64));
  if (args.has("dtype")) {
    q.override_dtype = true;
    q.dtype = kvo::parse_dtype(args.get("dtype", ""));
  }
  q.backend = kvo::parse_backend(args.get("backend", "cuda"));
  if (q.backend == kvo::BackendKind::kAuto) q.backend = kvo::BackendKind::kCuda;
  const bool do_measure = args.has("measure");
  if (do_measure && kvo::cuda_device_count() == 0) {
    throw kvo::Error(kvo::ErrorCode::kDevice,
                     "--measure runs each context on a GPU, and no "
                     "CUDA device is usable here");
  }
  std::vector<int> contexts;
  if (args.has("contexts")) {
    contexts = parse_contexts(args.get("contexts", ""));
  } else {
    for (int c = 4096; c <= (1 << 20); c *= 2) contexts.push_back(c);
  }
  kvo::model::ModelConfig measured_config;
  if (do_measure) {
    measured_config = args.has("model") ? kvo::model::load_model_config(q.model + "/config.json")
                                        : kvo::model::preset(q.model);
  }

  struct Row {
    int context;
    kvo::MemoryPlan plan;
    long long measured;  // -1: not measured
  };
  std::vector<Row> rows;
  for (int context : contexts) {
    q.max_seq = context;
    q.max_prompt = max_prompt > 0 ? std::min(max_prompt, context) : 0;
    for (const kvo::MemoryPlan& plan : kvo::compare_strategies(q)) {
      long long measured = -1;
      if (do_measure && plan.strategy == kvo::Strategy::kKvoffload && plan.fits) {
        std::fprintf(stderr, "kvo-vram: measuring %s ...\n", context_label(context).c_str());
        measured = static_cast<long long>(measure(q, measured_config));
      }
      rows.push_back({context, plan, measured});
    }
  }

  std::printf("Device memory of %s against context, budget %s, %d slot(s), %s workspaces\n\n",
              q.model.c_str(), gib(q.budget).c_str(), q.slots, kvo::backend_name(q.backend));
  std::printf(
      "| context | strategy | weights_bytes | kv_device_bytes | activation_bytes | "
      "workspace_bytes | total_bytes | host_bytes | fits |%s\n",
      do_measure ? " measured_bytes |" : "");
  std::printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |%s\n",
              do_measure ? " ---: |" : "");
  for (const Row& r : rows) {
    const kvo::MemoryPlan& p = r.plan;
    std::string fits = p.fits ? "yes" : "no";
    if (p.strategy == kvo::Strategy::kKvoffload && p.fits) {
      fits += " (" + std::to_string(p.resident_layers) + "/" + std::to_string(p.layers) +
              " layers resident)";
    }
    if (!p.host_fits) fits += ", host memory short";
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |", context_label(r.context).c_str(),
                kvo::strategy_name(p.strategy), gib(p.weights_bytes).c_str(),
                gib(p.kv_device_bytes).c_str(), gib(p.activation_bytes).c_str(),
                gib(p.workspace_bytes).c_str(), gib(p.total_bytes).c_str(),
                gib(p.host_bytes).c_str(), fits.c_str());
    if (do_measure) {
      std::printf(" %s |",
                  r.measured < 0 ? "" : gib(static_cast<std::uint64_t>(r.measured)).c_str());
    }
    std::printf("\n");
  }
  if (!rows.empty()) {
    std::printf("\nhost memory available here: %s\n",
                gib(rows.front().plan.host_available_bytes).c_str());
  }

  if (args.has("csv")) {
    std::ofstream csv(args.get("csv", ""));
    if (!csv) throw kvo::cli::UsageError("cannot write " + args.get("csv", ""));
    csv << "context,strategy,weights_bytes,kv_device_bytes,activation_bytes,workspace_bytes,"
           "total_bytes,host_bytes,fits,resident_layers,host_fits"
        << (do_measure ? ",measured_bytes" : "") << "\n";
    for (const Row& r : rows) {
      const kvo::MemoryPlan& p = r.plan;
      csv << r.context << ',' << kvo::strategy_name(p.strategy) << ',' << p.weights_bytes << ','
          << p.kv_device_bytes << ',' << p.activation_bytes << ',' << p.workspace_bytes << ','
          << p.total_bytes << ',' << p.host_bytes << ',' << (p.fits ? "yes" : "no") << ','
          << p.resident_layers << ',' << (p.host_fits ? "yes" : "no");
      if (do_measure) csv << ',' << (r.measured < 0 ? std::string() : std::to_string(r.measured));
      csv << "\n";
    }
  }
  if (args.has("svg")) {
    kvo::tools::Chart chart;
    chart.title = q.model + ": device memory against context (" + std::to_string(q.slots) +
                  (q.slots == 1 ? " sequence)" : " sequences)");
    chart.x_label = "context (tokens, log scale)";
    chart.y_label = "device memory";
    chart.x_tick = context_label;
    chart.y_tick = gib_tick;
    const char* colors[] = {"#7f7f7f", "#ff7f0e", "#1f77b4"};
    const char* labels[] = {"everything on the device", "transformers offloaded static",
                            "kvoffload"};
    for (int s = 0; s < 3; ++s) {
      kvo::tools::ChartSeries series;
      series.label = labels[s];
      series.color = colors[s];
      for (const Row& r : rows) {
        if (static_cast<int>(r.plan.strategy) != s) continue;
        series.x.push_back(r.context);
        series.y.push_back(static_cast<double>(r.plan.total_bytes) / (1ull << 30));
      }
      chart.series.push_back(series);
    }
    chart.lines.push_back({"budget " + gib_tick(static_cast<double>(q.budget) / (1ull << 30)),
                           static_cast<double>(q.budget) / (1ull << 30)});
    std::ofstream svg(args.get("svg", ""));
    if (!svg) throw kvo::cli::UsageError("cannot write " + args.get("svg", ""));
    svg << kvo::tools::render_svg(chart);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kvo::cli::UsageError& e) {
    std::cerr << "kvo-vram: " << e.what() << "\n\n" << kUsage;
    return 2;
  } catch (const kvo::Error& e) {
    std::cerr << "kvo-vram: " << e.what() << "\n";
    return 1;
  }
}
