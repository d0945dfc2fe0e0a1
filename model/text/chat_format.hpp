// The chat format of a model, where it can be built faithfully from the model directory: the
// text before a user's message and the text after it (up to the start of the assistant's turn).
// Only templates recognised exactly are built; anything else is refused, never guessed.
//
// Recognised: ChatML as SmolLM2 writes it (a default system message when the conversation has
// none), and plain ChatML (no default system message):
//   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{message}<|im_end|>\n
//   <|im_start|>assistant\n
#pragma once

#include <optional>
#include <string>

#include "model/text/tokenizer_settings.hpp"

namespace kvo::model {

struct ChatFormat {
  std::string family;  // "ChatML"
  std::string before;  // the text before the user's message
  std::string after;   // the text after it, opening the assistant's turn
};

// `system`: a system message to use instead of the template's default (or in addition to none).
// Throws kvo::Error(kInvalidArgument) when the model has no chat template, or one this code does
// not recognise, saying what is supported.
ChatFormat chat_format(const TokenizerSettings& settings, const std::optional<std::string>& system);

}  // namespace kvo::model
