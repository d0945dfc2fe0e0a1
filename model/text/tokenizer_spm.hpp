// SentencePiece tokenizer.model (Llama 2, Mistral) through the SentencePiece library, applied the
// way transformers' LlamaTokenizer applies it: control tokens written in the text (<s>, </s>,
// <unk>, [INST], ...) become their ids; each stretch of text between them has its spaces as
// U+2581, with one U+2581 put in front only of a stretch that starts the text without a space
// (Metaspace, prepend_scheme "first"); decoding drops one leading space of the text. BOS/EOS
// follow tokenizer_config.json's add_bos_token (default true) and add_eos_token (default false).
#pragma once

#include <memory>
#include <string>

#include "model/text/tokenizer.hpp"

namespace kvo::model {

// Throws kvo::Error(kInvalidArgument) when the library cannot load the model, with its reason.
std::unique_ptr<Tokenizer> load_spm_tokenizer(const std::string& model_dir);

}  // namespace kvo::model
