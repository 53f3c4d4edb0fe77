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
   * file is options.model_file, else the first of load.dtype's candidates for `base` that exists
   * (onnx/<base><dtype suffix>.onnx, then <base><suffix>.onnx: "model", or an encoder-decoder's
   * "encoder_model"). */
  static ModelFolder open(const std::string& source, const PipelineOptions& options,
                          const std::string& base = "model");

  /** Whether open(source, options, base) would find its ONNX file: false for a source that is no folder,
   * file or repo, or has no such file (open() then says which). */
  static bool holds(const std::string& source, const PipelineOptions& options, const std::string& base);

  /** Another ONNX file of the same folder or repo commit, chosen by the options' dtype as open() chooses
   * (an encoder-decoder's "decoder_model_merged" beside its "encoder_model"); nullopt when there is none.
   * For hf:// sources it is fetched with its external-data files. */
  std::optional<std::filesystem::path> find_model(const std::string& base) const;

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
