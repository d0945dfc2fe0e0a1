#include "tools/serve/api.hpp"

#include <cmath>
#include <limits>
#include <vector>

#include "kvoffload/error.hpp"
#include "offload/util/printable.hpp"

namespace kvo::serve {

namespace {

using nlohmann::json;

constexpr std::size_t kMaxStops = 4;
constexpr std::size_t kMaxStopBytes = 256;

[[noreturn]] void bad(const std::string& message) {
  throw ApiError(400, message);
}

const json* field(const json& body, const char* name) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

std::int64_t integer(const json& body, const char* name, std::int64_t lo, std::int64_t hi,
                     std::int64_t fallback) {
  const json* v = field(body, name);
  if (v == nullptr) return fallback;
  if (!v->is_number_integer()) {
    bad(std::string("'") + name + "' must be an integer from " + std::to_string(lo) + " to " +
        std::to_string(hi));
  }
  if (v->is_number_unsigned() ? v->get<std::uint64_t>() > static_cast<std::uint64_t>(hi)
                              : (v->get<std::int64_t>() < lo || v->get<std::int64_t>() > hi)) {
    bad(std::string("'") + name + "' is " + v->dump() + "; it must be from " + std::to_string(lo) +
        " to " + std::to_string(hi));
  }
  return v->get<std::int64_t>();
}

double real(const json& body, const char* name, double lo, double hi, bool lo_open,
            double fallback) {
  const json* v = field(body, name);
  if (v == nullptr) return fallback;
  const std::string range = std::string(lo_open ? "above " : "from ") + json(lo).dump() +
                            (lo_open ? " and at most " : " to ") + json(hi).dump();
  if (!v->is_number()) bad(std::string("'") + name + "' must be a number " + range);
  const double x = v->get<double>();
  if (!std::isfinite(x) || x > hi || x < lo || (lo_open && x == lo)) {
    bad(std::string("'") + name + "' is " + v->dump() + "; it must be " + range);
  }
  return x;
}

bool boolean(const json& body, const char* name, bool fallback) {
  const json* v = field(body, name);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) bad(std::string("'") + name + "' must be true or false");
  return v->get<bool>();
}

// A message's content: a string, or an array of {"type": "text", "text": ...} parts.
std::string content_text(const json& message, std::size_t index) {
  const std::string where = "messages[" + std::to_string(index) + "].content";
  const json* c = field(message, "content");
  if (c == nullptr) return {};
  if (c->is_string()) return c->get<std::string>();
  if (!c->is_array()) bad("'" + where + "' must be a string or an array of text parts");
  std::string text;
  for (const json& part : *c) {
    const json* type = part.is_object() ? field(part, "type") : nullptr;
    const json* t = part.is_object() ? field(part, "text") : nullptr;
    if (type == nullptr || !type->is_string() || *type != "text" || t == nullptr ||
        !t->is_string()) {
      bad("'" + where + "': only text parts ({\"type\": \"text\", \"text\": ...}) are served");
    }
    text += t->get<std::string>();
  }
  return text;
}

// The ids of `text`; text the tokenizer refuses (not UTF-8) is a 400, not a server error.
std::vector<std::int32_t> encode(const model::Tokenizer& tokenizer, const std::string& text,
                                 bool add_special, const char* what) {
  try {
    return tokenizer.encode(text, add_special);
  } catch (const Error& e) {
    bad(std::string(what) + ": " + e.what());
  }
}

std::vector<std::int32_t> prompt_ids(const json& body, const model::Tokenizer& tokenizer,
                                     int vocab) {
  const json* p = field(body, "prompt");
  if (p == nullptr) bad("'prompt' is required");
  if (p->is_string()) return encode(tokenizer, p->get<std::string>(), true, "'prompt'");
  if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) {
    return encode(tokenizer, (*p)[0].get<std::string>(), true, "'prompt'");
  }
  if (p->is_array() && !p->empty() && (*p)[0].is_number()) {
    std::vector<std::int32_t> ids;
    for (const json& id : *p) {
      if (!id.is_number_integer() || id.get<std::int64_t>() < 0 ||
          id.get<std::int64_t>() >= vocab) {
        bad("'prompt': token id " + id.dump() + " is not in the vocabulary (0 to " +
            std::to_string(vocab - 1) + ")");
      }
      ids.push_back(static_cast<std::int32_t>(id.get<std::int64_t>()));
    }
    return ids;
  }
  bad("'prompt' must be a string, or an array of one string or of token ids (one prompt a "
      "request)");
}

}  // namespace

ApiRequest parse_request(Endpoint endpoint, const std::string& body,
                         const model::Tokenizer& tokenizer,
                         const std::optional<model::ChatFormat>& chat,
                         const std::string& no_chat_reason, const ApiLimits& limits) {
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    bad(std::string("the body is not JSON: ") + e.what());
  }
  if (!j.is_object()) bad("the body must be a JSON object");
  ApiRequest r;
  Completion& c = r.completion;

  if (integer(j, "n", 1, 1, 1) != 1) bad("'n' must be 1");
  if (boolean(j, "echo", false)) bad("'echo' is not served");
  if (const json* lp = field(j, "logprobs"); lp != nullptr && !(lp->is_boolean() && !*lp)) {
    bad("'logprobs' is not served");
  }
  r.stream = boolean(j, "stream", false);
  c.ignore_eos = boolean(j, "ignore_eos", false);  // not the API's: llama.cpp's server's
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object()) bad("'stream_options' must be an object");
    r.include_usage = boolean(*so, "include_usage", false);
  }
  c.sampling.temperature = static_cast<float>(real(j, "temperature", 0, 2, false, 1.0));
  c.sampling.top_p = static_cast<float>(real(j, "top_p", 0, 1, true, 1.0));
  c.sampling.top_k = static_cast<int>(integer(j, "top_k", 0, limits.vocab, 0));
  c.seed = static_cast<std::uint64_t>(integer(j, "seed", std::numeric_limits<std::int64_t>::min(),
                                              std::numeric_limits<std::int64_t>::max(), 0));
  if (const json* stop = field(j, "stop")) {
    std::vector<json> items;
    if (stop->is_string()) {
      items.push_back(*stop);
    } else if (stop->is_array()) {
      items.assign(stop->begin(), stop->end());
    } else {
      bad("'stop' must be a string or an array of strings");
    }
    if (items.size() > kMaxStops) bad("'stop' holds at most 4 strings");
    for (const json& s : items) {
      if (!s.is_string() || s.get<std::string>().empty() ||
          s.get<std::string>().size() > kMaxStopBytes) {
        bad("each 'stop' must be a string of 1 to 256 bytes");
      }
      c.stop.push_back(s.get<std::string>());
    }
  }

  if (endpoint == Endpoint::kChat) {
    if (!chat) bad(no_chat_reason);
    const json* messages = field(j, "messages");
    if (messages == nullptr || !messages->is_array() || messages->empty()) {
      bad("'messages' must be a non-empty array of {\"role\", \"content\"}");
    }
    std::vector<model::ChatMessage> turns;
    for (std::size_t i = 0; i < messages->size(); ++i) {
      const json& m = (*messages)[i];
      const json* role = m.is_object() ? field(m, "role") : nullptr;
      if (role == nullptr || !role->is_string()) {
        bad("messages[" + std::to_string(i) + "] must be an object with a string 'role'");
      }
      const std::string name = role->get<std::string>();
      if (name != "system" && name != "user" && name != "assistant") {
        bad("messages[" + std::to_string(i) + "].role is '" + printable(name) +
            "'; it must be system, user or assistant");
      }
      turns.push_back({name, content_text(m, i)});
    }
    c.prompt = encode(tokenizer, model::chat_text(*chat, turns), false, "'messages'");
  } else {
    c.prompt = prompt_ids(j, tokenizer, limits.vocab);
  }
  if (c.prompt.empty()) bad("the prompt has no tokens");
  const auto n = static_cast<std::int64_t>(c.prompt.size());
  if (n > limits.max_prompt_tokens) {
    bad("the prompt has " + std::to_string(n) + " tokens; this server takes at most " +
        std::to_string(limits.max_prompt_tokens));
  }
  const char* tokens_name =
      field(j, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const bool given = field(j, tokens_name) != nullptr;
  const std::int64_t room = limits.max_seq - n;
  std::int64_t max_tokens = integer(j, tokens_name, 1, limits.max_tokens, limits.max_tokens);
  if (given && max_tokens > room) {
    bad("the prompt's " + std::to_string(n) + " tokens and '" + tokens_name + "' " +
        std::to_string(max_tokens) + " exceed the " + std::to_string(limits.max_seq) +
        " tokens of a slot");
  }
  max_tokens = std::min(max_tokens, room);
  if (max_tokens < 1) {
    bad("the prompt's " + std::to_string(n) + " tokens fill the " + std::to_string(limits.max_seq) +
        " tokens of a slot");
  }
  c.max_tokens = static_cast<int>(max_tokens);
  return r;
}

std::string error_body(int status, const std::string& message) {
  const char* type = status == 401   ? "authentication_error"
                     : status == 503 ? "server_busy"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  json j = {{"error", {{"message", message}, {"type", type}, {"code", nullptr}}}};
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

json usage_body(const Update& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.reused_tokens}}}};
}

json response_body(Endpoint endpoint, const std::string& id, std::int64_t created,
                   const std::string& model, const Update& u) {
  json choice = {{"index", 0}, {"finish_reason", u.finish_reason}};
  if (endpoint == Endpoint::kChat) {
    choice["message"] = {{"role", "assistant"}, {"content", u.text}};
  } else {
    choice["text"] = u.text;
    choice["logprobs"] = nullptr;
  }
  return {{"id", id},
          {"object", endpoint == Endpoint::kChat ? "chat.completion" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})},
          {"usage", usage_body(u)}};
}

json chunk_body(Endpoint endpoint, const std::string& id, std::int64_t created,
                const std::string& model, const std::string& text, const std::string& finish_reason,
                bool first) {
  json choice = {{"index", 0}};
  choice["finish_reason"] = finish_reason.empty() ? json(nullptr) : json(finish_reason);
  if (endpoint == Endpoint::kChat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (finish_reason.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
    choice["logprobs"] = nullptr;
  }
  return {{"id", id},
          {"object", endpoint == Endpoint::kChat ? "chat.completion.chunk" : "text_completion"},
          {"created", created},
          {"model", model},
          {"choices", json::array({choice})}};
}

}  // namespace kvo::serve
