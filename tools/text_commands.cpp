// `transmuter tokenize` and `transmuter chat --render`: Hugging Face tokenizers and chat templates
// from the command line (docs/text.md).
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "cli.h"
#include "json_out.h"
#include "transmuter/error.h"

#if TRANSMUTER_WITH_TEXT
#include "transmuter/text.h"

namespace fs = std::filesystem;

namespace transmuter::cli {
namespace {

void write_encoding(std::ostream& out, const text::Encoding& e) {
  out << "{\"ids\": [";
  for (size_t i = 0; i < e.size(); ++i) out << (i ? ", " : "") << e.ids[i];
  out << "], \"tokens\": [";
  for (size_t i = 0; i < e.size(); ++i) {
    if (i) out << ", ";
    write_json_string(out, e.tokens[i]);
  }
  out << "], \"offsets\": [";
  for (size_t i = 0; i < e.size(); ++i)
    out << (i ? ", " : "") << '[' << e.offsets[i].begin << ", " << e.offsets[i].end << ']';
  out << "]}\n";
}

}  // namespace

fs::path tokenizer_folder(const std::string& source) {
  fs::path path(source);
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) return path.parent_path().empty() ? fs::path(".") : path.parent_path();
  if (!fs::is_directory(path, ec)) throw Error(str(source, ": no such file or folder"));
  return path;
}

int tokenize_main(const Args& args) {
  if (args.positional.empty())
    throw Error("usage: transmuter tokenize MODEL_OR_FOLDER [TEXT...] [--pair TEXT] [--no-special-tokens]");
  text::Tokenizer tokenizer = text::Tokenizer::from_folder(tokenizer_folder(args.positional[0]));
  text::EncodeOptions options;
  options.add_special_tokens = !args.has("no-special-tokens");
  bool has_pair = args.has("pair");
  std::string pair = args.get("pair", "");
  auto tokenize = [&](const std::string& text) {
    write_encoding(std::cout,
                   has_pair ? tokenizer.encode_pair(text, pair, options) : tokenizer.encode(text, options));
  };
  if (args.positional.size() > 1) {
    for (size_t i = 1; i < args.positional.size(); ++i) tokenize(args.positional[i]);
  } else {
    for (std::string line; std::getline(std::cin, line);) tokenize(line);
  }
  return 0;
}

constexpr const char* kChatUsage =
    "usage: transmuter chat MODEL [--system TEXT] [generation options]   (user messages on stdin)\n"
    "       transmuter chat MODEL_OR_FOLDER --render [--tools FILE] [--add-generation-prompt] [--template "
    "NAME]";

int chat_main(const Args& args) {
  if (args.positional.size() != 1) throw Error(kChatUsage);
  if (!args.has("render")) return chat_session_main(args);
  text::ChatTemplate chat_template =
      text::ChatTemplate::from_folder(tokenizer_folder(args.positional[0]), args.get("template", ""));
  text::ChatTemplateOptions options;
  options.add_generation_prompt = args.has("add-generation-prompt");
  if (args.has("tools")) {
    const std::string path = args.get("tools", "");
    std::ifstream in(path, std::ios::binary);
    if (!in) throw Error(str(path, ": cannot read the tools file"));
    std::ostringstream tools;
    tools << in.rdbuf();
    options.tools_json = tools.str();
  }
  std::string messages((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
  std::cout << chat_template.render(messages, options) << std::flush;  // exactly the prompt: no newline added
  return 0;
}

}  // namespace transmuter::cli

#else

namespace transmuter::cli {

int tokenize_main(const Args&) {
  throw Error("tokenize: this transmuter is built without the text component (-DTRANSMUTER_TEXT=OFF)");
}

int chat_main(const Args&) {
  throw Error("chat: this transmuter is built without the text component (-DTRANSMUTER_TEXT=OFF)");
}

}  // namespace transmuter::cli

#endif
