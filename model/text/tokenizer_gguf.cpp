#include "model/text/tokenizer_gguf.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "kvoffload/error.hpp"
#include "model/text/tokenizer_bpe.hpp"
#include "model/text/tokenizer_spm.hpp"
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

// Protocol buffers' wire format, as much of it as a ModelProto needs.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}
void field_bytes(std::string& out, int field, const std::string& bytes) {
  varint(out, static_cast<std::uint64_t>(field) << 3 | 2);
  varint(out, bytes.size());
  out += bytes;
}
void field_int(std::string& out, int field, std::int64_t v) {  // int32, enum, bool
  varint(out, static_cast<std::uint64_t>(field) << 3);
  varint(out, static_cast<std::uint64_t>(v));  // a negative int32 as ten bytes, as protobuf does
}
void field_float(std::string& out, int field, float v) {
  varint(out, static_cast<std::uint64_t>(field) << 3 | 5);
  std::uint32_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(bits >> (8 * i)));
}

// The token types, one per token, each llama.cpp's 1 to 6 (normal, unknown, control,
// user-defined, unused, byte), or empty when the file has none.
std::vector<std::int64_t> token_types(const GgufFile& file, std::size_t tokens) {
  if (!file.has("tokenizer.ggml.token_type")) return {};
  const GgufValue& v = file.at("tokenizer.ggml.token_type");
  if (v.type != GgufValueType::kArray || !v.is_integer || v.integers.size() != tokens) {
    throw invalid(file.path() + ": tokenizer.ggml.token_type must be " + std::to_string(tokens) +
                  " integers, one per token");
  }
  for (std::size_t id = 0; id < tokens; ++id) {
    if (v.integers[id] < 1 || v.integers[id] > 6) {
      throw invalid(file.path() + ": tokenizer.ggml.token_type of token " + std::to_string(id) +
                    " is " + std::to_string(v.integers[id]) + ", not 1 to 6");
    }
  }
  return v.integers;
}

// A vocabulary maps ids and spellings one to one: two ids of one spelling would leave one of them
// unreachable (and the merges that name it ambiguous).
void check_distinct(const GgufFile& file, const std::vector<std::string>& spellings) {
  std::unordered_map<std::string, std::size_t> first;
  first.reserve(spellings.size());
  for (std::size_t id = 0; id < spellings.size(); ++id) {
    const auto [it, inserted] = first.emplace(spellings[id], id);
    if (!inserted) {
      throw invalid(file.path() + ": tokenizer.ggml.tokens holds '" + printable(spellings[id]) +
                    "' twice, as tokens " + std::to_string(it->second) + " and " +
                    std::to_string(id) + " (a vocabulary maps ids and tokens one to one)");
    }
  }
}

std::optional<std::int64_t> optional_id(const GgufFile& file, const char* key, std::size_t tokens) {
  if (!file.has(key)) return std::nullopt;
  const std::int64_t id = file.integer(key);
  if (id < 0 || static_cast<std::size_t>(id) >= tokens) {
    throw invalid(file.path() + ": " + key + " is " + std::to_string(id) + ", not a token of the " +
                  std::to_string(tokens));
  }
  return id;
}

}  // namespace

std::string gguf_sentencepiece_model(const GgufFile& file) {
  const std::vector<std::string>& tokens = file.strings("tokenizer.ggml.tokens");
  const GgufValue& scores = file.at("tokenizer.ggml.scores");
  if (scores.type != GgufValueType::kArray || scores.floats.size() != tokens.size()) {
    throw invalid(file.path() + ": tokenizer.ggml.scores must be " + std::to_string(tokens.size()) +
                  " numbers, one per token");
  }
  check_distinct(file, tokens);
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    const double score = scores.floats[id];
    if (!std::isfinite(score) || std::fabs(score) > 3.4028234663852886e38) {
      throw invalid(file.path() + ": tokenizer.ggml.scores of token " + std::to_string(id) +
                    " is " + (std::isnan(score) ? std::string("NaN") : std::to_string(score)) +
                    ", not a finite number");
    }
  }
  std::vector<std::int64_t> types = token_types(file, tokens.size());
  if (types.empty()) types.assign(tokens.size(), 1);
  // The unknown piece: the file's unknown_token_id, else the first piece typed unknown.
  std::optional<std::int64_t> unk =
      optional_id(file, "tokenizer.ggml.unknown_token_id", tokens.size());
  const auto bos = optional_id(file, "tokenizer.ggml.bos_token_id", tokens.size());
  const auto eos = optional_id(file, "tokenizer.ggml.eos_token_id", tokens.size());
  std::string model;
  for (std::size_t id = 0; id < tokens.size(); ++id) {
    // SentencePiece's piece types are llama.cpp's token types: 1 normal, 2 unknown, 3 control,
    // 4 user-defined, 5 unused, 6 byte.
    std::int64_t type = types[id];
    if (unk && static_cast<std::size_t>(*unk) == id) type = 2;
    if (!unk && type == 2) unk = static_cast<std::int64_t>(id);
    if (unk && type == 2 && static_cast<std::size_t>(*unk) != id) type = 3;  // one unknown piece
    // BOS and EOS are control pieces, whatever the file types them (SentencePiece finds them by
    // their pieces, named below, and only among control pieces).
    const auto here = static_cast<std::int64_t>(id);
    if (here == bos.value_or(-1) || here == eos.value_or(-1)) type = 3;
    std::string piece;
    field_bytes(piece, 1, tokens[id]);
    field_float(piece, 2, static_cast<float>(scores.floats[id]));
    field_int(piece, 3, type);
    field_bytes(model, 1, piece);
  }
  if (!unk) {
    throw invalid(file.path() +
                  ": a SentencePiece vocabulary needs an unknown token "
                  "(tokenizer.ggml.unknown_token_id, or a token of type 2)");
  }
  std::string trainer;
  field_int(trainer, 3, 2);  // model_type: BPE, as llama.cpp's "llama" vocabulary merges
  const bool bytes = std::find(types.begin(), types.end(), 6) != types.end();
  field_int(trainer, 35, bytes ? 1 : 0);  // byte_fallback, where the file has byte tokens
  field_int(trainer, 40, *unk);
  field_int(trainer, 41, bos.value_or(-1));
  field_int(trainer, 42, eos.value_or(-1));
  field_int(trainer, 43, -1);                                                 // pad_id
  field_bytes(trainer, 45, tokens[static_cast<std::size_t>(*unk)]);           // unk_piece
  if (bos) field_bytes(trainer, 46, tokens[static_cast<std::size_t>(*bos)]);  // bos_piece
  if (eos) field_bytes(trainer, 47, tokens[static_cast<std::size_t>(*eos)]);  // eos_piece
  field_bytes(model, 2, trainer);
  std::string normalizer;
  field_bytes(normalizer, 1, "identity");
  field_int(normalizer, 3, 1);  // add_dummy_prefix (the tokenizer places the prefix itself)
  field_int(normalizer, 4, 0);  // remove_extra_whitespaces
  field_int(normalizer, 5, 1);  // escape_whitespaces
  field_bytes(model, 3, normalizer);
  return model;
}

std::string gguf_tokenizer_json(const GgufFile& file) {
  const std::string kind = file.text("tokenizer.ggml.model");
  if (kind != "gpt2") {
    throw invalid(file.path() + ": tokenizer.ggml.model \"" + printable(kind) +
                  "\" is not byte-level BPE (gpt2)");
  }
  const std::vector<std::string>& tokens = file.strings("tokenizer.ggml.tokens");
  const std::vector<std::string>& merges = file.strings("tokenizer.ggml.merges");
  const std::vector<std::int64_t> types = token_types(file, tokens.size());
  std::vector<std::string> spellings;
  spellings.reserve(tokens.size());
  for (const std::string& token : tokens) spellings.push_back(respelled(token));
  check_distinct(file, spellings);
  nlohmann::ordered_json vocab = nlohmann::ordered_json::object();
  for (std::size_t id = 0; id < tokens.size(); ++id) vocab[spellings[id]] = id;
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
  return load_gguf_tokenizer(GgufFile(path));
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& file) {
  const std::string& path = file.path();
  const std::string kind = file.text("tokenizer.ggml.model");
  if (kind == "llama") {
    const std::string arch =
        file.has("general.architecture") ? file.text("general.architecture") : std::string();
    if (arch.rfind("gemma", 0) == 0) {
      throw invalid(path + ": the SentencePiece tokenizer of a " + printable(arch) +
                    " file is not read (Gemma's vocabulary is built differently)");
    }
    TokenizerSettings settings = gguf_tokenizer_settings(file);
    settings.add_bos_token = file.has("tokenizer.ggml.add_bos_token")
                                 ? file.integer("tokenizer.ggml.add_bos_token") != 0
                                 : true;
    settings.add_eos_token = file.has("tokenizer.ggml.add_eos_token") &&
                             file.integer("tokenizer.ggml.add_eos_token") != 0;
    return load_spm_tokenizer(
        gguf_sentencepiece_model(file), path, settings,
        arch == "phi3" ? SpacePrefix::kEveryStretch : SpacePrefix::kFirstStretch,
        "SentencePiece (from the GGUF file)");
  }
  if (kind != "gpt2") {
    throw invalid(path + ": tokenizer.ggml.model \"" + printable(kind) +
                  "\" is not read (gpt2, byte-level BPE, and llama, SentencePiece, are)");
  }
  return parse_bpe_tokenizer(gguf_tokenizer_json(file), gguf_tokenizer_settings(file),
                             path + " (its tokenizer as tokenizer.json)");
}

}  // namespace kvo::model
