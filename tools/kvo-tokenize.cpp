// kvo-tokenize: the tokenizer of a model directory on its own. Text on stdin -> token ids on
// stdout (one line, separated by spaces: the format of kvo-generate --prompt-tokens); with
// --decode, ids on stdin -> text.
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "kvoffload/error.hpp"
#include "model/chat_format.hpp"
#include "model/tokenizer.hpp"
#include "model/tokenizer_settings.hpp"
#include "tools/cli.hpp"

namespace {

constexpr const char* kUsage = R"(usage: kvo-tokenize --model DIR [options] < input

  --model DIR       model directory with tokenizer.json (byte-level BPE) or tokenizer.model
                    (SentencePiece), and tokenizer_config.json
  --decode          read token ids (spaces, commas or newlines between them), write the text
  --no-special      encode without the BOS/EOS the tokenizer adds to a sequence
  --skip-special    decode without special tokens
  --chat            wrap the text in the model's chat format (a user message, then the start
                    of the assistant's turn); --system TEXT replaces its default system message
)";

int run(int argc, char** argv) {
  const kvo::cli::Args args(argc, argv, {"model", "system"},
                            {"decode", "no-special", "skip-special", "chat", "help"});
  if (args.has("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (!args.has("model")) throw kvo::cli::UsageError("--model is required");
  const std::string dir = args.get("model", "");
  const auto tokenizer = kvo::model::load_tokenizer(dir);
  const std::string input{std::istreambuf_iterator<char>(std::cin),
                          std::istreambuf_iterator<char>()};
  if (args.has("decode")) {
    std::string words = input;
    for (char& c : words) {
      if (c == ',') c = ' ';
    }
    std::istringstream in(words);
    std::vector<std::int32_t> ids;
    std::string word;
    while (in >> word) {
      std::size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(word, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used != word.size() || id < 0 || id >= tokenizer->vocab_size()) {
        throw kvo::cli::UsageError("'" + word + "' is not a token id of this tokenizer (0.." +
                                   std::to_string(tokenizer->vocab_size() - 1) + ")");
      }
      ids.push_back(static_cast<std::int32_t>(id));
    }
    std::cout << tokenizer->decode(ids, args.has("skip-special"));
    return 0;
  }
  std::vector<std::int32_t> ids;
  if (args.has("chat")) {
    std::optional<std::string> system;
    if (args.has("system")) system = args.get("system", "");
    const kvo::model::ChatFormat chat =
        kvo::model::chat_format(kvo::model::read_tokenizer_settings(dir), system);
    ids = tokenizer->encode(chat.before + input + chat.after, /*add_special=*/false);
  } else {
    ids = tokenizer->encode(input, !args.has("no-special"));
  }
  std::string line;
  for (std::size_t i = 0; i < ids.size(); ++i) line += (i ? " " : "") + std::to_string(ids[i]);
  std::cout << line << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const kvo::cli::UsageError& e) {
    std::cerr << "kvo-tokenize: " << e.what() << "\n\n" << kUsage;
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "kvo-tokenize: " << e.what() << "\n";
    return 1;
  }
}
