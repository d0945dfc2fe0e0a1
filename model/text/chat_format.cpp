#include "model/text/chat_format.hpp"

#include "kvoffload/error.hpp"

namespace kvo::model {

namespace {

// The templates recognised, as the model directory writes them; kDefault marks where
// SmolLM2's template keeps its default system message.
constexpr const char* kDefault = "\x01";
const char* const kSmolChatML =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\n\x01<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + "
    "'\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt "
    "%}{{ '<|im_start|>assistant\n' }}{% endif %}";
const char* const kPlainChatML =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' "
    "}}{% endif %}";

std::string trim(const std::string& s) {
  const std::size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

}  // namespace

ChatFormat chat_format(const TokenizerSettings& settings,
                       const std::optional<std::string>& system) {
  if (!settings.chat_template) {
    throw Error(ErrorCode::kInvalidArgument,
                "--chat: this model has no chat template (chat_template.jinja or "
                "tokenizer_config.json's chat_template); give the prompt as it is, without --chat");
  }
  const std::string text = trim(*settings.chat_template);
  ChatFormat chat{"ChatML", "", "<|im_end|>\n<|im_start|>assistant\n"};
  const std::string smol = kSmolChatML;
  const std::size_t slot = smol.find(kDefault);
  if (text.size() > smol.size() - 1 && text.compare(0, slot, smol, 0, slot) == 0 &&
      text.compare(text.size() - (smol.size() - slot - 1), std::string::npos, smol, slot + 1,
                   std::string::npos) == 0) {
    const std::string default_system = text.substr(slot, text.size() - (smol.size() - 1));
    if (default_system.find('\'') == std::string::npos) {
      chat.before = "<|im_start|>system\n" + system.value_or(default_system) +
                    "<|im_end|>\n<|im_start|>user\n";
      return chat;
    }
  }
  if (text == kPlainChatML) {
    chat.before = (system ? "<|im_start|>system\n" + *system + "<|im_end|>\n" : std::string()) +
                  "<|im_start|>user\n";
    return chat;
  }
  throw Error(ErrorCode::kInvalidArgument,
              "--chat: this model's chat template is not one kvo-generate can build faithfully "
              "(it builds ChatML as SmolLM2 and plain ChatML templates write it); format the "
              "conversation yourself and give it without --chat");
}

}  // namespace kvo::model
