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
#include <vector>

#include "model/text/tokenizer_settings.hpp"

namespace kvo::model {

struct ChatFormat {
  std::string family;  // "ChatML"
  std::string before;  // the text before the user's message
  std::string after;   // the text after it, opening the assistant's turn
  // The system message the template writes when a conversation has none (SmolLM2's); nullopt
  // for a template that writes none.
  std::optional<std::string> default_system;
};

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// `system`: a system message to use instead of the template's default (or in addition to none).
// Throws kvo::Error(kInvalidArgument) when the model has no chat template, or one this code does
// not recognise, saying what is supported.
ChatFormat chat_format(const TokenizerSettings& settings, const std::optional<std::string>& system);

// A whole conversation in the format (chat_format(settings, nullopt)), as the template renders it
// with add_generation_prompt: each message in its turn, the default system message first where
// the template writes one and the conversation opens without one, then the assistant's turn
// opened. One user message renders as before + message + after. Throws
// kvo::Error(kInvalidArgument) for no messages, or a role other than system, user and assistant.
std::string chat_text(const ChatFormat& format, const std::vector<ChatMessage>& messages);

}  // namespace kvo::model
