// kvo::model::Tokenizer: text to token ids and back, from a Hugging Face model directory.
//
//   tokenizer.json with a byte-level BPE model (GPT-2 style: Llama 3, Qwen2, SmolLM2), its
//   pre-tokenizer regexes on PCRE2, its added and special tokens, and the BOS/EOS settings of
//   tokenizer_config.json, as transformers applies them;
//   tokenizer.model (SentencePiece: Llama 2, Mistral) through the SentencePiece library.
//
// TextStream turns ids into text as they are generated without ever splitting a UTF-8
// character (a byte-level token may hold part of one).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "model/text/tokenizer_settings.hpp"

namespace kvo::model {

// Not safe to call from several threads at once, even through const: encode() keeps scratch
// state (a cache of pieces, the regular expressions' match data). kvo-serve shares one through a
// lock (tools/serve/serial_tokenizer.hpp).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // The ids of `text` (valid UTF-8, else kvo::Error naming the byte). Added and special tokens
  // written in the text become their ids. add_special: also the BOS/EOS the model's tokenizer
  // adds to a sequence (off for text that continues a sequence).
  virtual std::vector<std::int32_t> encode(const std::string& text, bool add_special) const = 0;
  // The bytes token `id` puts into decoded text; they may be part of a UTF-8 character.
  // `first`: the token starts the decoded text (SentencePiece drops its leading space there).
  // An id past vocab_size(), or one no token has (a model's padded embedding rows), decodes to
  // nothing, as Hugging Face tokenizers' decode does; a negative id throws kvo::Error.
  virtual std::string token_bytes(std::int32_t id, bool first) const = 0;
  virtual bool is_special(std::int32_t id) const = 0;
  // The id of an added or special token written exactly as `content`, if there is one.
  virtual std::optional<std::int32_t> special_id(const std::string& content) const = 0;
  // One past the largest id a token has: the rows of the model's embedding it may index.
  virtual int vocab_size() const = 0;
  // What it is, for messages: "byte-level BPE (tokenizer.json)".
  virtual std::string kind() const = 0;
  // The end-of-sequence token of tokenizer_config.json, if it names one.
  virtual std::optional<std::int32_t> eos_id() const = 0;

  // The text of `ids`; invalid UTF-8 becomes U+FFFD, as transformers' decode does.
  std::string decode(const std::vector<std::int32_t>& ids, bool skip_special) const;
};

// The tokenizer of a model directory: tokenizer.json if there is one, else tokenizer.model; or,
// when `model_dir` is a regular file, the tokenizer inside that GGUF file (tokenizer_gguf.hpp).
// Throws kvo::Error(kInvalidArgument) saying why there is none (no file, or a kind, normalizer
// or pre-tokenizer this code does not implement, named).
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir);
// The settings (special tokens, chat template) beside that tokenizer: the directory's
// tokenizer_config.json and chat_template.jinja, or the GGUF file's metadata.
TokenizerSettings load_tokenizer_settings(const std::string& model);

// Refuses (kvo::Error kInvalidArgument) a tokenizer that writes ids the model cannot embed: its
// vocab_size() above the model's vocab_size (`model_vocab`). A model with more rows than the
// tokenizer has ids (padding) is fine: those ids decode to nothing.
void check_tokenizer_fits(const Tokenizer& tokenizer, int model_vocab,
                          const std::string& model_dir);

// The ids that end generation for the model at `model_dir`: generation_config.json's eos_token_id
// (a directory's), else the tokenizer's end-of-sequence token (a GGUF file has no such JSON);
// empty when there is neither.
std::vector<std::int32_t> stop_ids(const std::string& model_dir, const Tokenizer& tokenizer);

// Text of generated ids as they come: push() returns the text that is complete so far (a
// character split across tokens waits for its last byte); finish() returns what is left, any
// incomplete character as U+FFFD.
class TextStream {
 public:
  TextStream(const Tokenizer& tokenizer, bool skip_special)
      : tokenizer_(&tokenizer), skip_special_(skip_special) {}
  std::string push(std::int32_t id);
  std::string finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;  // bytes of an incomplete UTF-8 character
};

// UTF-8 helpers. valid_utf8_prefix: the length of the longest prefix of `bytes` that ends
// on a character boundary, with invalid sequences counted as complete (they decode to U+FFFD).
std::size_t complete_utf8_prefix(const std::string& bytes);
// `bytes` with each maximal invalid subsequence replaced by U+FFFD (Python's errors="replace").
std::string sanitize_utf8(const std::string& bytes);
// The offset of the first byte that is not valid UTF-8, or npos.
std::size_t invalid_utf8_at(const std::string& text);

}  // namespace kvo::model
