// kvo-generate's command line. Every option is declared once, in declare_options, into the
// fields of GenerateArgs; resolve() then checks what the options mean together and against the
// model, and turns them into a GenerateRun. A new option is a field here, one line in
// declare_options, and its use in resolve().
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "model/checkpoint/model_config.hpp"
#include "model/decoder/decoder.hpp"
#include "model/decoder/sampler.hpp"
#include "tools/generate/generate_text.hpp"

namespace kvo::cli {

// The options as given (defaults as declared).
struct GenerateArgs {
  // Model
  std::string model;  // a checkpoint directory
  std::string preset = "tiny";
  std::string dtype;     // empty: the model's
  std::string kv_dtype;  // empty: the weights'
  std::uint64_t weight_seed = 1;
  // Prompt
  std::string prompt_tokens;  // a token file
  int prompt_len = 32;
  // Generation
  int max_new = 32;
  int max_seq = 0;  // 0: the longest prompt + max_new
  int slots = 1;
  int chunk = 512;
  int max_prompt = 0;  // 0: planned
  double temperature = 0;
  int top_k = 0;
  double top_p = 1;
  std::uint64_t seed = 1;
  // Cache
  std::uint64_t vram_budget = 0;  // 0: not given
  std::string resident = "auto";
  int ring = 2;
  std::string window_layers = "window";
  std::string split = "off";  // --split auto|off|ROWS
  int threads = 0;            // 0: the cores this process may use
  std::string backend = "auto";
  std::string attention = "auto";
  std::string gemm = "auto";
  bool expand_weights = false;
  std::string activations = "auto";
  std::string weights;
  int max_delay_us = 0;
  // Text
  tools::TextOptions text;
  // Output
  bool json = false;
  bool quiet = false;
};

// What to run, checked.
struct GenerateRun {
  model::ModelConfig config;
  model::WeightSource source;
  model::DecoderOptions decoder;
  model::SamplingParams sampling;
  std::string model_name;
  int max_new = 32;
  std::uint64_t seed = 1;
  bool json = false;
  bool quiet = false;

  // The prompt of `slot`: its line of the token file (one line serves every slot), or ids drawn
  // from the seed. Made when asked for, so that nothing prompt-sized exists before the plan has
  // been checked.
  std::vector<std::int32_t> prompt(int slot) const;
  std::int64_t prompt_length(int slot) const;

  std::vector<std::vector<std::int32_t>> file_prompts;  // empty: synthetic
  int synthetic_length = 0;
  // Text in and out, and saved contexts (inactive without the text options).
  std::shared_ptr<tools::TextSession> text;
};

void declare_options(CLI::App& app, GenerateArgs& args);
// The options of the model and its cache alone (groups Model, Cache and Prefill), for a tool that
// runs the same model as kvo-generate without its prompt and output options (kvo-serve).
void declare_model_options(CLI::App& app, GenerateArgs& args);

// Throws UsageError for options that do not fit together or do not fit the model, and
// kvo::Error when the model's config cannot be read.
GenerateRun resolve(const GenerateArgs& args, const CLI::App& app);
// The part of resolve() that declare_model_options' options fill: the config, the weight source,
// the model's name and the decoder options but its slots, max_seq and max_prompt.
void resolve_model(const GenerateArgs& args, const CLI::App& app, GenerateRun& run);

// Refuses (UsageError, naming `option`) saving or loading contexts for a cache planned with window
// layers: those keep their last rows alone, which a saved context does not hold yet.
void check_contexts_hold(const CachePlan& plan, const std::string& option);

}  // namespace kvo::cli
