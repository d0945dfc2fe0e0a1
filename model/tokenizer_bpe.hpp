// Byte-level BPE from tokenizer.json (GPT-2 style, as Llama 3, Qwen2 and SmolLM2 use), the way
// Hugging Face tokenizers runs it: added tokens split out first (leftmost, longest), then the
// normalizer (none or NFC), the pre-tokenizers (ByteLevel, Split, Digits, Sequence; regexes with
// Unicode classes on PCRE2), byte-to-unicode mapping and merges by rank; BOS/EOS from
// tokenizer.json's TemplateProcessing, as transformers 5 applies it (it leaves
// tokenizer_config.json's add_bos_token/add_eos_token unapplied for such a tokenizer); the
// end-of-sequence token that stops generation from tokenizer_config.json's eos_token.
#pragma once

#include <memory>
#include <string>

#include "model/tokenizer.hpp"

namespace kvo::model {

// Throws kvo::Error(kInvalidArgument) naming the file and the part it cannot follow.
std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& model_dir);

}  // namespace kvo::model
