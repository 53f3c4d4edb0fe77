// Shared pieces of the `transmuter` command-line tool.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace transmuter {
namespace hub {
struct HubOptions;
}
}  // namespace transmuter

namespace transmuter::cli {

/** Parsed command line: positional arguments and repeatable --options. */
struct Args {
  std::vector<std::string> positional;
  std::multimap<std::string, std::string> options;

  bool has(const std::string& name) const { return options.count(name) > 0; }
  std::string get(const std::string& name, const std::string& fallback) const;
  std::vector<std::string> all(const std::string& name) const;
  int get_int(const std::string& name, int fallback) const;
};

/** `transmuter conformance ...`; returns the process exit code. */
int conformance_main(const Args& args);

/** Hub settings from the environment, with a progress bar on stderr when it is
 * a terminal and --quiet is not given (tools/hub_commands.cpp). */
std::shared_ptr<const hub::HubOptions> hub_options(const Args& args);
/** `transmuter download hf://...`. */
int download_main(const Args& args);
/** `transmuter cache ls|rm ...`. */
int cache_main(const Args& args);

/** `transmuter tokenize MODEL_OR_FOLDER [TEXT...]`: JSON lines of ids, tokens, byte offsets
 * (tools/text_commands.cpp). */
int tokenize_main(const Args& args);
/** `transmuter chat MODEL_OR_FOLDER --render`: the prompt the chat template renders for the
 * messages on stdin, as apply_chat_template(tokenize=False) (tools/text_commands.cpp). */
int chat_main(const Args& args);
/** A model file (model.onnx, tokenizer.json) stands for the folder that holds it. */
std::filesystem::path tokenizer_folder(const std::string& source);

/** `transmuter embed|classify|ner|fill-mask MODEL [TEXT...]`: the pipelines, JSON lines out, one
 * per text (tools/pipeline_commands.cpp). */
int embed_main(const Args& args);
int classify_main(const Args& args);
int ner_main(const Args& args);
int fill_mask_main(const Args& args);
/** `transmuter generate MODEL [PROMPT...]`: streams each prompt's continuation to stdout. */
int generate_main(const Args& args);
/** `transmuter chat MODEL` (without --render): one user message per line of stdin, replies streamed. */
int chat_session_main(const Args& args);

}  // namespace transmuter::cli
