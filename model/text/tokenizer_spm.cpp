#include "model/text/tokenizer_spm.hpp"

#include <sentencepiece_processor.h>

#include <utility>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "offload/util/printable.hpp"

namespace kvo::model {

namespace {

// U+2581, SentencePiece's stand-in for a space.
constexpr const char* kSpaceMark = "\xE2\x96\x81";

// The byte of a byte piece "<0xAB>", or -1 when it is not one.
int byte_piece(const std::string& piece) {
  const auto hex = [](char c) {
    return c >= '0' && c <= '9'   ? c - '0'
           : c >= 'A' && c <= 'F' ? c - 'A' + 10
           : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                  : -1;
  };
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  const int hi = hex(piece[3]);
  const int lo = hex(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

// What the SentencePiece library says went wrong ("piece must not be empty."), less the
// "file.cc(123) " that names its own source; where it says nothing more, the check that failed
// ("[model_proto->ParseFromArray(...)]": the bytes are no ModelProto). Made printable.
std::string library_reason(const std::string& message) {
  std::string reason = message;
  const std::size_t paren = reason.find(") ");
  if (paren != std::string::npos && reason.find(".cc(") < paren) reason = reason.substr(paren + 2);
  if (!reason.empty() && reason[0] == '[') {
    const std::size_t close = reason.rfind(']');
    const std::string rest = close == std::string::npos ? "" : reason.substr(close + 1);
    if (rest.find_first_not_of(' ') == std::string::npos) {
      reason = "its check " + reason.substr(0, close + 1) + " failed";
    } else {
      reason = rest.substr(rest.find_first_not_of(' '));
    }
  }
  return printable(reason, 300);
}

class SpmTokenizer : public Tokenizer {
 public:
  // model: a serialized ModelProto, read from `path` (or built from it); settings: what
  // tokenizer_config.json (or the GGUF file) says.
  SpmTokenizer(const std::string& model, const std::string& path, const TokenizerSettings& settings,
               SpacePrefix prefix, std::string kind)
      : prefix_(prefix), kind_(std::move(kind)) {
    // The stretches of text are encoded without SentencePiece's own dummy prefix (the
    // Metaspace rule above decides where one goes): a second normalizer_spec (field 3) holding
    // add_dummy_prefix (its field 3) = false is appended, and protobuf merges it into the first.
    const std::string no_dummy_prefix("\x1a\x02\x18\x00", 4);
    const auto status = processor_.LoadFromSerializedProto(model + no_dummy_prefix);
    if (!status.ok()) {
      // The library's own reason, without the source line it starts with.
      throw Error(ErrorCode::kInvalidArgument,
                  path + ": not a SentencePiece model the library can read (a protobuf " +
                      "ModelProto): " + library_reason(std::string(status.message())));
    }
    const int n = processor_.GetPieceSize();
    bytes_of_.resize(static_cast<std::size_t>(n));
    for (int id = 0; id < n; ++id) {
      const std::string& piece = processor_.IdToPiece(id);
      std::string bytes;
      if (processor_.IsByte(id)) {  // "<0xAB>"
        const int byte = byte_piece(piece);
        if (byte < 0) {
          throw Error(ErrorCode::kInvalidArgument, path + ": piece " + std::to_string(id) +
                                                       " is a byte piece but reads '" +
                                                       printable(piece) + "', not <0xNN>");
        }
        bytes.push_back(static_cast<char>(byte));
      } else if (processor_.IsControl(id) || processor_.IsUnknown(id)) {
        bytes = piece;
        specials_.push_back({piece, id});
      } else {
        for (std::size_t i = 0; i < piece.size();) {
          if (piece.compare(i, 3, kSpaceMark) == 0) {
            bytes.push_back(' ');
            i += 3;
          } else {
            bytes.push_back(piece[i++]);
          }
        }
      }
      bytes_of_[static_cast<std::size_t>(id)] = bytes;
    }
    add_bos_ = settings.add_bos_token.value_or(true);
    add_eos_ = settings.add_eos_token.value_or(false);
    bos_ = processor_.bos_id();
    if (settings.eos_token) {
      // PieceToId gives the unknown token's id for a piece it lacks: that is no end of sequence.
      const int id = processor_.PieceToId(*settings.eos_token);
      if (id < 0 || processor_.IdToPiece(id) != *settings.eos_token) {
        throw Error(ErrorCode::kInvalidArgument, settings.source + ": eos_token: the token '" +
                                                     printable(*settings.eos_token) +
                                                     "' is not in " + path);
      }
      eos_ = id;
    } else if (processor_.eos_id() >= 0) {
      eos_ = processor_.eos_id();
    }
  }

  std::vector<std::int32_t> encode(const std::string& text, bool add_special) const override {
    if (const std::size_t bad = invalid_utf8_at(text); bad != std::string::npos) {
      throw Error(ErrorCode::kInvalidArgument,
                  "the text is not valid UTF-8 (at byte " + std::to_string(bad) + ")");
    }
    std::vector<std::int32_t> ids;
    if (add_special && add_bos_ && bos_ >= 0) ids.push_back(bos_);
    std::size_t start = 0;
    std::size_t at = 0;
    while (at < text.size()) {
      const Special* best = nullptr;
      for (const Special& s : specials_) {
        if (text.compare(at, s.content.size(), s.content) == 0 &&
            (best == nullptr || s.content.size() > best->content.size())) {
          best = &s;
        }
      }
      if (best == nullptr) {
        ++at;
        continue;
      }
      if (at > start) encode_stretch(text.substr(start, at - start), start == 0, ids);
      ids.push_back(best->id);
      start = at = at + best->content.size();
    }
    if (start < text.size()) encode_stretch(text.substr(start), start == 0, ids);
    if (add_special && add_eos_ && eos_) ids.push_back(*eos_);
    return ids;
  }

  std::string token_bytes(std::int32_t id, bool first) const override {
    if (id < 0) throw Error(ErrorCode::kInvalidArgument, "negative token id " + std::to_string(id));
    // An id past the pieces (a model's padded embedding rows) decodes to nothing.
    if (static_cast<std::size_t>(id) >= bytes_of_.size()) return {};
    const std::string& bytes = bytes_of_[static_cast<std::size_t>(id)];
    if (first && !bytes.empty() && bytes[0] == ' ') return bytes.substr(1);
    return bytes;
  }
  bool is_special(std::int32_t id) const override {
    if (id < 0 || static_cast<std::size_t>(id) >= bytes_of_.size()) return false;
    return processor_.IsControl(id) || processor_.IsUnknown(id);
  }
  std::optional<std::int32_t> special_id(const std::string& content) const override {
    for (const Special& s : specials_) {
      if (s.content == content) return s.id;
    }
    return std::nullopt;
  }
  int vocab_size() const override { return static_cast<int>(bytes_of_.size()); }
  std::string kind() const override { return kind_; }
  std::optional<std::int32_t> eos_id() const override { return eos_; }

 private:
  struct Special {
    std::string content;
    std::int32_t id;
  };

  void encode_stretch(const std::string& stretch, bool starts_text,
                      std::vector<std::int32_t>& ids) const {
    std::vector<int> pieces;
    const bool prepend =
        prefix_ == SpacePrefix::kEveryStretch ||
        (prefix_ == SpacePrefix::kFirstStretch && starts_text && stretch[0] != ' ');
    const std::string input = prepend ? " " + stretch : stretch;
    const auto status = processor_.Encode(input, &pieces);
    if (!status.ok()) {
      throw Error(ErrorCode::kInvalidArgument,
                  "SentencePiece cannot encode the text: " + status.ToString());
    }
    ids.insert(ids.end(), pieces.begin(), pieces.end());
  }

  SpacePrefix prefix_;
  std::string kind_;
  sentencepiece::SentencePieceProcessor processor_;
  std::vector<std::string> bytes_of_;
  std::vector<Special> specials_;
  bool add_bos_ = true;
  bool add_eos_ = false;
  std::int32_t bos_ = -1;
  std::optional<std::int32_t> eos_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_spm_tokenizer(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer.model";
  const std::string model = read_regular_file(path, kMaxTokenizerModelBytes);
  return std::make_unique<SpmTokenizer>(model, path, read_tokenizer_settings(model_dir),
                                        SpacePrefix::kFirstStretch,
                                        "SentencePiece (tokenizer.model)");
}

std::unique_ptr<Tokenizer> load_spm_tokenizer(const std::string& model_proto,
                                              const std::string& source,
                                              const TokenizerSettings& settings, SpacePrefix prefix,
                                              const std::string& kind) {
  return std::make_unique<SpmTokenizer>(model_proto, source, settings, prefix, kind);
}

}  // namespace kvo::model
