#include "model/tokenizer_settings.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kvoffload/error.hpp"

namespace kvo::model {

namespace {

std::optional<std::string> token_content(const nlohmann::json& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") && value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kInvalidArgument, "cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

TokenizerSettings read_tokenizer_settings(const std::string& model_dir) {
  TokenizerSettings settings;
  const std::string path = model_dir + "/tokenizer_config.json";
  std::ifstream probe(path);
  if (probe) {
    nlohmann::json config;
    try {
      config = nlohmann::json::parse(read_text_file(path));
    } catch (const nlohmann::json::exception& e) {
      throw Error(ErrorCode::kInvalidArgument, path + ": " + e.what());
    }
    if (config.is_object()) {
      if (config.contains("bos_token")) settings.bos_token = token_content(config["bos_token"]);
      if (config.contains("eos_token")) settings.eos_token = token_content(config["eos_token"]);
      if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
        settings.add_bos_token = config["add_bos_token"].get<bool>();
      }
      if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean()) {
        settings.add_eos_token = config["add_eos_token"].get<bool>();
      }
      if (config.contains("chat_template") && config["chat_template"].is_string()) {
        settings.chat_template = config["chat_template"].get<std::string>();
      }
    }
  }
  std::ifstream jinja(model_dir + "/chat_template.jinja");
  if (jinja) settings.chat_template = read_text_file(model_dir + "/chat_template.jinja");
  return settings;
}

}  // namespace kvo::model
