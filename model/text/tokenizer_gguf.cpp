#include "model/text/tokenizer_gguf.hpp"

#include <nlohmann/json.hpp>
#include <set>

#include "kvoffload/error.hpp"
#include "model/text/tokenizer_bpe.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

// GPT-2's byte alphabet: the printable bytes stand for themselves, the other 68 for the code
// points 256 upwards, in byte order.
struct ByteAlphabet {
  std::uint32_t of_byte[256];
  std::set<std::uint32_t> letters;
  ByteAlphabet() {
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
      of_byte[b] = printable ? b : next++;
      letters.insert(of_byte[b]);
    }
  }
};

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xc0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  } else {
    out += static_cast<char>(0xe0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
    out += static_cast<char>(0x80 | (cp & 0x3f));
  }
}

// Whether every character of `token` (UTF-8) is a letter of the byte alphabet; false for text
// that is not UTF-8.
bool spelled_in(const std::string& token, const ByteAlphabet& alphabet) {
  std::size_t i = 0;
  while (i < token.size()) {
    const auto c = static_cast<unsigned char>(token[i]);
    std::uint32_t cp = 0;
    int more = 0;
    if (c < 0x80) {
      cp = c;
    } else if ((c & 0xe0) == 0xc0) {
      cp = c & 0x1f;
      more = 1;
    } else if ((c & 0xf0) == 0xe0) {
      cp = c & 0x0f;
      more = 2;
    } else if ((c & 0xf8) == 0xf0) {
      cp = c & 0x07;
      more = 3;
    } else {
      return false;
    }
    if (more > 0 && i + static_cast<std::size_t>(more) >= token.size()) return false;
    for (int k = 1; k <= more; ++k) {
      const auto d = static_cast<unsigned char>(token[i + static_cast<std::size_t>(k)]);
      if ((d & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (d & 0x3f);
    }
    if (alphabet.letters.count(cp) == 0) return false;
    i += static_cast<std::size_t>(more) + 1;
  }
  return true;
}

// `token` as byte-level BPE spells it: itself when already in the byte alphabet, else each of its
// bytes as that byte's letter (as transformers respells a GGUF file's plain-UTF-8 tokens).
std::string respelled(const std::string& token, const ByteAlphabet& alphabet) {
  if (spelled_in(token, alphabet)) return token;
  std::string out;
  for (const char ch : token) append_utf8(out, alphabet.of_byte[static_cast<unsigned char>(ch)]);
  return out;
}

// The pre-tokenizer splits of the tokenizer.ggml.pre names, as transformers maps them.
const char* const kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* const kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* split_of(const std::string& pre) {
  for (const char* name : {"llama3", "llama-v3", "llama-bpe", "falcon3", "smaug-bpe", "dbrx"}) {
    if (pre == name) return kLlama3Split;
  }
  for (const char* name : {"qwen2", "deepseek-r1-qwen", "megrez"}) {
    if (pre == name) return kQwen2Split;
  }
  return nullptr;
}

constexpr std::int64_t kControl = 3;  // tokenizer.ggml.token_type
constexpr std::int64_t kUserDefined = 4;

}  // namespace

std::string gguf_tokenizer_json(const GgufFile& file) {
  const std::string kind = file.text("tokenizer.ggml.model");
  if (kind != "gpt2") {
    throw invalid(file.path() + ": tokenizer.ggml.model \"" + printable(kind) +
                  "\" is not read (gpt2, byte-level BPE, is)");
  }
  const std::vector<std::string>& tokens = file.strings("tokenizer.ggml.tokens");
  const std::vector<std::string>& merges = file.strings("tokenizer.ggml.merges");
  std::vector<std::int64_t> types;
  if (file.has("tokenizer.ggml.token_type")) {
    const GgufValue& v = file.at("tokenizer.ggml.token_type");
    if (v.type != GgufValueType::kArray || !v.is_integer || v.integers.size() != tokens.size()) {
      throw invalid(file.path() + ": tokenizer.ggml.token_type must be " +
                    std::to_string(tokens.size()) + " integers, one per token");
    }
    types = v.integers;
  }
  static const ByteAlphabet alphabet;
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    vocab[respelled(tokens[id], alphabet)] = id;
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (std::size_t id = 0; id < types.size(); ++id) {
    const std::string& token = tokens[id];
    // A control token written outside the byte alphabet is a mislabel of llama.cpp's, skipped as
    // transformers skips it; a user-defined one is added when the vocabulary has it as written.
    const bool special = types[id] == kControl && spelled_in(token, alphabet);
    const bool user = types[id] == kUserDefined && vocab.contains(token);
    if (!special && !user) continue;
    added.push_back({{"id", id},
                     {"content", token},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", special}});
  }
  nlohmann::ordered_json merge_list = nlohmann::ordered_json::array();
  for (const std::string& m : merges) {
    const std::size_t space = m.find(' ');
    if (space == std::string::npos) {
      throw invalid(file.path() + ": tokenizer.ggml.merges: \"" + printable(m) +
                    "\" is not two tokens");
    }
    merge_list.push_back({m.substr(0, space), m.substr(space + 1)});
  }
  const nlohmann::ordered_json byte_level = {{"type", "ByteLevel"},
                                             {"add_prefix_space", false},
                                             {"trim_offsets", true},
                                             {"use_regex", true}};
  nlohmann::ordered_json pre = byte_level;
  const std::string pre_name =
      file.has("tokenizer.ggml.pre") ? file.text("tokenizer.ggml.pre") : std::string();
  if (const char* split = split_of(pre_name)) {
    nlohmann::ordered_json plain = byte_level;
    plain["use_regex"] = false;
    pre = {{"type", "Sequence"},
           {"pretokenizers",
            {{{"type", "Split"},
              {"pattern", {{"Regex", split}}},
              {"behavior", "Isolated"},
              {"invert", false}},
             plain}}};
  }
  nlohmann::ordered_json j;
  j["version"] = "1.0";
  j["added_tokens"] = added;
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = pre;
  j["post_processor"] = nullptr;
  j["decoder"] = {{"type", "ByteLevel"},
                  {"add_prefix_space", true},
                  {"trim_offsets", true},
                  {"use_regex", true}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", false},
                {"vocab", vocab},
                {"merges", merge_list}};
  return j.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
}

TokenizerSettings gguf_tokenizer_settings(const GgufFile& file) {
  TokenizerSettings s;
  s.source = file.path();
  const std::vector<std::string>& tokens = file.strings("tokenizer.ggml.tokens");
  const auto token_at = [&](const char* key) -> std::optional<std::string> {
    if (!file.has(key)) return std::nullopt;
    const std::int64_t id = file.integer(key);
    if (id < 0 || static_cast<std::size_t>(id) >= tokens.size()) {
      throw invalid(file.path() + ": " + key + " is " + std::to_string(id) +
                    ", not a token of the " + std::to_string(tokens.size()));
    }
    return tokens[static_cast<std::size_t>(id)];
  };
  s.bos_token = token_at("tokenizer.ggml.bos_token_id");
  s.eos_token = token_at("tokenizer.ggml.eos_token_id");
  if (file.has("tokenizer.chat_template")) s.chat_template = file.text("tokenizer.chat_template");
  return s;
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const std::string& path) {
  const GgufFile file(path);
  return parse_bpe_tokenizer(gguf_tokenizer_json(file), gguf_tokenizer_settings(file),
                             path + " (its tokenizer as tokenizer.json)");
}

}  // namespace kvo::model
