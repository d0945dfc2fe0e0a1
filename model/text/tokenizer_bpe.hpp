// Byte-level BPE from tokenizer.json (GPT-2 style, as Llama 3, Qwen2 and SmolLM2 use), the way
// Hugging Face tokenizers runs it: added tokens split out first (leftmost, longest), then the
// normalizer (none or NFC), the pre-tokenizers (ByteLevel, Split, Digits, Sequence; regexes with
// Unicode classes on PCRE2), byte-to-unicode mapping and merges by rank; BOS/EOS from
// tokenizer.json's TemplateProcessing, as transformers 5 applies it (it leaves
// tokenizer_config.json's add_bos_token/add_eos_token unapplied for such a tokenizer); the
// end-of-sequence token that stops generation from tokenizer_config.json's eos_token.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "model/text/tokenizer.hpp"
#include "model/text/tokenizer_settings.hpp"

namespace kvo::model {

// The largest tokenizer.json read (the largest in use, Gemma 3's, is about 33 MB).
inline constexpr std::uint64_t kMaxTokenizerJsonBytes = 512u << 20;

// model_dir/tokenizer.json with model_dir/tokenizer_config.json. Throws kvo::Error
// (kInvalidArgument) naming the file, the field and the part it cannot follow: an id outside
// [0, ModelLimits::kVocab) or not an integer, an empty vocabulary, a post-processor id the
// tokenizer lacks, a kind of model, normalizer or pre-tokenizer that is not implemented.
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& model_dir);

// GPT-2's byte alphabet, in which byte-level BPE spells every token: whether each character of
// `token` is the letter of a byte (false for text that is not valid UTF-8), and `bytes` spelled
// as their letters.
bool in_byte_alphabet(const std::string& token);
std::string byte_alphabet_spelling(std::string_view bytes);

// The same from the text of a tokenizer.json (`path` names it in errors) and settings already
// read.
std::unique_ptr<Tokenizer> parse_bpe_tokenizer(std::string_view tokenizer_json,
                                               const TokenizerSettings& settings,
                                               const std::string& path);

}  // namespace kvo::model
