// What tokenizer_config.json (and chat_template.jinja) of a model directory say about special
// tokens and chat, and what generation_config.json says about stopping; read through JsonField,
// so that a field of the wrong type is refused naming the file and the field, never ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvo::model {

// Bounds on the files read here; a larger one is refused before it is read.
inline constexpr std::uint64_t kMaxTokenizerConfigBytes = 64u << 20;
inline constexpr std::uint64_t kMaxChatTemplateBytes = 16u << 20;
inline constexpr std::uint64_t kMaxGenerationConfigBytes = 16u << 20;
inline constexpr std::uint64_t kMaxTokenizerModelBytes = 256u << 20;

struct TokenizerSettings {
  std::string source;                    // the file read, for messages ("" when there was none)
  std::optional<std::string> bos_token;  // content of bos_token (a string or {"content": ...})
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;  // set only when the file says so
  std::optional<bool> add_eos_token;
  // chat_template.jinja, else tokenizer_config.json's chat_template when it is one string.
  std::optional<std::string> chat_template;
};

// A missing tokenizer_config.json gives empty settings; a malformed one throws
// kvo::Error(kInvalidArgument) "FILE: FIELD: what is wrong".
TokenizerSettings read_tokenizer_settings(const std::string& model_dir);
// The same from the text of a tokenizer_config.json (`path` names it in errors).
TokenizerSettings parse_tokenizer_settings(std::string_view text, const std::string& path);

// eos_token_id of model_dir/generation_config.json (a number or a list), empty when the file or
// the field is absent. Ids are integers in [0, ModelLimits::kVocab); anything else is refused.
std::vector<std::int32_t> read_generation_eos(const std::string& model_dir);
std::vector<std::int32_t> parse_generation_eos(std::string_view text, const std::string& path);

// Whether `path` exists (a missing optional file is not an error; one that exists must be a
// readable regular file).
bool path_exists(const std::string& path);

}  // namespace kvo::model
