/* Transmuter's C ABI over Hugging Face `tokenizers` (the Rust crate in rust/).
 *
 * Conventions:
 * - Every function that can fail returns NULL on success, or an error message (NUL-terminated
 *   UTF-8) that the caller frees with tt_error_free. A panic inside tokenizers is caught at the
 *   boundary and returned as a message starting with "panic in tokenizers: ".
 * - Handles are opaque and freed by their own *_free function (NULL is ignored). A tokenizer is
 *   safe to use from several threads at once; an encodings or decode-stream handle is not.
 * - Strings handed out are TtString (bytes + length; data[len] is a NUL not counted in len; data
 *   is NULL for "no string"), freed with tt_string_free. Strings handed in are (pointer, length)
 *   and must be valid UTF-8.
 * - Offsets are byte offsets into the UTF-8 text a token came from. (The Rust crate's encode
 *   gives byte offsets; the Python package's gives character offsets.)
 */
#ifndef TRANSMUTER_TEXT_H
#define TRANSMUTER_TEXT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TtTokenizer TtTokenizer;
typedef struct TtEncodings TtEncodings;
typedef struct TtDecodeStream TtDecodeStream;

typedef struct TtString {
  char* data;
  size_t len;
} TtString;

void tt_error_free(char* error);
void tt_string_free(TtString s);

/* --- loading ------------------------------------------------------------------------------ */

/* Loads a tokenizer.json (errors name the file). Truncation and padding stored in the file are
 * dropped: they are given per call (TtEncodeOptions). */
char* tt_tokenizer_from_file(const char* path, TtTokenizer** out);
char* tt_tokenizer_from_json(const char* json, size_t len, TtTokenizer** out);
void tt_tokenizer_free(TtTokenizer* tokenizer);

/* The fields of tokenizer_config.json that are honoured; -1 in an int field: not in the file. */
typedef struct TtTokenizerConfig {
  uint64_t model_max_length;          /* 0: absent, or transformers' "no limit" sentinel */
  int32_t padding_side;               /* 0 right, 1 left */
  int32_t truncation_side;            /* 0 right, 1 left */
  int32_t clean_up_tokenization_spaces; /* 0, 1 */
  TtString pad_token;                 /* data NULL: absent; free with tt_string_free */
} TtTokenizerConfig;

char* tt_tokenizer_config_read(const char* path, TtTokenizerConfig* out);

/* --- encoding ----------------------------------------------------------------------------- */

typedef struct TtEncodeOptions {
  int32_t add_special_tokens;  /* the post-processor's [CLS]/[SEP], <s>... */
  int32_t truncate;            /* 0: no truncation; else to max_length tokens (specials included) */
  size_t max_length;
  size_t stride;               /* overlap of overflowing pieces (which are not returned) */
  int32_t truncation_strategy; /* 0 longest_first, 1 only_first, 2 only_second */
  int32_t truncation_side;     /* 0 right, 1 left */
  int32_t padding;             /* 0 none, 1 to the longest of the batch, 2 to pad_length */
  size_t pad_length;
  size_t pad_to_multiple_of;   /* 0: none */
  int32_t padding_side;        /* 0 right, 1 left */
  uint32_t pad_id;
  uint32_t pad_type_id;
  const char* pad_token;       /* NULL: tokenizer.json's "padding" pad token (pad_id ignored) */
  size_t pad_token_len;
} TtEncodeOptions;

/* One text, or a pair when pair is not NULL. */
typedef struct TtInput {
  const char* text;
  size_t text_len;
  const char* pair;
  size_t pair_len;
} TtInput;

/* Encodes count inputs as one batch: padding to the longest applies across them. */
char* tt_encode(const TtTokenizer* tokenizer, const TtEncodeOptions* options, const TtInput* inputs,
                size_t count, TtEncodings** out);
void tt_encodings_free(TtEncodings* encodings);
size_t tt_encodings_count(const TtEncodings* encodings);

/* Views into encoding `index`, valid until tt_encodings_free: arrays of len elements; offsets
 * holds 2 * len ([begin, end) byte offsets of token i at 2i, 2i + 1, into the text for
 * sequence_ids[i] == 0, into the pair for 1; special and pad tokens have -1 and (0, 0)). */
typedef struct TtEncodingView {
  size_t len;
  const uint32_t* ids;
  const uint32_t* type_ids;
  const uint32_t* attention_mask;
  const uint32_t* special_tokens_mask;
  const size_t* offsets;
  const int32_t* sequence_ids;
} TtEncodingView;

char* tt_encodings_get(const TtEncodings* encodings, size_t index, TtEncodingView* out);
/* Token string `token` of encoding `index` (a view, not NUL-terminated). */
char* tt_encodings_token(const TtEncodings* encodings, size_t index, size_t token, const char** data,
                         size_t* len);

/* --- decoding and the vocabulary ---------------------------------------------------------- */

/* Ids with no token are skipped (as tokenizers does). */
char* tt_decode(const TtTokenizer* tokenizer, const uint32_t* ids, size_t count, int32_t skip_special_tokens,
                TtString* out);

/* Incremental decoding (tokenizers' DecodeStream). The stream keeps the tokenizer alive. A step's
 * out is the new text, or data NULL while the ids so far end inside a UTF-8 character. */
char* tt_decode_stream_new(const TtTokenizer* tokenizer, int32_t skip_special_tokens, TtDecodeStream** out);
char* tt_decode_stream_step(TtDecodeStream* stream, uint32_t id, TtString* out);
void tt_decode_stream_free(TtDecodeStream* stream);

char* tt_token_to_id(const TtTokenizer* tokenizer, const char* token, size_t len, uint32_t* id, int32_t* found);
/* out->data is NULL when no token has the id. */
char* tt_id_to_token(const TtTokenizer* tokenizer, uint32_t id, TtString* out);
char* tt_vocab_size(const TtTokenizer* tokenizer, int32_t with_added_tokens, size_t* out);
/* The tokens joined by the tokenizer's decoder (by spaces when it has none), as transformers'
 * convert_tokens_to_string: token i is data[offsets[i], offsets[i + 1]); offsets has count + 1
 * entries. */
char* tt_tokens_to_string(const TtTokenizer* tokenizer, const char* data, const size_t* offsets, size_t count,
                          TtString* out);
/* The model's continuing-subword prefix ("##" for WordPiece); out->data NULL when it has none. */
char* tt_continuing_subword_prefix(const TtTokenizer* tokenizer, TtString* out);

typedef struct TtAddedToken {
  uint32_t id;
  int32_t special;
  TtString content;
} TtAddedToken;

/* tokenizer.json's added tokens, sorted by id; free with tt_added_tokens_free(*out, *count). */
char* tt_added_tokens(const TtTokenizer* tokenizer, TtAddedToken** out, size_t* count);
void tt_added_tokens_free(TtAddedToken* tokens, size_t count);

/* --- chat templates (minijinja, configured as transformers' apply_chat_template) ----------- */

typedef struct TtChatTemplate TtChatTemplate;

/* Reads a tokenizer_config.json: its chat_template (name empty: the string, or the entry named
 * "default" of a list; chat_template->data NULL when the file has none) and its special tokens
 * (bos_token, eos_token, unk_token, sep_token, pad_token, cls_token, mask_token,
 * additional_special_tokens; those set) as a JSON object. Free both with tt_string_free. */
char* tt_chat_template_config_read(const char* path, const char* name, size_t name_len, TtString* chat_template,
                                   TtString* special_tokens);

/* Compiles a template; a syntax error reads "chat template line N: syntax error: ...". */
char* tt_chat_template_new(const char* source, size_t len, TtChatTemplate** out);
void tt_chat_template_free(TtChatTemplate* chat_template);

/* The variables of one rendering, each JSON text (pointer + length; NULL: absent). */
typedef struct TtChatContext {
  const char* messages;       /* an array; NULL: [] */
  size_t messages_len;
  const char* tools;          /* an array; NULL: tools is none (as transformers passes it) */
  size_t tools_len;
  const char* documents;      /* an array; NULL: documents is none */
  size_t documents_len;
  int32_t add_generation_prompt;
  const char* special_tokens; /* an object, set first */
  size_t special_tokens_len;
  const char* extra;          /* an object, set last: overrides all of the above */
  size_t extra_len;
} TtChatContext;

/* Renders; an error from raise_exception(message) is exactly that message. Safe to call from
 * several threads at once. */
char* tt_chat_template_render(const TtChatTemplate* chat_template, const TtChatContext* context, TtString* out);

#ifdef __cplusplus
}
#endif

#endif /* TRANSMUTER_TEXT_H */
