// kvo-vram: device memory against context length, planned for kvoffload and for the strategies
// a user would compare it with, and (on a GPU, with --measure) measured. "Will 128K fit on my
// 24 GB card, and how does that compare with what I use today?"
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "kvoffload/kvoffload.hpp"
#include "kvoffload/planner.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/checkpoint/weight_formats.hpp"
#include "model/cuda/cuda_ops.hpp"
#include "model/decoder/decoder.hpp"
#include "model/decoder/memory_plan.hpp"
#include "tools/cli/cli.hpp"
#include "tools/cli/svg_chart.hpp"

namespace {

constexpr std::int64_t kMaxContext = std::int64_t{1} << 30;

// "4k,32k,128k": sorted, each once.
std::vector<int> parse_contexts(const std::string& list) {
  std::vector<int> contexts;
  std::size_t start = 0;
  while (true) {
    const std::size_t comma = list.find(',', start);
    const std::string item =
        list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    contexts.push_back(
        static_cast<int>(kvo::cli::parse_token_count(item, 1, kMaxContext, "--contexts")));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  std::sort(contexts.begin(), contexts.end());
  contexts.erase(std::unique(contexts.begin(), contexts.end()), contexts.end());
  return contexts;
}

std::string context_label(double tokens) {
  const auto t = static_cast<long long>(tokens);
  if (t % (1 << 30) == 0) return std::to_string(t >> 30) + "G";
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

struct Args {
  std::string preset = "llama3-8b";
  std::string model;
  std::string contexts;
  std::uint64_t budget = 24ull << 30;
  int slots = 1;
  int chunk = 512;
  int max_prompt = 0;
  int ring = 2;
  std::string dtype;
  std::string kv_dtype;
  std::string weights;
  bool expand_weights = false;
  std::string backend = "cuda";
  std::string csv;
  std::string svg;
  bool measure = false;
  int tp = 1;
};

// Every option, declared once.
void declare_options(CLI::App& app, Args& a) {
  kvo::cli::describe(app,
                     "Plans device memory against context length for kvoffload and for the "
                     "strategies it is compared with, and (on a GPU, with --measure) measures "
                     "it.");
  auto* preset = kvo::cli::add_choice(app, "--preset", a.preset, kvo::model::preset_names(),
                                      "a built-in model");
  auto* model =
      kvo::cli::add_text(app, "--model", a.model, "DIR|FILE.gguf",
                         "a Hugging Face model directory (its config.json, a regular file "
                         "of at most " +
                             std::to_string(kvo::model::kMaxConfigBytes >> 20) +
                             " MiB) instead, or a GGUF file (with --backend host, its quantized "
                             "matrices counted in their blocks, as the host path keeps them)");
  model->excludes(preset);
  kvo::cli::add_text(app, "--contexts", a.contexts, "LIST",
                     "contexts, e.g. 4k,32k,128k,1m, up to 1g (default: powers of two from 4k "
                     "to 1m)");
  kvo::cli::add_size(app, "--vram-budget", a.budget, 1, "device budget (default 24GiB)");
  kvo::cli::add_integer(app, "--slots", a.slots, 1, 4096, "sequences decoded together");
  kvo::cli::add_tokens(app, "--chunk", a.chunk, 1, 1 << 20, "prefill rows per chunk");
  kvo::cli::add_tokens(app, "--max-prompt", a.max_prompt, 1, 1 << 30, "")
      ->description("longest prompt prefilled at once (default: the context)");
  kvo::cli::add_integer(app, "--ring", a.ring, 1, 64, "kvoffload's staging buffers");
  kvo::cli::add_choice(app, "--dtype", a.dtype, kvo::dtype_names(false),
                       "weights, and K/V unless --kv-dtype (default: the model's)");
  kvo::cli::add_choice(app, "--kv-dtype", a.kv_dtype, kvo::dtype_names(),
                       "K/V storage (default: the weights'); fp8 and int8 keep a scale per "
                       "token and kv head");
  kvo::cli::add_choice(app, "--weights", a.weights, kvo::model::weight_format_names(),
                       "plan the weights in a quantized GGUF format, as llama.cpp lays it out "
                       "(default: --dtype's); planned only, not measured");
  kvo::cli::add_flag(app, "--expand-weights", a.expand_weights,
                     "a GGUF file: count its matrices expanded into the model dtype, as "
                     "kvo-generate --expand-weights loads them, not kept in their blocks");
  kvo::cli::add_choice(app, "--backend", a.backend, {"cuda", "host"}, "whose workspaces to count");
  kvo::cli::add_integer(app, "--tp", a.tp, 1, 4096,
                        "tensor parallelism over N GPUs of one node: plan one rank (its shard of "
                        "the heads, KV heads, MLP and vocabulary, its share of the host's "
                        "memory) and print the node's totals");
  kvo::cli::add_text(app, "--csv", a.csv, "FILE", "also write the rows as CSV");
  kvo::cli::add_text(app, "--svg", a.svg, "FILE",
                     "draw device memory against context, one line per strategy");
  kvo::cli::add_flag(app, "--measure", a.measure,
                     "GPU only: run each context (synthetic weights, a prefill, a few decode "
                     "steps) and add the measured peak device bytes beside kvoffload's plan");
}

int run(const Args& a, const CLI::App& app) {
  kvo::MemoryQuery q;
  q.model = app.count("--model") != 0 ? a.model : a.preset;
  q.budget = a.budget;
  q.slots = a.slots;
  q.chunk = a.chunk;
  const int max_prompt = a.max_prompt;
  q.ring_depth = a.ring;
  if (!a.dtype.empty()) {
    q.override_dtype = true;
    q.dtype = kvo::parse_dtype(a.dtype);
  }
  if (!a.kv_dtype.empty()) {
    q.override_kv_dtype = true;
    q.kv_dtype = kvo::parse_dtype(a.kv_dtype);
  }
  q.weights = a.weights;
  q.expand_weights = a.expand_weights;
  q.backend = kvo::parse_backend(a.backend);
  q.tp = a.tp;
  if (a.tp > 1 && a.measure) {
    throw kvo::cli::UsageError("--measure runs one process on one GPU; plan --tp without it");
  }
  if (!a.weights.empty() && a.measure) {
    throw kvo::cli::UsageError("--measure runs the decoder, which does not run --weights " +
                               a.weights + " yet");
  }
  const bool csv_given = app.count("--csv") != 0;
  const bool svg_given = app.count("--svg") != 0;
  if (csv_given) kvo::cli::check_output_path(a.csv, "--csv");
  if (svg_given) kvo::cli::check_output_path(a.svg, "--svg");
  const bool do_measure = a.measure;
  if (do_measure && kvo::cuda_device_count() == 0) {
    throw kvo::Error(kvo::ErrorCode::kDevice,
                     "--measure runs each context on a GPU, and no "
                     "CUDA device is usable here");
  }
  std::vector<int> contexts;
  if (app.count("--contexts") != 0) {
    contexts = parse_contexts(a.contexts);
  } else {
    for (int c = 4096; c <= (1 << 20); c *= 2) contexts.push_back(c);
  }
  kvo::model::ModelConfig measured_config;
  if (do_measure) measured_config = kvo::model::resolve_model(q.model);

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

  const std::string ranks =
      q.tp > 1 ? ", one rank of " + std::to_string(q.tp) + " (tensor parallel; per GPU)" : "";
  std::printf(
      "Device memory of %s against context, budget %s, %d slot(s), %s workspaces%s%s%s\n\n",
      q.model.c_str(), gib(q.budget).c_str(), q.slots, kvo::backend_name(q.backend),
      q.override_kv_dtype ? (std::string(", K/V ") + kvo::dtype_name(q.kv_dtype)).c_str() : "",
      q.weights.empty() ? (q.expand_weights ? ", matrices expanded" : "")
                        : (", weights " + q.weights).c_str(),
      ranks.c_str());
  std::printf(
      "| context | strategy | weights_bytes | kv_device_bytes | of it windows | activation_bytes | "
      "workspace_bytes | total_bytes | host_bytes | fits |%s\n",
      do_measure ? " measured_bytes |" : "");
  std::printf("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |%s\n",
              do_measure ? " ---: |" : "");
  for (const Row& r : rows) {
    const kvo::MemoryPlan& p = r.plan;
    std::string fits = p.fits ? "yes" : "no";
    if (p.strategy == kvo::Strategy::kKvoffload && p.fits) {
      fits += " (" + std::to_string(p.resident_layers) + "/" +
              std::to_string(p.layers - p.window_layers) +
              (p.window_layers > 0
                   ? " full layers resident, " + std::to_string(p.window_layers) + " window layers"
                   : std::string(" layers resident"));
      if (p.prefill_piece < r.context) {
        fits += "; prefill in pieces of " + context_label(p.prefill_piece) + ", +" +
                gib(p.piece_reread_bytes) + " H2D";
      }
      fits += ")";
    }
    if (!p.host_fits) fits += ", host memory short";
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |",
                context_label(r.context).c_str(), kvo::strategy_name(p.strategy),
                gib(p.weights_bytes).c_str(), gib(p.kv_device_bytes).c_str(),
                gib(p.kv_window_bytes).c_str(), gib(p.activation_bytes).c_str(),
                gib(p.workspace_bytes).c_str(), gib(p.total_bytes).c_str(),
                gib(p.host_bytes).c_str(), fits.c_str());
    if (do_measure) {
      std::printf(" %s |",
                  r.measured < 0 ? "" : gib(static_cast<std::uint64_t>(r.measured)).c_str());
    }
    std::printf("\n");
  }
  if (q.tp > 1) {
    // The node: every rank's device bytes on its own GPU, every rank's host bytes in one host.
    std::printf("\nThe node's totals, %d ranks:\n\n", q.tp);
    std::printf("| context | strategy | device_bytes (all GPUs) | host_bytes | fits |\n");
    std::printf("| ---: | --- | ---: | ---: | --- |\n");
    const auto tp = static_cast<std::uint64_t>(q.tp);
    for (const Row& r : rows) {
      const kvo::MemoryPlan& p = r.plan;
      std::printf("| %s | %s | %s | %s | %s |\n", context_label(r.context).c_str(),
                  kvo::strategy_name(p.strategy), gib(tp * p.total_bytes).c_str(),
                  gib(tp * p.host_bytes).c_str(),
                  !p.fits ? "no" : (p.host_fits ? "yes" : "yes, host memory short"));
    }
  }
  if (!rows.empty()) {
    std::printf(
        "\nhost memory available here: %s%s\n",
        gib(rows.front().plan.host_available_bytes * static_cast<std::uint64_t>(q.tp)).c_str(),
        q.tp > 1 ? (", " + gib(rows.front().plan.host_available_bytes) + " a rank").c_str() : "");
  }

  if (csv_given) {
    std::ostringstream csv;
    csv << "context,strategy,weights_bytes,kv_device_bytes,activation_bytes,workspace_bytes,"
           "total_bytes,host_bytes,fits,resident_layers,host_fits,prefill_piece,piece_reread_bytes,"
           "window_layers,kv_window_bytes"
        << (do_measure ? ",measured_bytes" : "") << "\n";
    for (const Row& r : rows) {
      const kvo::MemoryPlan& p = r.plan;
      csv << r.context << ',' << kvo::strategy_name(p.strategy) << ',' << p.weights_bytes << ','
          << p.kv_device_bytes << ',' << p.activation_bytes << ',' << p.workspace_bytes << ','
          << p.total_bytes << ',' << p.host_bytes << ',' << (p.fits ? "yes" : "no") << ','
          << p.resident_layers << ',' << (p.host_fits ? "yes" : "no") << ',' << p.prefill_piece
          << ',' << p.piece_reread_bytes << ',' << p.window_layers << ',' << p.kv_window_bytes;
      if (do_measure) csv << ',' << (r.measured < 0 ? std::string() : std::to_string(r.measured));
      csv << "\n";
    }
    kvo::cli::write_output_file(a.csv, csv.str(), "--csv");
  }
  if (svg_given) {
    kvo::tools::Chart chart;
    chart.title = q.model + ": device memory against context (" + std::to_string(q.slots) +
                  (q.slots == 1 ? " sequence)" : " sequences)");
    chart.x_label = "context (tokens, log scale)";
    chart.y_label = "device memory";
    chart.x_tick = context_label;
    chart.y_tick = gib_tick;
    chart.flag_label = "host memory short";
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
        series.flagged.push_back(!r.plan.host_fits);
      }
      chart.series.push_back(series);
    }
    chart.lines.push_back({"budget " + gib_tick(static_cast<double>(q.budget) / (1ull << 30)),
                           static_cast<double>(q.budget) / (1ull << 30)});
    kvo::cli::write_output_file(a.svg, kvo::tools::render_svg(chart), "--svg");
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("", "kvo-vram");
  Args args;
  declare_options(app, args);
  return kvo::cli::run(app, argc, argv, [&] { return run(args, app); });
}
