// libFuzzer target: prompt text through byte-level BPE tokenizers (tests/tools/data, and the
// same with an NFC normalizer and a digit-splitting pre-tokenizer). Either the text is refused
// as not UTF-8 (a kvo::Error naming the byte), or its ids are in the vocabulary and decode back
// to the text itself (every byte has a token; NFC: to its normalized form, which NFC leaves as
// it is).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "kvoffload/error.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "model/text/tokenizer.hpp"
#include "model/text/tokenizer_bpe.hpp"

namespace {

struct Tokenizers {
  std::unique_ptr<kvo::model::Tokenizer> plain, nfc;
  Tokenizers() {
    const std::string json = kvo::model::read_regular_file(KVO_FUZZ_TOKENIZER, 1 << 20);
    plain = kvo::model::parse_bpe_tokenizer(json, {}, KVO_FUZZ_TOKENIZER);
    kvo::model::Json j = kvo::model::Json::parse(json);
    j["normalizer"] = {{"type", "NFC"}};
    j["pre_tokenizer"] = {{"type", "Sequence"},
                          {"pretokenizers",
                           {{{"type", "Digits"}, {"individual_digits", true}},
                            {{"type", "ByteLevel"}, {"add_prefix_space", false}}}}};
    nfc = kvo::model::parse_bpe_tokenizer(j.dump(), {}, "nfc variant");
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Tokenizers t;
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::int32_t> ids;
  try {
    ids = t.plain->encode(text, false);
  } catch (const kvo::Error&) {
    if (kvo::model::invalid_utf8_at(text) == std::string::npos) std::abort();
    return 0;
  }
  for (const std::int32_t id : ids) {
    if (id < 0 || id >= t.plain->vocab_size()) std::abort();
  }
  if (t.plain->decode(ids, false) != text) std::abort();
  const std::string normalized = t.nfc->decode(t.nfc->encode(text, false), false);
  if (t.nfc->decode(t.nfc->encode(normalized, false), false) != normalized) std::abort();
  return 0;
}
