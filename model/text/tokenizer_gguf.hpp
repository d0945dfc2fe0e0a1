// The tokenizer inside a GGUF file (tokenizer.ggml.*), read as transformers' GGUF loader builds it
// and run by the byte-level BPE of tokenizer_bpe.hpp: the file's tokens (respelled into GPT-2's
// byte alphabet where a token is written in plain UTF-8), its merges, the tokens it marks control
// (special) and user-defined (added, not special), the pre-tokenizer its tokenizer.ggml.pre names
// (Llama 3's and Qwen2's splits; GPT-2's regex otherwise), a ByteLevel decoder, no BOS/EOS added
// (transformers adds none for these files), and the special tokens and chat template it states.
// Byte-level BPE files (tokenizer.ggml.model "gpt2": Llama 3, Qwen2/3, SmolLM2) are read so;
// SentencePiece ones ("llama": Llama 2, Mistral, Phi-3) become a SentencePiece model (BPE, byte
// fallback, identity normalization, the file's tokens, scores and types) run by the SentencePiece
// library as tokenizer_spm.hpp runs a tokenizer.model, with BOS added unless
// tokenizer.ggml.add_bos_token says not, and a space in front of the text's first stretch (every
// stretch for Phi-3, as transformers rebuilds it). Gemma's are refused by name.
#pragma once

#include <memory>
#include <string>

#include "model/checkpoint/gguf.hpp"
#include "model/text/tokenizer.hpp"
#include "model/text/tokenizer_settings.hpp"

namespace kvo::model {

// tokenizer.json's text for the tokenizer in `file`. Throws kvo::Error(kInvalidArgument) naming
// the file and the key.
std::string gguf_tokenizer_json(const GgufFile& file);
// A serialized SentencePiece ModelProto of a "llama" vocabulary in `file`. Throws
// kvo::Error(kInvalidArgument) naming the file and the key.
std::string gguf_sentencepiece_model(const GgufFile& file);
// The special tokens and chat template the file states (what tokenizer_config.json would).
TokenizerSettings gguf_tokenizer_settings(const GgufFile& file);
// Both, parsed: the tokenizer of the GGUF file at `path`.
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path);
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& file);

}  // namespace kvo::model
