#include "model/text/tokenizer_gguf.hpp"

#include <nlohmann/json.hpp>

#include "kvoffload/error.hpp"
#include "model/text/tokenizer_bpe.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {
namespace {

Error invalid(const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, what);
}

// `token` as byte-level BPE spells it: itself when already in the byte alphabet, else each of its
// bytes as that byte's letter (as transformers respells a GGUF file's plain-UTF-8 tokens).
std::string respelled(const std::string& token) {
  return in_byte_alphabet(token) ? token : byte_alphabet_spelling(token);
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
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    vocab[respelled(tokens[id])] = id;
  }
  nlohmann::ordered_json added = nlohmann::ordered_json::array();
  for (std::size_t id = 0; id < types.size(); ++id) {
    const std::string& token = tokens[id];
    // A control token written outside the byte alphabet is a mislabel of llama.cpp's, skipped as
    // transformers skips it; a user-defined one is added when the vocabulary has it as written.
    const bool special = types[id] == kControl && in_byte_alphabet(token);
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
