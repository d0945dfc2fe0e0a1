#include "tools/generate/generate_text.hpp"

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <tuple>

#include "kvoffload/error.hpp"
#include "model/checkpoint/fingerprint.hpp"
#include "model/checkpoint/weights.hpp"
#include "model/text/chat_format.hpp"
#include "model/text/tokenizer.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "offload/util/byte_io.hpp"
#include "offload/util/input_file.hpp"

namespace kvo::tools {

namespace {

// What joins a question to the document before it.
constexpr const char* kQuestionSeparator = "\n\n";

using Clock = std::chrono::steady_clock;

}  // namespace

void TextOptions::read_given(const CLI::App& app) {
  has_prompt = app.count("--prompt") != 0;
  has_prompt_file = app.count("--prompt-file") != 0;
  has_system = app.count("--system") != 0;
  has_save_context = app.count("--save-context") != 0;
  has_load_context = app.count("--load-context") != 0;
  ids_given = app.count("--prompt-tokens") != 0 || app.count("--prompt-len") != 0;
}

void declare_text_options(CLI::App& app, TextOptions& o) {
  app.option_defaults()->group("Text (a model directory with tokenizer.json or tokenizer.model)");
  cli::add_text(app, "--prompt", o.prompt, "TEXT",
                "the prompt as text; after --prompt-file or --load-context, a question about "
                "the document, joined to it by a blank line");
  cli::add_text(app, "--prompt-file", o.prompt_file, "FILE",
                "the prompt (a document) as UTF-8 text: a regular file of at most 1 GiB");
  cli::add_flag(app, "--chat", o.chat,
                "wrap the prompt in the model's chat format (ChatML, as SmolLM2 writes it; other "
                "templates are refused)");
  cli::add_text(app, "--system", o.system, "TEXT", "with --chat: the system message to use");
  cli::add_flag(app, "--ignore-eos", o.ignore_eos,
                "generate --max-new tokens even past the end-of-sequence token");
  cli::add_text(app, "--save-context", o.save_context, "FILE",
                "after the prefill, save every slot's K/V rows, tokens and a model fingerprint "
                "to FILE (--max-seq defaults to the prompt + --max-new + 4096, room for "
                "questions); FILE must be absent or a regular file, and its directory writable, "
                "which is checked before the prefill");
  cli::add_text(app, "--load-context", o.load_context, "FILE",
                "restore the slots from FILE (a regular file of at most " +
                    std::to_string(offload::kMaxContextFileBytes >> 40) +
                    " TiB, saved by --save-context from the same weights and tokenizer) instead "
                    "of a prefill, then prefill --prompt (the question) and generate; --max-seq "
                    "defaults to the file's");
  cli::add_choice(app, "--context-reading", o.context_reading, {"mapped", "pread"},
                  "how --load-context reads the rows: mapped (the fastest; a page the system "
                  "cannot deliver, as of a failing disk, ends the process with SIGBUS) or pread "
                  "(which reports that as an error)");
}

TextSession::TextSession(const TextOptions& options, const std::string& model_dir, int slots,
                         int model_vocab)
    : model_dir_(model_dir), slots_(slots) {
  active_ = options.any();
  if (!active_) return;
  if (model_dir.empty()) {
    throw cli::UsageError(
        "text prompts and saved contexts need --model DIR with a tokenizer; a preset has "
        "none (give ids with --prompt-tokens or --prompt-len)");
  }
  if (options.ids_given) {
    throw cli::UsageError(
        "--prompt-tokens and --prompt-len give ids, the text options give text: use one or the "
        "other");
  }
  if (options.has_system && !options.chat) throw cli::UsageError("--system needs --chat");
  for (const auto& [given, path, name] :
       {std::tuple(options.has_save_context, options.save_context, "--save-context"),
        std::tuple(options.has_load_context, options.load_context, "--load-context")}) {
    if (given && path.empty()) throw cli::UsageError(std::string(name) + ": an empty path");
  }
  tokenizer_ = model::load_tokenizer(model_dir);
  model::check_tokenizer_fits(*tokenizer_, model_vocab, model_dir);
  save_path_ = options.save_context;
  load_path_ = options.load_context;
  // Refused now, not after the prefill whose rows it would hold.
  if (saves()) {
    try {
      check_save_path(save_path_);
    } catch (const Error& e) {
      throw cli::UsageError(std::string("--save-context: ") + e.what());
    }
  }

  std::optional<model::ChatFormat> chat;
  if (options.chat) {
    std::optional<std::string> system;
    if (options.has_system) system = options.system;
    chat = model::chat_format(model::load_tokenizer_settings(model_dir), system);
  }
  const std::string before = chat ? chat->before : "";
  const std::string after = chat ? chat->after : "";
  const bool add_special = !chat;  // a chat format writes its own special tokens
  std::optional<std::string> document;
  if (options.has_prompt_file) {
    try {
      document =
          offload::read_input_file(options.prompt_file, kMaxPromptFileBytes, "--prompt-file");
    } catch (const Error& e) {
      throw cli::UsageError(e.what());
    }
  }
  std::optional<std::string> question;
  if (options.has_prompt) question = options.prompt;

  if (loads()) {
    if (document) {
      throw cli::UsageError(
          "--prompt-file and --load-context exclude each other: the document "
          "comes from the saved context; ask with --prompt");
    }
    // Opened once: the headers now, the rows from the same open file after the plan.
    load_file_ = std::make_unique<SavedContextFile>(load_path_, options.context_reading == "pread"
                                                                    ? ContextReading::kPread
                                                                    : ContextReading::kMapped);
    const SavedContextInfo& info = load_file_->info();
    if (static_cast<int>(info.lengths.size()) != slots) {
      throw cli::UsageError("--load-context " + load_path_ + " holds " +
                            std::to_string(info.lengths.size()) + " saved context(s), for " +
                            std::to_string(slots) + " slot(s): use --slots " +
                            std::to_string(info.lengths.size()));
    }
    saved_max_seq_ = info.max_seq;
    for (int length : info.lengths) loaded_tokens_ = std::max<std::int64_t>(loaded_tokens_, length);
    if (question) {
      prompt_ = tokenizer_->encode(kQuestionSeparator + *question + after, false);
    } else if (chat) {
      prompt_ = tokenizer_->encode(after, false);
    }
  } else if (document && question) {
    prompt_ = tokenizer_->encode(before + *document, add_special);
    const auto tail = tokenizer_->encode(kQuestionSeparator + *question + after, false);
    prompt_.insert(prompt_.end(), tail.begin(), tail.end());
  } else if (document || question) {
    // Saved for questions to come: a chat turn stays open for them to close.
    const std::string& text = document ? *document : *question;
    prompt_ = tokenizer_->encode(before + text + (saves() ? "" : after), add_special);
  } else {
    throw cli::UsageError(
        "give the prompt with --prompt or --prompt-file (or a saved context "
        "with --load-context)");
  }
  if (prompt_.empty() && !loads()) throw cli::UsageError("the prompt has no tokens");

  if (!options.ignore_eos) stop_ids_ = model::stop_ids(model_dir, *tokenizer_);
  streams_.assign(static_cast<std::size_t>(slots), model::TextStream(*tokenizer_, true));
  texts_.assign(static_cast<std::size_t>(slots), std::string());
  slot_tokens_.assign(static_cast<std::size_t>(slots), std::vector<std::int32_t>());
}

std::vector<std::int32_t> TextSession::load_context(model::Decoder& decoder,
                                                    const model::WeightSource& source,
                                                    std::FILE* log) {
  std::vector<int> slots;
  for (int s = 0; s < slots_; ++s) slots.push_back(s);
  const auto start = Clock::now();
  std::vector<SlotContext> contexts =
      decoder.cache().load_slots(slots, *load_file_, fingerprint(decoder, source));
  load_s_ = std::chrono::duration<double>(Clock::now() - start).count();
  std::uint64_t bytes = 0;
  const CachePlan plan = decoder.cache().stats().plan;
  for (int s = 0; s < slots_; ++s) {
    slot_tokens_[static_cast<std::size_t>(s)] = contexts[static_cast<std::size_t>(s)].tokens;
    bytes += 2ull * plan.layers * plan.row_bytes * static_cast<std::uint64_t>(decoder.length(s));
  }
  std::fprintf(log,
               "  context         %lld tokens restored from %s in %.3f s (%s, %.2f GB/s); "
               "prefill skipped\n",
               static_cast<long long>(loaded_tokens_), load_path_.c_str(), load_s_,
               format_bytes(bytes).c_str(),
               load_s_ > 0 ? static_cast<double>(bytes) / load_s_ * 1e-9 : 0);
  if (!prompt_.empty()) return prompt_;
  // No question: the last restored token is fed again, for the logits of what follows it.
  for (int s = 0; s < slots_; ++s) {
    const std::vector<std::int32_t>& tokens = slot_tokens_[static_cast<std::size_t>(s)];
    if (tokens.empty() || static_cast<int>(tokens.size()) != decoder.length(s)) {
      throw Error(ErrorCode::kInvalidArgument,
                  "the saved context of slot " + std::to_string(s) +
                      " has no token ids to continue from: ask with --prompt");
    }
  }
  const std::int32_t last = slot_tokens_[0].back();
  for (int s = 0; s < slots_; ++s) {
    if (slot_tokens_[static_cast<std::size_t>(s)].back() != last) {
      throw Error(ErrorCode::kInvalidArgument,
                  "the saved slots end in different tokens: ask with --prompt");
    }
    decoder.cache().truncate_slot(s, decoder.length(s) - 1);
    slot_tokens_[static_cast<std::size_t>(s)].pop_back();
  }
  prompt_ = {last};
  return prompt_;
}

void TextSession::save_context(model::Decoder& decoder, const model::WeightSource& source,
                               std::FILE* log) {
  std::vector<int> slots;
  std::vector<SlotContext> contexts;
  const std::string model = fingerprint(decoder, source);
  for (int s = 0; s < slots_; ++s) {
    std::vector<std::int32_t> tokens = slot_tokens_[static_cast<std::size_t>(s)];
    tokens.insert(tokens.end(), prompt_.begin(), prompt_.end());
    if (static_cast<int>(tokens.size()) != decoder.length(s)) tokens.clear();  // fed-again token
    slots.push_back(s);
    contexts.push_back({std::move(tokens), model});
  }
  const auto start = Clock::now();
  decoder.cache().save_slots(slots, save_path_, contexts);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::fprintf(log, "  context         %d tokens saved to %s in %.3f s\n", decoder.length(0),
               save_path_.c_str(), seconds);
}

bool TextSession::stops(std::int32_t token) const {
  for (std::int32_t id : stop_ids_) {
    if (id == token) return true;
  }
  return false;
}

void TextSession::push(int slot, std::int32_t token, std::FILE* out) {
  const std::string text = streams_[static_cast<std::size_t>(slot)].push(token);
  texts_[static_cast<std::size_t>(slot)] += text;
  if (out != nullptr && !text.empty()) {
    std::fwrite(text.data(), 1, text.size(), out);
    std::fflush(out);
  }
}

void TextSession::finish(int slot, std::FILE* out) {
  const std::string text = streams_[static_cast<std::size_t>(slot)].finish();
  texts_[static_cast<std::size_t>(slot)] += text;
  if (out != nullptr && !text.empty()) std::fwrite(text.data(), 1, text.size(), out);
}

std::string TextSession::json_text(int slot) const {
  return nlohmann::json(texts_[static_cast<std::size_t>(slot)]).dump();
}

std::string TextSession::fingerprint(const model::Decoder& decoder,
                                     const model::WeightSource& source) {
  const model::DecoderOptions& o = decoder.options();
  return model::model_fingerprint(
      decoder.config(), source.checkpoint, source.seed,
      {decoder.weights_text(false), o.weight_format == "int8", o.q8_activations});
}

}  // namespace kvo::tools
