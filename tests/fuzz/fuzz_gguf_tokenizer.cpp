// libFuzzer target: a whole GGUF file through the tokenizer built from it (byte-level BPE, or
// SentencePiece through the library), encoding and decoding. Either it is refused with
// kvo::Error, or every id a text encodes to is below the vocabulary's size and decodes, encoding
// is deterministic, and a byte-level BPE gives back the text's bytes in order, less only those no
// token spells (never a byte the text lacks; a character left incomplete by a dropped byte is
// decoded as U+FFFD, as transformers decodes it, which stands for what was dropped).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/text/tokenizer.hpp"
#include "model/text/tokenizer_gguf.hpp"

namespace {

// `text` less its U+FFFD replacement characters.
std::string without_replacements(std::string text) {
  for (std::size_t at = text.find("\xef\xbf\xbd"); at != std::string::npos;
       at = text.find("\xef\xbf\xbd", at)) {
    text.erase(at, 3);
  }
  return text;
}

// Whether `part` is `whole` with some bytes left out.
bool subsequence(const std::string& part, const std::string& whole) {
  std::size_t at = 0;
  for (const char c : whole) {
    if (at < part.size() && part[at] == c) ++at;
  }
  return at == part.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::unique_ptr<kvo::model::Tokenizer> t;
  std::string kind;
  try {
    const kvo::model::GgufFile file(reinterpret_cast<const std::byte*>(data), size, "fuzz.gguf");
    kind = file.text("tokenizer.ggml.model");
    t = kvo::model::load_gguf_tokenizer(file);
  } catch (const kvo::Error&) {
    return 0;
  }
  // Plain text, a special token's text, and the file's last bytes (where a mutation may write).
  std::vector<std::string> texts = {"the cat sat on the mat", "h\xc3\xa9llo  w\xc3\xb6rld\n\t",
                                    "<s>ab</s>", "<|end|> 12345", ""};
  texts.emplace_back(reinterpret_cast<const char*>(data) + (size > 48 ? size - 48 : 0),
                     size > 48 ? 48 : size);
  for (const std::string& text : texts) {
    std::vector<std::int32_t> ids;
    try {
      ids = t->encode(text, true);
    } catch (const kvo::Error&) {
      continue;  // text that is not UTF-8
    }
    for (const std::int32_t id : ids) {
      if (id < 0 || id >= t->vocab_size()) std::abort();
    }
    if (t->encode(text, true) != ids) std::abort();
    const std::string back = t->decode(ids, false);
    const std::string again = t->decode(t->encode(text, false), false);
    if (kind == "gpt2" && !subsequence(without_replacements(again), text)) {
      std::abort();
    }
    (void)back;
  }
  return 0;
}
