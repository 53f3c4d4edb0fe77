//! Transmuter's C ABI over Hugging Face `tokenizers` (declared in include/transmuter_text.h).
//!
//! Every exported function returns NULL on success or an error message (a NUL-terminated string
//! freed with `tt_error_free`), and runs its body inside `std::panic::catch_unwind`: a panic in
//! `tokenizers` becomes an error message, never an unwind across the C boundary. Handles are
//! opaque boxes freed by their own `*_free` function. Strings handed out are `TtString`s (bytes +
//! length, NUL-terminated as a convenience), freed with `tt_string_free`.
//!
//! Modules: `ffi` (errors, strings, the panic guard), `tokenizer` (load, encode, decode, vocab),
//! `decode_stream` (incremental decoding), `config` (tokenizer_config.json), `chat_template`
//! (minijinja configured as transformers' apply_chat_template).

mod chat_template;
mod config;
mod decode_stream;
mod ffi;
mod tokenizer;
