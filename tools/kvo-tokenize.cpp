// kvo-tokenize: the tokenizer of a model directory (or a GGUF file) on its own. Text on stdin ->
// token ids on stdout (one line, separated by spaces: the format of kvo-generate --prompt-tokens);
// with
// --decode, ids on stdin -> text.
#include <cstdint>
#include <iostream>
#include <iterator>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/checkpoint/model_config.hpp"
#include "model/text/chat_format.hpp"
#include "model/text/tokenizer.hpp"
#include "offload/util/printable.hpp"
#include "tools/cli/cli.hpp"

namespace {

// The most text (or ids) read from standard input.
constexpr std::uint64_t kMaxInputBytes = std::uint64_t{1} << 30;

struct TokenizeArgs {
  std::string model;
  std::string system;
  bool decode = false;
  bool no_special = false;
  bool skip_special = false;
  bool chat = false;
};

void declare(CLI::App& app, TokenizeArgs& a) {
  kvo::cli::describe(app,
                     "The tokenizer of a model directory on its own: text on stdin (at most 1 "
                     "GiB) -> token ids on stdout (one line, spaces between: kvo-generate "
                     "--prompt-tokens reads it); with --decode, ids on stdin -> text.");
  kvo::cli::add_text(app, "--model", a.model, "DIR|FILE.gguf",
                     "model directory with tokenizer.json (byte-level BPE) or tokenizer.model "
                     "(SentencePiece), and tokenizer_config.json, regular files of at most: " +
                         kvo::model::model_file_bounds() +
                         "; or a GGUF file with a byte-level BPE tokenizer inside")
      ->required();
  kvo::cli::add_flag(app, "--decode", a.decode,
                     "read token ids (spaces, commas or newlines between them), write the text");
  kvo::cli::add_flag(app, "--no-special", a.no_special,
                     "encode without the BOS/EOS the tokenizer adds to a sequence");
  kvo::cli::add_flag(app, "--skip-special", a.skip_special, "decode without special tokens");
  kvo::cli::add_flag(app, "--chat", a.chat,
                     "wrap the text in the model's chat format (a user message, then the start "
                     "of the assistant's turn)");
  kvo::cli::add_text(app, "--system", a.system, "TEXT",
                     "with --chat: the system message to use instead of the default");
}

int run(const TokenizeArgs& a, const CLI::App& app) {
  const auto tokenizer = kvo::model::load_tokenizer(a.model);
  const std::string input = kvo::cli::read_standard_input(kMaxInputBytes);
  if (a.decode) {
    std::string words = input;
    for (char& c : words) {
      if (c == ',') c = ' ';
    }
    std::istringstream in(words);
    std::vector<std::int32_t> ids;
    std::string word;
    while (in >> word) {
      std::int64_t id = -1;
      if (!kvo::cli::read_integer(word, id) || id < 0 || id >= tokenizer->vocab_size()) {
        throw kvo::cli::UsageError("'" + kvo::printable(word) +
                                   "' is not a token id of this tokenizer (0.." +
                                   std::to_string(tokenizer->vocab_size() - 1) + ")");
      }
      ids.push_back(static_cast<std::int32_t>(id));
    }
    std::cout << tokenizer->decode(ids, a.skip_special);
    return 0;
  }
  if (app.count("--system") != 0 && !a.chat) throw kvo::cli::UsageError("--system needs --chat");
  std::vector<std::int32_t> ids;
  if (a.chat) {
    std::optional<std::string> system;
    if (app.count("--system") != 0) system = a.system;
    const kvo::model::ChatFormat chat =
        kvo::model::chat_format(kvo::model::load_tokenizer_settings(a.model), system);
    ids = tokenizer->encode(chat.before + input + chat.after, /*add_special=*/false);
  } else {
    ids = tokenizer->encode(input, !a.no_special);
  }
  std::string line;
  for (std::size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  std::cout << line << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("", "kvo-tokenize");
  TokenizeArgs args;
  declare(app, args);
  return kvo::cli::run(app, argc, argv, [&] { return run(args, app); });
}
