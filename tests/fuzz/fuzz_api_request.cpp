// libFuzzer target: kvo-serve's request bodies, for both endpoints, with and without a chat
// format. The first byte picks the endpoint and the limits; the rest is the body. Either the
// body is refused with an ApiError of status 400 and a message, or it is a request the engine
// can run as it is: a prompt of 1 to max_prompt_tokens ids in the vocabulary, 1 <= max_tokens <=
// the limit, prompt + max_tokens within max_seq, sampling the sampler takes, at most 4 stop
// texts of 1 to 256 bytes. Nothing else may escape (a JSON type error, say).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "model/checkpoint/strict_json.hpp"
#include "model/decoder/sampler.hpp"
#include "model/text/chat_format.hpp"
#include "model/text/tokenizer.hpp"
#include "model/text/tokenizer_bpe.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "tools/serve/api.hpp"

namespace {

struct Fixture {
  std::unique_ptr<kvo::model::Tokenizer> tokenizer;
  kvo::model::ChatFormat chat;
  Fixture() {
    const std::string json = kvo::model::read_regular_file(KVO_FUZZ_TOKENIZER, 1 << 20);
    tokenizer = kvo::model::parse_bpe_tokenizer(json, {}, KVO_FUZZ_TOKENIZER);
    kvo::model::TokenizerSettings s;
    s.chat_template =
        "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
        "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ "
        "'<|im_start|>assistant\n' }}{% endif %}";
    chat = kvo::model::chat_format(s, std::nullopt);
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const Fixture f;
  if (size == 0) return 0;
  const std::uint8_t mode = data[0];
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  const auto endpoint =
      (mode & 1) != 0 ? kvo::serve::Endpoint::kChat : kvo::serve::Endpoint::kCompletions;
  std::optional<kvo::model::ChatFormat> chat;
  if ((mode & 2) == 0) chat = f.chat;
  kvo::serve::ApiLimits limits;
  limits.max_seq = 8 + (mode >> 2) * 4;  // 8 to 260
  limits.max_prompt_tokens = limits.max_seq - 1 - (mode >> 6);
  limits.max_tokens = 1 + (mode >> 3);
  limits.vocab = f.tokenizer->vocab_size();
  kvo::serve::ApiRequest r;
  try {
    r = kvo::serve::parse_request(endpoint, body, *f.tokenizer, chat, "no chat format", limits);
  } catch (const kvo::serve::ApiError& e) {
    if (e.status != 400 || std::string(e.what()).empty()) std::abort();
    return 0;
  }
  const kvo::serve::Completion& c = r.completion;
  const auto n = static_cast<std::int64_t>(c.prompt.size());
  if (n < 1 || n > limits.max_prompt_tokens) std::abort();
  for (const std::int32_t id : c.prompt) {
    if (id < 0 || id >= limits.vocab) std::abort();
  }
  if (c.max_tokens < 1 || c.max_tokens > limits.max_tokens || n + c.max_tokens > limits.max_seq) {
    std::abort();
  }
  try {
    kvo::model::check_sampling(c.sampling);
  } catch (...) {
    std::abort();
  }
  if (c.stop.size() > 4) std::abort();
  for (const std::string& s : c.stop) {
    if (s.empty() || s.size() > 256) std::abort();
  }
  return 0;
}
