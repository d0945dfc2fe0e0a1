#include "model/text/tokenizer_settings.hpp"

#include <sys/stat.h>

#include "kvoffload/error.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/checkpoint/strict_json.hpp"
#include "offload/util/input_file.hpp"

namespace kvo::model {

namespace {

// bos_token / eos_token: a string, or an AddedToken object {"content": ...}.
std::optional<std::string> token_content(const JsonField& settings, const char* key) {
  const std::optional<JsonField> value = settings.find(key);
  if (!value) return std::nullopt;
  if (value->json().is_string()) return value->text();
  if (value->json().is_object()) return value->at("content").text();
  throw value->error("must be a token (a string, or an object with its \"content\"), got " +
                     value->shown());
}

}  // namespace

bool path_exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

TokenizerSettings parse_tokenizer_settings(std::string_view text, const std::string& path) {
  Json document;
  const JsonField config = parse_json_object(text, path, document);
  TokenizerSettings settings;
  settings.source = path;
  settings.bos_token = token_content(config, "bos_token");
  settings.eos_token = token_content(config, "eos_token");
  if (const std::optional<JsonField> f = config.find("add_bos_token")) {
    settings.add_bos_token = f->boolean();
  }
  if (const std::optional<JsonField> f = config.find("add_eos_token")) {
    settings.add_eos_token = f->boolean();
  }
  if (const std::optional<JsonField> f = config.find("chat_template")) {
    // One template; a list of named ones ({"name", "template"}) is left for --chat to refuse.
    if (f->json().is_string()) {
      settings.chat_template = f->text();
    } else if (!f->json().is_array()) {
      throw f->error("must be a template (a string) or a list of named templates, got " +
                     f->shown());
    }
  }
  return settings;
}

TokenizerSettings read_tokenizer_settings(const std::string& model_dir) {
  TokenizerSettings settings;
  const std::string path = model_dir + "/tokenizer_config.json";
  if (path_exists(path)) {
    settings = parse_tokenizer_settings(read_regular_file(path, kMaxTokenizerConfigBytes), path);
  }
  const std::string jinja = model_dir + "/chat_template.jinja";
  if (path_exists(jinja)) settings.chat_template = read_regular_file(jinja, kMaxChatTemplateBytes);
  return settings;
}

std::vector<std::int32_t> parse_generation_eos(std::string_view text, const std::string& path) {
  Json document;
  const JsonField config = parse_json_object(text, path, document);
  std::vector<std::int32_t> ids;
  const std::optional<JsonField> eos = config.find("eos_token_id");
  if (!eos) return ids;
  const auto id = [](const JsonField& f) {
    return static_cast<std::int32_t>(f.integer(0, ModelLimits::kVocab - 1));
  };
  if (eos->json().is_array()) {
    for (const JsonField& e : eos->elements()) ids.push_back(id(e));
  } else {
    ids.push_back(id(*eos));
  }
  return ids;
}

std::vector<std::int32_t> read_generation_eos(const std::string& model_dir) {
  const std::string path = model_dir + "/generation_config.json";
  if (!path_exists(path)) return {};
  return parse_generation_eos(read_regular_file(path, kMaxGenerationConfigBytes), path);
}

}  // namespace kvo::model
