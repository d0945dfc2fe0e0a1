// What every tokenizer shares: decoding, the UTF-8-safe stream, and the choice of tokenizer for a
// model directory (or a GGUF file).
#include "model/text/tokenizer.hpp"

#include <sys/stat.h>

#include "kvoffload/error.hpp"
#include "model/checkpoint/gguf.hpp"
#include "model/text/tokenizer_bpe.hpp"
#include "model/text/tokenizer_gguf.hpp"
#include "model/text/tokenizer_settings.hpp"
#include "model/text/tokenizer_spm.hpp"
#include "offload/util/input_file.hpp"

namespace kvo::model {

namespace {

// The length of a well-formed UTF-8 character at bytes[i] (1..4), 0 when bytes[i..] holds a
// valid but incomplete one, or -k when its first k bytes are a maximal invalid subpart.
int utf8_step(const std::string& bytes, std::size_t i) {
  const auto b = [&](std::size_t k) { return static_cast<unsigned char>(bytes[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  int need = 0;
  unsigned char lo = 0x80;
  unsigned char hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf) {
    need = 1;
  } else if (c >= 0xe0 && c <= 0xef) {
    need = 2;
    if (c == 0xe0) lo = 0xa0;
    if (c == 0xed) hi = 0x9f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    need = 3;
    if (c == 0xf0) lo = 0x90;
    if (c == 0xf4) hi = 0x8f;
  } else {
    return -1;
  }
  for (int k = 1; k <= need; ++k) {
    if (i + static_cast<std::size_t>(k) >= bytes.size()) return 0;
    const unsigned char next = b(static_cast<std::size_t>(k));
    const unsigned char min = k == 1 ? lo : 0x80;
    const unsigned char max = k == 1 ? hi : 0xbf;
    if (next < min || next > max) return -k;
  }
  return need + 1;
}

}  // namespace

std::size_t complete_utf8_prefix(const std::string& bytes) {
  std::size_t i = 0;
  while (i < bytes.size()) {
    const int step = utf8_step(bytes, i);
    if (step == 0) break;
    i += static_cast<std::size_t>(step < 0 ? -step : step);
  }
  return i;
}

std::string sanitize_utf8(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t i = 0;
  while (i < bytes.size()) {
    int step = utf8_step(bytes, i);
    if (step > 0) {
      out.append(bytes, i, static_cast<std::size_t>(step));
      i += static_cast<std::size_t>(step);
      continue;
    }
    out += "\xEF\xBF\xBD";  // U+FFFD
    i += step == 0 ? bytes.size() - i : static_cast<std::size_t>(-step);
  }
  return out;
}

std::size_t invalid_utf8_at(const std::string& text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const int step = utf8_step(text, i);
    if (step <= 0) return i;
    i += static_cast<std::size_t>(step);
  }
  return std::string::npos;
}

std::string Tokenizer::decode(const std::vector<std::int32_t>& ids, bool skip_special) const {
  std::string bytes;
  bool first = true;
  for (std::int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    const std::string piece = token_bytes(id, first);
    bytes += piece;
    first = first && piece.empty();
  }
  return sanitize_utf8(bytes);
}

std::string TextStream::push(std::int32_t id) {
  if (skip_special_ && tokenizer_->is_special(id)) return {};
  const std::string piece = tokenizer_->token_bytes(id, first_);
  pending_ += piece;
  first_ = first_ && piece.empty();
  const std::size_t complete = complete_utf8_prefix(pending_);
  std::string out = sanitize_utf8(pending_.substr(0, complete));
  pending_.erase(0, complete);
  return out;
}

std::string TextStream::finish() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

std::vector<std::int32_t> stop_ids(const std::string& model_dir, const Tokenizer& tokenizer) {
  std::vector<std::int32_t> ids;
  if (!is_gguf_model(model_dir)) ids = read_generation_eos(model_dir);
  if (ids.empty()) {
    if (const auto eos = tokenizer.eos_id()) ids.push_back(*eos);
  }
  return ids;
}

void check_tokenizer_fits(const Tokenizer& tokenizer, int model_vocab,
                          const std::string& model_dir) {
  if (tokenizer.vocab_size() > model_vocab) {
    throw Error(ErrorCode::kInvalidArgument,
                model_dir + ": the tokenizer (" + tokenizer.kind() + ") has ids up to " +
                    std::to_string(tokenizer.vocab_size() - 1) +
                    " but config.json's vocab_size is " + std::to_string(model_vocab) +
                    ": the model cannot embed every id the tokenizer writes (the tokenizer and the "
                    "weights are not of one model)");
  }
}

TokenizerSettings load_tokenizer_settings(const std::string& model) {
  return is_gguf_model(model) ? gguf_tokenizer_settings(GgufFile(model))
                              : read_tokenizer_settings(model);
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& model_dir) {
  if (is_gguf_model(model_dir)) return load_gguf_tokenizer(model_dir);
  struct stat st {};
  if (::stat(model_dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
    throw Error(ErrorCode::kInvalidArgument,
                model_dir + " is " + offload::file_kind(st.st_mode) +
                    ", neither a model directory nor a GGUF file, so text cannot be tokenized");
  }
  const std::string json = model_dir + "/tokenizer.json";
  const std::string spm = model_dir + "/tokenizer.model";
  // One that exists is read (and refused when it is not a regular file), never passed over.
  if (path_exists(json)) return load_bpe_tokenizer(model_dir);
  if (path_exists(spm)) return load_spm_tokenizer(model_dir);
  throw Error(ErrorCode::kInvalidArgument,
              "the model directory " + model_dir +
                  " has no tokenizer.json or tokenizer.model, so text cannot be tokenized (give "
                  "token ids with --prompt-tokens instead)");
}

}  // namespace kvo::model
