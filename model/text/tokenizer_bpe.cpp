#include "model/text/tokenizer_bpe.hpp"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <nlohmann/json.hpp>
#include <queue>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {

namespace {

Error unsupported(const std::string& path, const std::string& what) {
  return Error(ErrorCode::kInvalidArgument, path + ": " + what);
}

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
  }
}

// GPT-2's reversible map of bytes to printable characters: printable Latin-1 bytes stand for
// themselves, the others for U+0100 onwards in byte order.
struct ByteMap {
  std::string char_of[256];                                 // UTF-8 of the character of each byte
  std::unordered_map<std::uint32_t, std::uint8_t> byte_of;  // code point -> byte
  ByteMap() {
    std::uint32_t next = 256;
    for (std::uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
      const std::uint32_t cp = printable ? b : next++;
      append_utf8(char_of[b], cp);
      byte_of[cp] = static_cast<std::uint8_t>(b);
    }
  }
};

const ByteMap& byte_map() {
  static const ByteMap map;
  return map;
}

// Code points of valid UTF-8.
std::vector<std::uint32_t> code_points(const std::string& text) {
  std::vector<std::uint32_t> out;
  for (std::size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    int n = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    std::uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3f);
    out.push_back(cp);
    i += static_cast<std::size_t>(n);
  }
  return out;
}

// A compiled PCRE2 pattern with Unicode classes (UTF + UCP), JIT-compiled where possible.
class Regex {
 public:
  Regex(const std::string& pattern, const std::string& source) : source_(source) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (code_ == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      throw unsupported(source, "PCRE2 cannot compile the pre-tokenizer pattern '" +
                                    printable(pattern, 120) + "' at offset " +
                                    std::to_string(offset) + ": " +
                                    reinterpret_cast<const char*>(message));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // an interpreter fallback if JIT is absent
    match_ = pcre2_match_data_create_from_pattern(code_, nullptr);
    // Long runs of one character class (a million spaces) need more than the JIT's default 32
    // KiB of stack; past 64 MiB a match fails with an error, never silently.
    context_ = pcre2_match_context_create(nullptr);
    jit_stack_ = pcre2_jit_stack_create(32 * 1024, 64 * 1024 * 1024, nullptr);
    if (match_ == nullptr || context_ == nullptr || jit_stack_ == nullptr) {
      free();
      throw std::bad_alloc();
    }
    pcre2_jit_stack_assign(context_, nullptr, jit_stack_);
  }
  ~Regex() { free(); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-empty matches [begin, end) in `text` (valid UTF-8), left to right.
  std::vector<std::pair<std::size_t, std::size_t>> find_all(const std::string& text) const {
    std::vector<std::pair<std::size_t, std::size_t>> out;
    std::size_t at = 0;
    while (at <= text.size()) {
      const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at,
                                 PCRE2_NO_UTF_CHECK, match_, context_);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        // A match or depth limit, or the JIT's stack: the text cannot be split as the
        // tokenizer says, and a partial split would be a wrong one.
        PCRE2_UCHAR message[256];
        pcre2_get_error_message(rc, message, sizeof(message));
        throw Error(ErrorCode::kInvalidArgument,
                    "the pre-tokenizer pattern of " + source_ + " failed on the text at byte " +
                        std::to_string(at) + " of a piece of " + std::to_string(text.size()) +
                        " bytes: " + reinterpret_cast<const char*>(message));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(match_);
      if (ov[1] > ov[0]) {
        out.emplace_back(ov[0], ov[1]);
        at = ov[1];
      } else {  // an empty match: step over one character
        at = ov[0] + 1;
        while (at < text.size() && (static_cast<unsigned char>(text[at]) & 0xc0) == 0x80) ++at;
      }
    }
    return out;
  }

 private:
  void free() {
    if (jit_stack_ != nullptr) pcre2_jit_stack_free(jit_stack_);
    if (context_ != nullptr) pcre2_match_context_free(context_);
    if (match_ != nullptr) pcre2_match_data_free(match_);
    pcre2_code_free(code_);
  }
  std::string source_;
  pcre2_code* code_ = nullptr;
  pcre2_match_data* match_ = nullptr;
  pcre2_match_context* context_ = nullptr;
  pcre2_jit_stack* jit_stack_ = nullptr;
};

std::string quote_regex(const std::string& literal) {
  return "\\Q" + literal + "\\E";
}

// One pre-tokenizer step: splits each piece into smaller ones.
struct PreTokenizer {
  enum class Kind { kSplit, kByteLevel };
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  Kind kind = Kind::kSplit;
  std::unique_ptr<Regex> regex;
  Behavior behavior = Behavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // ByteLevel

  void apply(const std::string& piece, std::vector<std::string>& out) const {
    std::string text = piece;
    if (kind == Kind::kByteLevel && add_prefix_space && (text.empty() || text[0] != ' ')) {
      text.insert(text.begin(), ' ');
    }
    if (!regex) {
      if (!text.empty()) out.push_back(text);
      return;
    }
    // The piece as alternating parts, each a match or not.
    struct Part {
      std::size_t begin, end;
      bool match;
    };
    std::vector<Part> parts;
    std::size_t at = 0;
    for (const auto& [b, e] : regex->find_all(text)) {
      if (b > at) parts.push_back({at, b, invert});
      parts.push_back({b, e, !invert});
      at = e;
    }
    if (at < text.size()) parts.push_back({at, text.size(), invert});

    // The folds of Hugging Face tokenizers' SplitDelimiterBehavior, over [begin, end) ranges.
    std::vector<std::pair<std::size_t, std::size_t>> result;
    bool previous_match = false;
    switch (behavior) {
      case Behavior::kRemoved:
        for (const Part& p : parts) {
          if (!p.match) result.emplace_back(p.begin, p.end);
        }
        break;
      case Behavior::kIsolated:
        for (const Part& p : parts) result.emplace_back(p.begin, p.end);
        break;
      case Behavior::kMergedWithPrevious:
        for (const Part& p : parts) {
          if (p.match && !previous_match && !result.empty()) {
            result.back().second = p.end;
          } else {
            result.emplace_back(p.begin, p.end);
          }
          previous_match = p.match;
        }
        break;
      case Behavior::kMergedWithNext:
        for (auto it = parts.rbegin(); it != parts.rend(); ++it) {
          if (it->match && !previous_match && !result.empty()) {
            result.back().first = it->begin;
          } else {
            result.emplace_back(it->begin, it->end);
          }
          previous_match = it->match;
        }
        std::reverse(result.begin(), result.end());
        break;
      case Behavior::kContiguous:
        for (const Part& p : parts) {
          if (p.match == previous_match && !result.empty()) {
            result.back().second = p.end;
          } else {
            result.emplace_back(p.begin, p.end);
          }
          previous_match = p.match;
        }
        break;
    }
    for (const auto& [b, e] : result) {
      if (e > b) out.push_back(text.substr(b, e - b));
    }
  }
};

// GPT-2's pre-tokenizer regex, which ByteLevel with use_regex applies.
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
};

bool is_space(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

class BpeTokenizer : public Tokenizer {
 public:
  BpeTokenizer(std::string_view json_text, const TokenizerSettings& settings,
               const std::string& path);

  std::vector<std::int32_t> encode(const std::string& text, bool add_special) const override;
  std::string token_bytes(std::int32_t id, bool /*first*/) const override {
    if (id < 0) throw Error(ErrorCode::kInvalidArgument, "negative token id " + std::to_string(id));
    // An id without a token (a model's padded embedding rows) decodes to nothing, as Hugging
    // Face tokenizers' decode does.
    if (static_cast<std::size_t>(id) >= bytes_of_.size()) return {};
    return bytes_of_[static_cast<std::size_t>(id)];
  }
  bool is_special(std::int32_t id) const override { return special_ids_.count(id) != 0; }
  std::optional<std::int32_t> special_id(const std::string& content) const override {
    for (const AddedToken& t : added_) {
      if (t.content == content) return t.id;
    }
    return std::nullopt;
  }
  int vocab_size() const override { return static_cast<int>(bytes_of_.size()); }
  std::string kind() const override { return "byte-level BPE (tokenizer.json)"; }
  std::optional<std::int32_t> eos_id() const override { return eos_; }

 private:
  void load_pre_tokenizer(const JsonField& node);
  void load_post_processor(const JsonField& node);
  std::int32_t id_of_token(const std::string& content, const std::string& what) const;
  void encode_segment(const std::string& text, std::vector<std::int32_t>& ids) const;
  void bpe(const std::string& piece, std::vector<std::int32_t>& ids) const;

  std::unordered_map<std::string, std::int32_t> vocab_;
  std::vector<std::string> bytes_of_;  // id -> the bytes it decodes to
  std::vector<bool> known_;            // id -> whether the vocabulary or an added token has it
  std::int32_t byte_id_[256] = {};
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<std::uint64_t, std::pair<std::uint32_t, std::int32_t>> merges_;
  bool ignore_merges_ = false;
  bool nfc_ = false;
  std::vector<PreTokenizer> pre_;
  std::vector<AddedToken> added_;
  std::unordered_set<std::int32_t> special_ids_;
  std::vector<std::int32_t> prefix_;  // BOS and the like, when add_special
  std::vector<std::int32_t> suffix_;
  std::optional<std::int32_t> eos_;
  mutable std::unordered_map<std::string, std::vector<std::int32_t>> cache_;
};

BpeTokenizer::BpeTokenizer(std::string_view json_text, const TokenizerSettings& settings,
                           const std::string& path) {
  Json document;
  const JsonField root = parse_json_object(json_text, path, document);
  const JsonField model = root.at("model");
  const std::string type = model.text_or("type", "");
  if (type != "BPE") {
    throw model.error("a '" + printable(type) + "' model; only BPE (byte-level) is implemented");
  }
  if (model.boolean_or("byte_fallback", false)) {
    throw model.error("a BPE with byte_fallback (SentencePiece style) is not implemented");
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (!model.text_or(key, "").empty()) {
      throw model.at(key).error("a BPE with one is not implemented");
    }
  }
  ignore_merges_ = model.boolean_or("ignore_merges", false);

  // Ids index tables: each one is checked to be an integer id the decoder can embed.
  const auto token_id = [](const JsonField& f) {
    return static_cast<std::int32_t>(f.integer(0, ModelLimits::kVocab - 1));
  };
  const JsonField vocab = model.at("vocab");
  std::int32_t max_id = -1;
  // A vocabulary maps ids and tokens one to one: a second token of an id would make the id
  // decode as either.
  std::unordered_map<std::int32_t, std::string> token_of;
  for (const auto& [token, id] : vocab.members()) {
    const std::int32_t value = token_id(id);
    const auto [it, inserted] = token_of.emplace(value, token);
    if (!inserted) {
      throw vocab.error("gives id " + std::to_string(value) + " to two tokens, '" +
                        printable(it->second) + "' and '" + printable(token) +
                        "' (a vocabulary maps ids and tokens one to one)");
    }
    vocab_[token] = value;
    max_id = std::max(max_id, value);
  }
  if (vocab_.empty()) throw vocab.error("is empty: a BPE needs at least its byte tokens");
  if (const std::optional<JsonField> added_tokens = root.find("added_tokens")) {
    for (const JsonField& t : added_tokens->elements()) {
      AddedToken added;
      added.content = t.at("content").text();
      added.id = token_id(t.at("id"));
      added.special = t.boolean_or("special", false);
      added.lstrip = t.boolean_or("lstrip", false);
      added.rstrip = t.boolean_or("rstrip", false);
      if (t.boolean_or("single_word", false)) {
        throw t.error("the added token '" + printable(added.content) +
                      "' is single_word, which is not implemented");
      }
      max_id = std::max(max_id, added.id);
      if (added.special) special_ids_.insert(added.id);
      added_.push_back(added);
    }
  }

  // Decoding: ByteLevel maps each character of a token back to its byte; a token with a
  // character outside the map (an added token such as "<|im_start|>" maps entirely, but one
  // with other characters might not) is taken as its own UTF-8.
  const ByteMap& map = byte_map();
  bytes_of_.assign(static_cast<std::size_t>(max_id) + 1, std::string());
  known_.assign(static_cast<std::size_t>(max_id) + 1, false);
  auto decoded = [&](const std::string& token) {
    if (invalid_utf8_at(token) != std::string::npos) return token;
    std::string bytes;
    for (std::uint32_t cp : code_points(token)) {
      const auto it = map.byte_of.find(cp);
      if (it == map.byte_of.end()) return token;
      bytes.push_back(static_cast<char>(it->second));
    }
    return bytes;
  };
  for (const auto& [token, id] : vocab_) {
    bytes_of_[static_cast<std::size_t>(id)] = decoded(token);
    known_[static_cast<std::size_t>(id)] = true;
  }
  for (const AddedToken& t : added_) {
    bytes_of_[static_cast<std::size_t>(t.id)] = decoded(t.content);
    known_[static_cast<std::size_t>(t.id)] = true;
  }
  // A byte whose character is not in the vocabulary (SmolLM2 lacks 21 of them, bytes no UTF-8
  // text holds) has no symbol: with no unk_token, Hugging Face tokenizers drops it, and so does
  // bpe(). A byte that some token spells but that has no token of its own would be dropped from
  // any other text: such a vocabulary is refused.
  std::vector<bool> spelled(256, false);
  std::unordered_set<std::int32_t> added_ids;  // matched whole, before the BPE: spell no bytes
  for (const AddedToken& t : added_) added_ids.insert(t.id);
  for (const auto& [token, id] : vocab_) {
    if (added_ids.count(id) != 0 || invalid_utf8_at(token) != std::string::npos) continue;
    for (const std::uint32_t cp : code_points(token)) {
      const auto it = map.byte_of.find(cp);
      if (it != map.byte_of.end()) spelled[it->second] = true;
    }
  }
  for (int b = 0; b < 256; ++b) {
    const auto it = vocab_.find(map.char_of[b]);
    byte_id_[b] = it == vocab_.end() ? -1 : it->second;
    if (byte_id_[b] < 0 && spelled[static_cast<std::size_t>(b)]) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "0x%02x", b);
      throw vocab.error(std::string("has tokens spelling byte ") + hex + " ('" +
                        printable(map.char_of[b]) +
                        "') but no token of that byte alone: a text holding it elsewhere could "
                        "not be encoded");
    }
  }
  std::uint32_t rank = 0;
  for (const JsonField& m : model.at("merges").elements()) {
    std::string left;
    std::string right;
    if (m.json().is_string()) {
      const std::string& text = m.text();
      const std::size_t space = text.find(' ');
      if (space == std::string::npos) {
        throw m.error("a merge without a space: '" + printable(text) + "'");
      }
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else {
      const std::vector<JsonField> pair = m.elements();
      if (pair.size() != 2) throw m.error("a merge must be two tokens, got " + m.shown());
      left = pair[0].text();
      right = pair[1].text();
    }
    const auto a = vocab_.find(left);
    const auto b = vocab_.find(right);
    const auto ab = vocab_.find(left + right);
    if (a == vocab_.end() || b == vocab_.end() || ab == vocab_.end()) {
      throw m.error("the merge '" + printable(left) + " " + printable(right) +
                    "' names a token not in the vocabulary");
    }
    const std::uint64_t key =
        (static_cast<std::uint64_t>(static_cast<std::uint32_t>(a->second)) << 32) |
        static_cast<std::uint32_t>(b->second);
    merges_.emplace(key, std::make_pair(rank++, ab->second));
  }

  if (const std::optional<JsonField> normalizer = root.find("normalizer")) {
    const std::string kind = normalizer->text_or("type", "");
    if (kind != "NFC") {
      throw normalizer->error("the normalizer '" + printable(kind) +
                              "' is not implemented (none and NFC are)");
    }
    nfc_ = true;
  }
  if (const std::optional<JsonField> pre = root.find("pre_tokenizer")) load_pre_tokenizer(*pre);
  const std::optional<JsonField> decoder = root.find("decoder");
  if (!decoder || decoder->text_or("type", "") != "ByteLevel") {
    throw(decoder ? *decoder : root).error("the decoder is not ByteLevel: not a byte-level BPE");
  }

  // BOS/EOS come from tokenizer.json's post-processor alone: transformers 5 (checked with 5.24)
  // builds a byte-level tokenizer.json as TokenizersBackend, which leaves add_bos_token and
  // add_eos_token of tokenizer_config.json unapplied; tokenizer_equality.py checks it.
  if (settings.eos_token) {
    eos_ = id_of_token(*settings.eos_token, settings.source + ": eos_token");
  }
  if (const std::optional<JsonField> post = root.find("post_processor")) {
    load_post_processor(*post);
  }
}

std::int32_t BpeTokenizer::id_of_token(const std::string& content, const std::string& what) const {
  if (const auto id = special_id(content)) return *id;
  const auto it = vocab_.find(content);
  if (it != vocab_.end()) return it->second;
  throw unsupported(what, "the token '" + printable(content) + "' is not in the vocabulary");
}

void BpeTokenizer::load_pre_tokenizer(const JsonField& node) {
  const std::string type = node.text_or("type", "");
  if (type == "Sequence") {
    for (const JsonField& step : node.at("pretokenizers").elements()) load_pre_tokenizer(step);
    return;
  }
  const std::string& path = node.file();
  PreTokenizer step;
  if (type == "ByteLevel") {
    step.kind = PreTokenizer::Kind::kByteLevel;
    step.add_prefix_space = node.boolean_or("add_prefix_space", false);
    if (node.boolean_or("use_regex", true))
      step.regex = std::make_unique<Regex>(kGpt2Pattern, path);
  } else if (type == "Split") {
    const JsonField pattern = node.at("pattern");
    if (const std::optional<JsonField> regex = pattern.find("Regex")) {
      step.regex = std::make_unique<Regex>(regex->text(), path);
    } else {
      step.regex = std::make_unique<Regex>(quote_regex(pattern.at("String").text()), path);
    }
    const std::string behavior = node.text_or("behavior", "Isolated");
    using B = PreTokenizer::Behavior;
    if (behavior == "Removed") {
      step.behavior = B::kRemoved;
    } else if (behavior == "Isolated") {
      step.behavior = B::kIsolated;
    } else if (behavior == "MergedWithPrevious") {
      step.behavior = B::kMergedWithPrevious;
    } else if (behavior == "MergedWithNext") {
      step.behavior = B::kMergedWithNext;
    } else if (behavior == "Contiguous") {
      step.behavior = B::kContiguous;
    } else {
      throw node.at("behavior")
          .error("the Split behavior '" + printable(behavior) + "' is unknown");
    }
    step.invert = node.boolean_or("invert", false);
  } else if (type == "Digits") {
    step.regex = std::make_unique<Regex>(
        node.boolean_or("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)", path);
  } else {
    throw node.error("the pre-tokenizer '" + printable(type) +
                     "' is not implemented (ByteLevel, Split, Digits and Sequence are)");
  }
  pre_.push_back(std::move(step));
}

void BpeTokenizer::load_post_processor(const JsonField& node) {
  const std::string type = node.text_or("type", "");
  if (type == "Sequence") {
    for (const JsonField& step : node.at("processors").elements()) load_post_processor(step);
    return;
  }
  if (type == "ByteLevel") return;  // offsets only
  if (type != "TemplateProcessing") {
    throw node.error("the post-processor '" + printable(type) +
                     "' is not implemented (TemplateProcessing, ByteLevel, Sequence are)");
  }
  bool after = false;
  const JsonField special_tokens = node.at("special_tokens");
  for (const JsonField& item : node.at("single").elements()) {
    item.require_object();
    if (item.find("Sequence")) {
      after = true;
      continue;
    }
    const std::string& name = item.at("SpecialToken").at("id").text();
    for (const JsonField& id : special_tokens.at(name).at("ids").elements()) {
      // An id the tokenizer does not know would reach the model as a token nobody wrote.
      const std::int64_t value = id.integer(0, ModelLimits::kVocab - 1);
      if (static_cast<std::size_t>(value) >= known_.size() ||
          !known_[static_cast<std::size_t>(value)]) {
        throw id.error("token id " + std::to_string(value) +
                       " is not in the tokenizer's vocabulary or added tokens");
      }
      (after ? suffix_ : prefix_).push_back(static_cast<std::int32_t>(value));
    }
  }
}

std::vector<std::int32_t> BpeTokenizer::encode(const std::string& text, bool add_special) const {
  if (const std::size_t bad = invalid_utf8_at(text); bad != std::string::npos) {
    throw Error(ErrorCode::kInvalidArgument,
                "the text is not valid UTF-8 (at byte " + std::to_string(bad) + ")");
  }
  std::vector<std::int32_t> ids;
  if (add_special) ids = prefix_;
  // Added tokens first: the leftmost match, the longest one there; lstrip/rstrip take the
  // whitespace beside it along.
  std::size_t start = 0;  // of the text not yet encoded
  std::size_t at = 0;
  while (at < text.size()) {
    const AddedToken* best = nullptr;
    for (const AddedToken& t : added_) {
      if (!t.content.empty() && text.compare(at, t.content.size(), t.content) == 0 &&
          (best == nullptr || t.content.size() > best->content.size())) {
        best = &t;
      }
    }
    if (best == nullptr) {
      ++at;
      continue;
    }
    std::size_t begin = at;
    std::size_t end = at + best->content.size();
    if (best->lstrip) {
      while (begin > start && is_space(static_cast<unsigned char>(text[begin - 1]))) --begin;
    }
    if (best->rstrip) {
      while (end < text.size() && is_space(static_cast<unsigned char>(text[end]))) ++end;
    }
    if (begin > start) encode_segment(text.substr(start, begin - start), ids);
    ids.push_back(best->id);
    start = at = end;
  }
  if (start < text.size()) encode_segment(text.substr(start), ids);
  ids.insert(ids.end(), suffix_.begin(), suffix_.end());
  return ids;
}

void BpeTokenizer::encode_segment(const std::string& segment,
                                  std::vector<std::int32_t>& ids) const {
  std::string text = segment;
  if (nfc_) {
    // With the length, not NUL-terminated: a NUL byte is a character like any other, and the
    // text after it is normalized too.
    utf8proc_uint8_t* normalized = nullptr;
    const utf8proc_ssize_t n =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                     static_cast<utf8proc_ssize_t>(text.size()), &normalized,
                     static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (n < 0) {
      throw Error(
          ErrorCode::kInvalidArgument,
          std::string("the NFC normalizer cannot normalize the text: ") + utf8proc_errmsg(n));
    }
    text.assign(reinterpret_cast<const char*>(normalized), static_cast<std::size_t>(n));
    std::free(normalized);
  }
  std::vector<std::string> pieces = {text};
  for (const PreTokenizer& step : pre_) {
    std::vector<std::string> next;
    for (const std::string& piece : pieces) step.apply(piece, next);
    pieces = std::move(next);
  }
  for (const std::string& piece : pieces) bpe(piece, ids);
}

void BpeTokenizer::bpe(const std::string& piece, std::vector<std::int32_t>& ids) const {
  if (piece.empty()) return;
  if (const auto hit = cache_.find(piece); hit != cache_.end()) {
    ids.insert(ids.end(), hit->second.begin(), hit->second.end());
    return;
  }
  std::vector<std::int32_t> out;
  const ByteMap& map = byte_map();
  if (ignore_merges_) {
    std::string mapped;
    for (char c : piece) mapped += map.char_of[static_cast<unsigned char>(c)];
    if (const auto it = vocab_.find(mapped); it != vocab_.end()) out.push_back(it->second);
  }
  if (out.empty()) {
    // Symbols in a linked list; candidate merges in a heap ordered by rank, then position (the
    // order Hugging Face tokenizers merges in). A popped candidate whose symbols changed since
    // it was pushed is stale and skipped.
    struct Symbol {
      std::int32_t id;
      int prev;
      int next;
    };
    std::vector<Symbol> symbols;
    for (char c : piece) {
      const std::int32_t id = byte_id_[static_cast<unsigned char>(c)];
      if (id >= 0) symbols.push_back({id, static_cast<int>(symbols.size()) - 1, -1});
    }
    const int n = static_cast<int>(symbols.size());
    for (int i = 0; i + 1 < n; ++i) symbols[static_cast<std::size_t>(i)].next = i + 1;
    struct Candidate {
      std::uint32_t rank;
      int left;
      std::int32_t left_id;
      std::int32_t right_id;
      bool operator>(const Candidate& o) const {
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto consider = [&](int left) {
      if (left < 0) return;
      const int right = symbols[static_cast<std::size_t>(left)].next;
      if (right < 0) return;
      const std::int32_t a = symbols[static_cast<std::size_t>(left)].id;
      const std::int32_t b = symbols[static_cast<std::size_t>(right)].id;
      const auto it =
          merges_.find((static_cast<std::uint64_t>(static_cast<std::uint32_t>(a)) << 32) |
                       static_cast<std::uint32_t>(b));
      if (it != merges_.end()) heap.push({it->second.first, left, a, b});
    };
    for (int i = 0; i + 1 < n; ++i) consider(i);
    std::vector<bool> alive(static_cast<std::size_t>(n), true);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      Symbol& left = symbols[static_cast<std::size_t>(c.left)];
      if (!alive[static_cast<std::size_t>(c.left)] || left.id != c.left_id || left.next < 0)
        continue;
      Symbol& right = symbols[static_cast<std::size_t>(left.next)];
      if (right.id != c.right_id) continue;
      const auto merged =
          merges_.find((static_cast<std::uint64_t>(static_cast<std::uint32_t>(c.left_id)) << 32) |
                       static_cast<std::uint32_t>(c.right_id));
      left.id = merged->second.second;
      alive[static_cast<std::size_t>(left.next)] = false;
      left.next = right.next;
      if (left.next >= 0) symbols[static_cast<std::size_t>(left.next)].prev = c.left;
      consider(left.prev);
      consider(c.left);
    }
    for (int i = n > 0 ? 0 : -1; i >= 0; i = symbols[static_cast<std::size_t>(i)].next) {
      out.push_back(symbols[static_cast<std::size_t>(i)].id);
    }
  }
  if (cache_.size() > (1u << 16)) cache_.clear();
  cache_.emplace(piece, out);
  ids.insert(ids.end(), out.begin(), out.end());
}

}  // namespace

std::unique_ptr<Tokenizer> parse_bpe_tokenizer(std::string_view tokenizer_json,
                                               const TokenizerSettings& settings,
                                               const std::string& path) {
  return std::make_unique<BpeTokenizer>(tokenizer_json, settings, path);
}

bool in_byte_alphabet(const std::string& token) {
  if (invalid_utf8_at(token) != std::string::npos) return false;
  const ByteMap& map = byte_map();
  for (const std::uint32_t cp : code_points(token)) {
    if (map.byte_of.count(cp) == 0) return false;
  }
  return true;
}

std::string byte_alphabet_spelling(std::string_view bytes) {
  const ByteMap& map = byte_map();
  std::string out;
  for (const char c : bytes) out += map.char_of[static_cast<unsigned char>(c)];
  return out;
}

std::unique_ptr<Tokenizer> load_bpe_tokenizer(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer.json";
  return parse_bpe_tokenizer(read_regular_file(path, kMaxTokenizerJsonBytes),
                             read_tokenizer_settings(model_dir), path);
}

}  // namespace kvo::model
