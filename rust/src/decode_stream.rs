//! Incremental decoding for streaming generation: `tokenizers`' DecodeStream algorithm
//! (`step_decode_stream`), with its state in a handle that shares the tokenizer. A step returns
//! text only once it ends in a complete UTF-8 character (byte-level BPE and byte-fallback tokens
//! may carry part of one), and the pieces concatenate to the full decode.

use std::ffi::c_char;
use std::sync::{Arc, RwLock};

use tokenizers::tokenizer::{step_decode_stream, Tokenizer};

use crate::ffi::{guard, handle, write_out, TtString};
use crate::tokenizer::TtTokenizer;

pub struct TtDecodeStream {
    tokenizer: Arc<RwLock<Tokenizer>>,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    prefix: String,
    prefix_index: usize,
}

/// A new stream over `tokenizer` (which it keeps alive; free either in any order).
#[no_mangle]
pub unsafe extern "C" fn tt_decode_stream_new(
    tokenizer: *const TtTokenizer,
    skip_special_tokens: i32,
    out: *mut *mut TtDecodeStream,
) -> *mut c_char {
    guard(|| {
        let tokenizer = handle(tokenizer, "tokenizer")?;
        let stream = TtDecodeStream {
            tokenizer: Arc::clone(&tokenizer.inner),
            skip_special_tokens: skip_special_tokens != 0,
            ids: Vec::new(),
            prefix: String::new(),
            prefix_index: 0,
        };
        write_out(out, Box::into_raw(Box::new(stream)), "out")
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_decode_stream_free(stream: *mut TtDecodeStream) {
    if !stream.is_null() {
        drop(Box::from_raw(stream));
    }
}

/// Feeds one id; `*out` is the new text, or a NULL string while the ids so far end inside a
/// character (or add no text).
#[no_mangle]
pub unsafe extern "C" fn tt_decode_stream_step(stream: *mut TtDecodeStream, id: u32, out: *mut TtString) -> *mut c_char {
    guard(|| {
        let s = stream.as_mut().ok_or("stream is NULL")?;
        let tokenizer = s.tokenizer.read().unwrap_or_else(|e| e.into_inner());
        let chunk = step_decode_stream(
            &tokenizer,
            vec![id],
            s.skip_special_tokens,
            &mut s.ids,
            &mut s.prefix,
            &mut s.prefix_index,
        )
        .map_err(|e| e.to_string())?;
        write_out(out, chunk.map_or_else(TtString::null, |t| TtString::from(&t)), "out")
    })
}
