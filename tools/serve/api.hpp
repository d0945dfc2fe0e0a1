// kvo-serve's side of the OpenAI API: request bodies checked and turned into the engine's
// Completion, and the JSON of responses and stream chunks. No HTTP here: what a request means,
// and what goes back.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>

#include "model/text/chat_format.hpp"
#include "model/text/tokenizer.hpp"
#include "tools/serve/engine.hpp"

namespace kvo::serve {

// A request refused: the HTTP status and a message the client can show.
struct ApiError : std::runtime_error {
  ApiError(int code, const std::string& message) : std::runtime_error(message), status(code) {}
  int status;
};

// What every request is held to.
struct ApiLimits {
  int max_prompt_tokens = 0;  // a prompt's tokens
  int max_tokens = 0;         // max_tokens a request may ask for (and the default)
  int max_seq = 0;            // the prompt and what it generates, per slot
  int vocab = 0;
};

enum class Endpoint { kChat, kCompletions };

// A request body, checked: a Completion for the engine, and how to answer.
struct ApiRequest {
  Completion completion;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
};

// Parses and checks `body` (JSON) for `endpoint`. Unknown fields are ignored, as the API's own
// clients send some; a known field of the wrong type or out of range, a malformed body, an
// unknown role or a prompt past the limits is an ApiError(400) naming it. `chat` is the model's
// chat format (nullopt: the chat endpoint answers 400 with `no_chat_reason`).
ApiRequest parse_request(Endpoint endpoint, const std::string& body,
                         const model::Tokenizer& tokenizer,
                         const std::optional<model::ChatFormat>& chat,
                         const std::string& no_chat_reason, const ApiLimits& limits);

// {"error": {"message": ..., "type": ..., "code": null}}
std::string error_body(int status, const std::string& message);

// The response of a request that ended (`update`: what the job gave in all, its text whole).
nlohmann::json response_body(Endpoint endpoint, const std::string& id, std::int64_t created,
                             const std::string& model, const Update& update);
// A stream chunk: new text (`text`), or the end (finish_reason set), or usage alone.
nlohmann::json chunk_body(Endpoint endpoint, const std::string& id, std::int64_t created,
                          const std::string& model, const std::string& text,
                          const std::string& finish_reason, bool first);
nlohmann::json usage_body(const Update& update);

}  // namespace kvo::serve
