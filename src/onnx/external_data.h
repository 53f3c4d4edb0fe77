// The external-data files a model file names, found without loading it: the
// hub client fetches them next to the model before the loader maps them.
#pragma once

#include <filesystem>
#include <span>
#include <string>
#include <vector>

namespace transmuter {

/** The distinct `location` values of every TensorProto with data_location =
 * EXTERNAL in a ModelProto (graph and subgraph initializers, sparse
 * initializers, tensor attributes, function bodies), in the order found.
 * Throws ModelFormatError naming `file_label` on a malformed file. */
std::vector<std::string> external_data_locations(std::span<const uint8_t> model_bytes,
                                                 const std::string& file_label);

/** The same for a file on disk. */
std::vector<std::string> external_data_locations(const std::filesystem::path& model_file);

}  // namespace transmuter
