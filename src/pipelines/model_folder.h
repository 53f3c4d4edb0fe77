// The files of a Hugging Face model: a local folder, or an hf:// repo at one commit whose files are
// fetched into the hub cache as the pipeline asks for them.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "transmuter/pipelines.h"
#include "transmuter/text.h"

namespace transmuter::pipelines {

class ModelFolder {
 public:
  /** source: a folder, a .onnx file inside one, or hf://org/repo[@revision][/path.onnx]. The ONNX
   * file is options.model_file, else the first of load.dtype's candidates that exists. */
  static ModelFolder open(const std::string& source, const PipelineOptions& options);

  /** The local path of the ONNX file (in the hub cache for hf:// sources). */
  const std::filesystem::path& model_path() const { return model_path_; }
  /** A file of the folder by its relative name ("1_Pooling/config.json"), or nullopt when there is
   * none. A name that is absolute or holds ".." is a PipelineError (names come from config files). */
  std::optional<std::filesystem::path> find(const std::string& name) const;
  /** tokenizer.json (and tokenizer_config.json beside it, when the folder has one), or a PipelineError
   * naming the folder: every text pipeline needs it. */
  text::Tokenizer tokenizer() const;
  /** The source as given, for messages. */
  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::filesystem::path dir_;     // local folders
  std::string repo_id_, commit_;  // hf:// sources
  std::filesystem::path model_path_;
  PipelineOptions options_;
};

}  // namespace transmuter::pipelines
