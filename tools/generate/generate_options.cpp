#include "tools/generate/generate_options.hpp"

#include <sys/stat.h>

#include <algorithm>

#include "kvoffload/kvoffload.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/checkpoint/gguf_config.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/common/numerics.hpp"
#include "offload/util/printable.hpp"
#include "tools/cli/cli.hpp"
#include "tools/cli/token_file.hpp"

namespace kvo::cli {

namespace {
constexpr int kMaxTokens = 1 << 30;  // per slot: the prompt, --max-new, --max-seq
constexpr int kMaxSlots = 4096;
}  // namespace

void declare_model_options(CLI::App& app, GenerateArgs& a) {
  using model::ModelLimits;

  app.option_defaults()->group("Model (default: --preset tiny)");
  auto* model = add_text(app, "--model", a.model, "DIR|FILE.gguf",
                         "Hugging Face checkpoint: config.json + model.safetensors (or shards), "
                         "regular files of at most: " +
                             model::model_file_bounds() +
                             "; or a GGUF file (Llama, Mistral, Qwen2, Qwen3, Phi-3; F32, F16, "
                             "BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K tensors), its tokenizer "
                             "inside");
  auto* preset = add_choice(app, "--preset", a.preset, model::preset_names(),
                            "built-in shape, weights drawn from --weight-seed on the device");
  model->excludes(preset);
  add_choice(app, "--dtype", a.dtype, dtype_names(false),
             "weights, and K/V unless --kv-dtype (default: the model's)");
  add_choice(app, "--kv-dtype", a.kv_dtype, dtype_names(),
             "K/V storage (default: the weights'); fp8 (e4m3) and int8 keep one scale per token "
             "and kv head, about half the bytes of bf16");
  add_integer(app, "--weight-seed", a.weight_seed, 0, UINT64_MAX, "seed of a preset's weights");

  app.option_defaults()->group("Cache");
  add_size(app, "--vram-budget", a.vram_budget, 1,
           "device budget, e.g. 24GiB; the planner picks the resident layers (default: the "
           "GPU's free memory; none on the host backend)");
  add_text(app, "--resident", a.resident, "N|all|auto",
           "layers kept on the device; auto: as many as the budget holds (default auto)");
  add_integer(app, "--ring", a.ring, 1, 64, "staging buffers");
  add_choice(app, "--window-layers", a.window_layers, {"window", "full"},
             "sliding-window layers (Gemma's local ones): window keeps their last rows alone, on "
             "the device, never streamed; full keeps every row, as the other layers (default "
             "window)");
  add_text(app, "--split", a.split, "auto|off|ROWS",
           "split attention at decode: each streamed layer's rows before a split row attended "
           "in host memory where they live, the rest on the backend, merged exactly; auto: the "
           "row from the bus's and the host's measured rates; ROWS: that many rows (default off)");
  add_choice(app, "--backend", a.backend, {"auto", "cuda", "host"},
             "where the cache and the model run (auto: cuda when there is a GPU)");
  add_integer(app, "--threads", a.threads, 0, 4096,
              "host backend: threads computing each step (0, the default: the cores this "
              "process may use)");
  add_choice(app, "--weights", a.weights, {"q8_0", "int8"},
             "quantize a safetensors checkpoint's (or the drawn) matrices at load: q8_0, GGUF's "
             "Q8_0 blocks (a scale per 32 weights); int8, one scale per output channel (kept in "
             "Q8_0 blocks, multiplied by the same kernels); either about 1/4 of f32's bytes");
  add_flag(app, "--expand-weights", a.expand_weights,
           "a GGUF file: dequantize its quantized matrices (and on the host, in an f32 model, "
           "its f16 and bf16 ones) into the model dtype at load instead of keeping them in "
           "their type");
  add_choice(app, "--activations", a.activations, {"auto", "f32", "q8"},
             "host backend, weights in GGUF blocks: what they multiply: f32 (the same bits as the "
             "weights expanded to f32), q8 (the activations quantized to 8 bits per 32, integer "
             "products as llama.cpp's, in decode rows and, with AVX512-VNNI, prefill GEMMs; "
             "faster, not exact) or auto (default: q8 for a GGUF file on a CPU with AVX512-VNNI, "
             "as llama.cpp runs it; f32 otherwise; --json's \"activations\" says which ran)");
  add_choice(app, "--gemm", a.gemm, {"auto", "f32"},
             "host backend, bf16 weights: auto (AVX512_BF16 GEMMs where the CPU has them, the "
             "activations rounded to bf16) or f32 (sgemm over f32 copies of the weights' tiles, "
             "the activations kept in f32)");
  add_choice(app, "--attention", a.attention, {"auto", "builtin"},
             "CUDA attention kernels: auto (FlashInfer's where they serve the shape) or builtin "
             "(the built-in ones, to compare)");
  add_integer(app, "--max-delay-us", a.max_delay_us, 0, 1000000,
              "host backend: random copy delays up to N microseconds, to test the schedule");

  app.option_defaults()->group("Prefill");
  add_tokens(app, "--chunk", a.chunk, 1, kMaxTokens, "prefill tokens per attention/MLP chunk");
  add_tokens(app, "--max-prompt", a.max_prompt, 1, kMaxTokens, "")
      ->description(
          "the longest piece of a prompt prefilled at once (default: the prompt, or with "
          "--vram-budget the largest piece whose activations fit); 1 to " +
          std::to_string(kMaxTokens));
}

void declare_options(CLI::App& app, GenerateArgs& a) {
  describe(app,
           "Generates tokens with a Llama-family model whose K/V cache lives in kvoffload's "
           "offloaded static cache, and reports what moved and how fast.");
  using model::ModelLimits;
  declare_model_options(app, a);

  app.option_defaults()->group("Prompt (default: --prompt-len 32)");
  auto* file = add_text(app, "--prompt-tokens", a.prompt_tokens, "FILE",
                        "token ids separated by spaces or commas; one line per slot, or one "
                        "line for every slot (a regular file of at most " +
                            std::to_string(kMaxTokenFileBytes >> 30) + " GiB)");
  auto* len = add_tokens(app, "--prompt-len", a.prompt_len, 1, kMaxTokens,
                         "a synthetic prompt of N ids drawn from --seed (different per slot)");
  file->excludes(len);

  app.option_defaults()->group("Generation");
  add_tokens(app, "--max-new", a.max_new, 0, kMaxTokens, "tokens to generate per slot");
  add_tokens(app, "--max-seq", a.max_seq, 1, kMaxTokens, "")
      ->description("tokens per slot in the cache (default: the prompt + --max-new); 1 to " +
                    std::to_string(kMaxTokens));
  add_integer(app, "--slots", a.slots, 1, kMaxSlots, "sequences decoded together");
  add_real(app, "--temperature", a.temperature, 0, 1000, "0: greedy");
  add_integer(app, "--top-k", a.top_k, 0, ModelLimits::kVocab, "0: off");
  add_real(app, "--top-p", a.top_p, 0, 1, "1: off; above 0");
  add_integer(app, "--seed", a.seed, 0, UINT64_MAX, "prompt and sampling seed");

  tools::declare_text_options(app, a.text);

  app.option_defaults()->group("Output");
  add_flag(app, "--json", a.json, "print one JSON object as the last line");
  add_flag(app, "--quiet", a.quiet, "do not print tokens as they come");
}

std::vector<std::int32_t> GenerateRun::prompt(int slot) const {
  if (!file_prompts.empty()) {
    return file_prompts[file_prompts.size() == 1 ? 0 : static_cast<std::size_t>(slot)];
  }
  std::vector<std::int32_t> ids(static_cast<std::size_t>(synthetic_length));
  for (int i = 0; i < synthetic_length; ++i) {
    const std::uint64_t bits =
        model::splitmix64(model::splitmix64(seed * 1000003ull + static_cast<std::uint64_t>(slot)) +
                          static_cast<std::uint64_t>(i));
    ids[static_cast<std::size_t>(i)] =
        static_cast<std::int32_t>(bits % static_cast<std::uint64_t>(config.vocab_size));
  }
  return ids;
}

std::int64_t GenerateRun::prompt_length(int slot) const {
  if (file_prompts.empty()) return synthetic_length;
  return static_cast<std::int64_t>(
      file_prompts[file_prompts.size() == 1 ? 0 : static_cast<std::size_t>(slot)].size());
}

void resolve_model(const GenerateArgs& a, const CLI::App& app, GenerateRun& r) {
  if (app.count("--model") != 0) {
    struct stat st {};
    if (::stat(a.model.c_str(), &st) != 0 || !(S_ISDIR(st.st_mode) || S_ISREG(st.st_mode))) {
      throw UsageError("--model: " + a.model + " is neither a directory nor a GGUF file");
    }
    r.source.checkpoint = a.model;
    r.config = model::is_gguf_model(a.model) ? model::gguf_model_config(model::GgufFile(a.model))
                                             : model::load_model_config(a.model + "/config.json");
    r.model_name = a.model;
  } else {
    r.model_name = a.preset;
    r.config = model::preset(a.preset);
    r.source.seed = a.weight_seed;
  }
  model::DecoderOptions& d = r.decoder;
  if (!a.dtype.empty()) {
    d.override_dtype = true;
    d.dtype = parse_dtype(a.dtype);
  }
  if (!a.kv_dtype.empty()) {
    d.override_kv_dtype = true;
    d.kv_dtype = parse_dtype(a.kv_dtype);
  }
  d.chunk = a.chunk;
  d.ring_depth = a.ring;
  d.window_layers = a.window_layers == "window";
  if (a.split == "auto") {
    d.split.mode = SplitMode::kAuto;
  } else if (a.split != "off") {
    std::int64_t rows = 0;
    if (!read_integer(a.split, rows) || rows < 1 || rows > kMaxTokens) {
      throw UsageError("--split needs auto, off or a row count from 1 to " +
                       std::to_string(kMaxTokens) + ", got '" + kvo::printable(a.split) + "'");
    }
    d.split.mode = SplitMode::kRows;
    d.split.rows = static_cast<int>(rows);
  }
  if (a.resident == "all") {
    d.resident_layers = r.config.layers;
  } else if (a.resident == "auto") {
    d.resident_layers = kAutoResidentLayers;
  } else {
    std::int64_t n = 0;
    if (!read_integer(a.resident, n) || n < 0 || n > r.config.layers) {
      throw UsageError("--resident needs all, auto or a layer count from 0 to " +
                       std::to_string(r.config.layers) + " (the model's layers), got '" +
                       kvo::printable(a.resident) + "'");
    }
    d.resident_layers = static_cast<int>(n);
  }
  d.device_budget = a.vram_budget;
  d.backend = parse_backend(a.backend);
  d.builtin_attention = a.attention == "builtin";
  d.threads = a.threads;
  d.f32_gemm = a.gemm == "f32";
  if (a.expand_weights && !model::is_gguf_model(r.source.checkpoint)) {
    throw UsageError("--expand-weights dequantizes a GGUF file's blocks at load, and " +
                     (r.source.checkpoint.empty()
                          ? std::string("drawn weights have none")
                          : r.source.checkpoint + ", a safetensors checkpoint, has none") +
                     " (--weights quantizes them at load)");
  }
  d.keep_blocks = !a.expand_weights;
  d.q8_activations = a.activations == "q8";
  d.auto_activations = a.activations == "auto";
  d.weight_format = a.weights;
  if (a.max_delay_us > 0) {
    d.host.max_delay_us = static_cast<std::uint32_t>(a.max_delay_us);
    d.host.delay_seed = a.seed;
  }
}

GenerateRun resolve(const GenerateArgs& a, const CLI::App& app) {
  GenerateRun r;
  resolve_model(a, app, r);
  model::DecoderOptions& d = r.decoder;
  r.seed = a.seed;
  d.slots = a.slots;

  tools::TextOptions text = a.text;
  text.read_given(app);
  r.text =
      std::make_shared<tools::TextSession>(text, r.source.checkpoint, d.slots, r.config.vocab_size);
  std::int64_t longest = 0;
  std::int64_t prefilled = 0;  // the longest prompt prefilled at once
  if (r.text->active()) {
    // A text prompt (the same for every slot), after a saved context when one is loaded.
    r.file_prompts = {r.text->prompt()};
    prefilled = static_cast<std::int64_t>(r.text->prompt().size());
    longest = std::max<std::int64_t>(r.text->context_tokens(), 1);
  } else if (app.count("--prompt-tokens") != 0) {
    r.file_prompts = read_token_file(a.prompt_tokens);
    const auto lines = static_cast<int>(r.file_prompts.size());
    if (lines != 1 && lines != d.slots) {
      throw UsageError("--prompt-tokens: " + a.prompt_tokens + " holds " + std::to_string(lines) +
                       " prompts for " + std::to_string(d.slots) +
                       " slots (give one line, or one per slot)");
    }
    for (std::size_t p = 0; p < r.file_prompts.size(); ++p) {
      const auto& ids = r.file_prompts[p];
      for (std::size_t i = 0; i < ids.size(); ++i) {
        if (ids[i] >= r.config.vocab_size) {
          throw UsageError("--prompt-tokens: token id " + std::to_string(ids[i]) + " at line " +
                           std::to_string(p + 1) + ", position " + std::to_string(i + 1) +
                           " is outside the vocabulary (vocab_size " +
                           std::to_string(r.config.vocab_size) + ")");
        }
      }
      longest = std::max(longest, static_cast<std::int64_t>(ids.size()));
    }
    if (longest > kMaxTokens) {
      throw UsageError("--prompt-tokens: a prompt of " + std::to_string(longest) +
                       " tokens is longer than " + std::to_string(kMaxTokens));
    }
    prefilled = longest;
  } else {
    r.synthetic_length = a.prompt_len;
    longest = a.prompt_len;
    prefilled = longest;
  }

  r.max_new = a.max_new;
  std::int64_t max_seq = longest + std::max(a.max_new, 1);
  if (r.text->saved_max_seq()) max_seq = *r.text->saved_max_seq();
  if (r.text->saves() && !r.text->loads()) max_seq += 4096;  // room for questions
  d.max_seq =
      a.max_seq != 0 ? a.max_seq : static_cast<int>(std::min<std::int64_t>(max_seq, kMaxTokens));
  if (longest > d.max_seq) {
    throw UsageError("the prompt has " + std::to_string(longest) +
                     " tokens, longer than --max-seq " + std::to_string(d.max_seq));
  }
  if (longest + a.max_new - 1 > d.max_seq) {
    throw UsageError("prompt (" + std::to_string(longest) + ") + --max-new (" +
                     std::to_string(a.max_new) + ") - 1 exceeds --max-seq " +
                     std::to_string(d.max_seq));
  }
  d.max_prompt =
      a.max_prompt > 0 ? a.max_prompt : static_cast<int>(std::max<std::int64_t>(prefilled, 1));
  d.fit_prompt = a.max_prompt == 0;
  if (!(a.top_p > 0)) throw UsageError("--top-p must be above 0 (1: off)");
  r.sampling.temperature = static_cast<float>(a.temperature);
  r.sampling.top_k = a.top_k;
  r.sampling.top_p = static_cast<float>(a.top_p);
  r.json = a.json;
  r.quiet = a.quiet;
  return r;
}

void check_contexts_hold(const CachePlan& plan, const std::string& option) {
  if (plan.window_layers > 0) {
    throw UsageError(option + ": this model's " + std::to_string(plan.window_layers) +
                     " window layers keep their last rows alone, which saved contexts do not "
                     "hold yet; give --window-layers full to keep every row");
  }
}

}  // namespace kvo::cli
