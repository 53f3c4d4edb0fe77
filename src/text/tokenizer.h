// Internals of transmuter::text::Tokenizer (include/transmuter/text.h) over the C ABI of rust/
// (rust/include/transmuter_text.h).
#pragma once

#include <string>

namespace transmuter::text {

/** Throws the error a tt_* call returned, freeing it (a TokenizerFileError when `file_error`,
 * else a TokenizerError); NULL (success) returns. */
void throw_if_error(char* error, bool file_error = false);

/** transformers' clean_up_tokenization: drops the space the decoders leave before punctuation and
 * English contractions (" ." -> ".", " n't" -> "n't", " 's" -> "'s", ...). */
std::string clean_up_tokenization(std::string text);

}  // namespace transmuter::text
