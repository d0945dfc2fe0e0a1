// kvo-generate's text side: prompts given as text (--prompt, --prompt-file, --chat), generated
// text streamed as it comes, and saved contexts (--save-context after the prefill,
// --load-context instead of one).
//
// A document and a question: --prompt-file DOC with --prompt QUESTION prefills the ids of DOC
// followed by the ids of "\n\n" + QUESTION (each tokenized on its own); --save-context saves DOC's
// and a later --load-context run with --prompt QUESTION prefills only the question's ids, so both
// runs hold exactly the same tokens. With --chat, DOC opens the user's turn of the model's chat
// format and QUESTION closes it.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kvoffload/cache.hpp"
#include "model/decoder/decoder.hpp"
#include "model/text/tokenizer.hpp"
#include "tools/cli/cli.hpp"

namespace kvo::tools {

// The largest --prompt-file read.
inline constexpr std::uint64_t kMaxPromptFileBytes = std::uint64_t{1} << 30;

// The options this adds to kvo-generate: their values, and which were given.
struct TextOptions {
  std::string prompt;
  std::string prompt_file;
  std::string system;
  std::string save_context;
  std::string load_context;
  std::string context_reading = "mapped";  // --context-reading: mapped or pread
  bool chat = false;
  bool ignore_eos = false;
  // Filled by read_given() once the command line is read:
  bool has_prompt = false, has_prompt_file = false, has_system = false;
  bool has_save_context = false, has_load_context = false;
  bool ids_given = false;  // --prompt-tokens or --prompt-len

  bool any() const {
    return has_prompt || has_prompt_file || has_system || chat || ignore_eos || has_save_context ||
           has_load_context;
  }
  void read_given(const CLI::App& app);
};

// Declares the text options on kvo-generate's command line, in their own group.
void declare_text_options(CLI::App& app, TextOptions& options);

class TextSession {
 public:
  // Reads the options; loads the tokenizer when text goes in or out (model_dir: a directory or GGUF
  // file; empty: a preset, which has none, so text options are refused saying why) and checks that
  // the model's vocabulary (model_vocab rows) holds every id it writes. Opens --load-context and
  // checks
  // --save-context's path, so that neither fails after the work.
  TextSession(const TextOptions& options, const std::string& model_dir, int slots, int model_vocab);

  // Text options were given: prompts come from here, the output is text.
  bool active() const { return active_; }
  // The ids to prefill in each slot (the same for every slot). After load_context: the
  // question's, which may be empty (then the loaded context's last token is fed again).
  const std::vector<std::int32_t>& prompt() const { return prompt_; }
  // max_seq of the saved context given to --load-context (the cache must have the same).
  std::optional<int> saved_max_seq() const { return saved_max_seq_; }
  bool saves() const { return !save_path_.empty(); }
  bool loads() const { return !load_path_.empty(); }
  // Tokens a slot will hold after the prefill: the loaded ones and the prompt.
  int context_tokens() const {
    return static_cast<int>(loaded_tokens_) + static_cast<int>(prompt_.size());
  }

  // Restores every slot from --load-context (no prefill) and reports it on `log`; returns the ids
  // to prefill next in each slot.
  std::vector<std::int32_t> load_context(model::Decoder& decoder, const model::WeightSource& source,
                                         std::FILE* log);
  // Writes every slot to --save-context after the prefill, and reports it on `log`.
  void save_context(model::Decoder& decoder, const model::WeightSource& source, std::FILE* log);

  // Whether `token` ends a slot's generation (the model's end-of-sequence, unless --ignore-eos).
  bool stops(std::int32_t token) const;
  // Streams generated text: push() writes what is complete, finish() the rest.
  void push(int slot, std::int32_t token, std::FILE* out);
  void finish(int slot, std::FILE* out);
  // The text generated in a slot so far, as a JSON string literal.
  std::string json_text(int slot) const;
  double load_seconds() const { return load_s_; }
  std::int64_t loaded_tokens() const { return loaded_tokens_; }

  // The model fingerprint a saved context carries (model/checkpoint/fingerprint.hpp): the
  // config, the weights' and tokenizer's digests (or the seed the weights were drawn from) and
  // how the weights were loaded.
  static std::string fingerprint(const model::Decoder& decoder, const model::WeightSource& source);

 private:
  bool active_ = false;
  std::string model_dir_;
  int slots_ = 1;
  std::unique_ptr<model::Tokenizer> tokenizer_;
  std::vector<std::int32_t> prompt_;
  std::vector<std::int32_t> document_;  // the ids a saved context holds (what was prefilled)
  std::string save_path_;
  std::string load_path_;
  std::unique_ptr<SavedContextFile> load_file_;  // --load-context, opened once
  std::optional<int> saved_max_seq_;
  std::vector<std::int32_t> stop_ids_;
  std::vector<model::TextStream> streams_;
  std::vector<std::string> texts_;
  std::vector<std::vector<std::int32_t>> slot_tokens_;  // what each slot holds
  double load_s_ = 0;
  std::int64_t loaded_tokens_ = 0;
};

}  // namespace kvo::tools
