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
#include "model/text/tokenizer_settings.hpp"

namespace kvo::model {

// Where a stretch of text (between control tokens) gets a space in front: only the one that
// starts the text without a space (Metaspace's prepend_scheme "first", LlamaTokenizer), or every
// stretch (a Prepend normalizer, as transformers rebuilds Phi-3's tokenizer from a GGUF file).
enum class SpacePrefix { kFirstStretch, kEveryStretch };

// Throws kvo::Error(kInvalidArgument) when the library cannot load the model, with its reason.
std::unique_ptr<Tokenizer> load_spm_tokenizer(const std::string& model_dir);
// The same from a serialized ModelProto (a GGUF file's vocabulary, tokenizer_gguf.hpp), named
// `source` in errors, with the file's settings and prefix rule; `kind` is what kind() says.
std::unique_ptr<Tokenizer> load_spm_tokenizer(const std::string& model_proto,
                                              const std::string& source,
                                              const TokenizerSettings& settings, SpacePrefix prefix,
                                              const std::string& kind);

}  // namespace kvo::model
