// What tokenizer_config.json (and chat_template.jinja) of a model directory say about special
// tokens and chat, read with nlohmann-json.
#pragma once

#include <optional>
#include <string>

namespace kvo::model {

struct TokenizerSettings {
  std::optional<std::string> bos_token;  // content of bos_token (a string or {"content": ...})
  std::optional<std::string> eos_token;
  std::optional<bool> add_bos_token;  // set only when the file says so
  std::optional<bool> add_eos_token;
  // chat_template.jinja, else tokenizer_config.json's chat_template when it is one string.
  std::optional<std::string> chat_template;
};

// A missing tokenizer_config.json gives empty settings; a malformed one throws
// kvo::Error(kInvalidArgument) naming the file and the parser's reason.
TokenizerSettings read_tokenizer_settings(const std::string& model_dir);

// The whole of a file, or kvo::Error(kInvalidArgument) naming it.
std::string read_text_file(const std::string& path);

}  // namespace kvo::model
