#include "model/text/chat_format.hpp"

#include <cstdint>

#include "kvoffload/error.hpp"
#include "offload/util/printable.hpp"

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

// The text of a Jinja string literal's body written between single quotes, its escapes rendered
// as Jinja renders them (\n a newline, \x41 "A", \u00e9 "é", ...); nullopt for a body the
// literal does not hold whole (an unescaped quote) or an escape not rendered here.
std::optional<std::string> jinja_literal(const std::string& body) {
  std::string out;
  for (std::size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (c == '\'') return std::nullopt;
    if (c != '\\') {
      out += c;
      continue;
    }
    if (++i == body.size()) return std::nullopt;
    const char e = body[i];
    const char* simple = "\\\\''\"\"n\nt\tr\ra\ab\bf\fv\v";
    bool done = false;
    for (const char* p = simple; *p != '\0'; p += 2) {
      if (e == p[0]) {
        out += p[1];
        done = true;
        break;
      }
    }
    if (done) continue;
    const int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits == 0 || body.size() - i - 1 < static_cast<std::size_t>(digits)) return std::nullopt;
    std::uint32_t cp = 0;
    for (int k = 1; k <= digits; ++k) {
      const char h = body[i + static_cast<std::size_t>(k)];
      const int v = h >= '0' && h <= '9'   ? h - '0'
                    : h >= 'a' && h <= 'f' ? h - 'a' + 10
                    : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                           : -1;
      if (v < 0) return std::nullopt;
      cp = cp * 16 + static_cast<std::uint32_t>(v);
    }
    i += static_cast<std::size_t>(digits);
    if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return std::nullopt;
    if (cp < 0x80) {  // UTF-8
      out += static_cast<char>(cp);
    } else if (cp < 0x800) {
      out += static_cast<char>(0xc0 | (cp >> 6));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else if (cp < 0x10000) {
      out += static_cast<char>(0xe0 | (cp >> 12));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    } else {
      out += static_cast<char>(0xf0 | (cp >> 18));
      out += static_cast<char>(0x80 | ((cp >> 12) & 0x3f));
      out += static_cast<char>(0x80 | ((cp >> 6) & 0x3f));
      out += static_cast<char>(0x80 | (cp & 0x3f));
    }
  }
  return out;
}

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
  ChatFormat chat{"ChatML", "", "<|im_end|>\n<|im_start|>assistant\n", std::nullopt};
  const std::string smol = kSmolChatML;
  const std::size_t slot = smol.find(kDefault);
  if (text.size() > smol.size() - 1 && text.compare(0, slot, smol, 0, slot) == 0 &&
      text.compare(text.size() - (smol.size() - slot - 1), std::string::npos, smol, slot + 1,
                   std::string::npos) == 0) {
    // The default message as the template writes it, inside a string literal: rendered.
    const std::optional<std::string> default_system =
        jinja_literal(text.substr(slot, text.size() - (smol.size() - 1)));
    if (default_system) {
      chat.default_system = default_system;
      chat.before = "<|im_start|>system\n" + system.value_or(*default_system) +
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

std::string chat_text(const ChatFormat& format, const std::vector<ChatMessage>& messages) {
  if (messages.empty()) throw Error(ErrorCode::kInvalidArgument, "a conversation needs a message");
  std::string text;
  if (messages.front().role != "system" && format.default_system) {
    text = "<|im_start|>system\n" + *format.default_system + "<|im_end|>\n";
  }
  for (const ChatMessage& m : messages) {
    if (m.role != "system" && m.role != "user" && m.role != "assistant") {
      throw Error(
          ErrorCode::kInvalidArgument,
          "a message's role must be system, user or assistant, not '" + printable(m.role) + "'");
    }
    text += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  }
  return text + "<|im_start|>assistant\n";
}

}  // namespace kvo::model
