//! Loading, encoding and decoding with one `tokenizers::Tokenizer`.
//!
//! Truncation and padding are per call (`TtEncodeOptions`), as in transformers' `__call__`. The
//! tokenizer keeps them as state, so an encode whose options equal the current ones runs under a
//! read lock (concurrent callers), and one with other options sets them under the write lock.
//! A panic caught while a lock is held poisons it; the lock is taken anyway, because every encode
//! sets the options it needs and nothing else is written.

use std::ffi::{c_char, CStr};
use std::sync::{Arc, RwLock};

use tokenizers::tokenizer::{
    EncodeInput, Encoding, PaddingDirection, PaddingParams, PaddingStrategy, Tokenizer,
    TruncationDirection, TruncationParams, TruncationStrategy,
};

use crate::ffi::{guard, handle, utf8_arg, write_out, TtString};

/// The handle C holds. Decode streams share the tokenizer through the Arc.
pub struct TtTokenizer {
    pub inner: Arc<RwLock<Tokenizer>>,
    /// tokenizer.json's own "padding", whose pad token serves when a call names none.
    json_padding: Option<PaddingParams>,
}

fn new_handle(tokenizer: Tokenizer) -> *mut TtTokenizer {
    // A tokenizer.json may carry its own truncation/padding; options come per call instead.
    let mut tokenizer = tokenizer;
    let json_padding = tokenizer.get_padding().cloned();
    tokenizer.with_padding(None);
    let _ = tokenizer.with_truncation(None);
    Box::into_raw(Box::new(TtTokenizer { inner: Arc::new(RwLock::new(tokenizer)), json_padding }))
}

/// Loads a tokenizer.json file. The error names the file.
#[no_mangle]
pub unsafe extern "C" fn tt_tokenizer_from_file(path: *const c_char, out: *mut *mut TtTokenizer) -> *mut c_char {
    guard(|| {
        if path.is_null() {
            return Err("path is NULL".to_string());
        }
        let path = CStr::from_ptr(path).to_string_lossy().into_owned();
        let tokenizer = Tokenizer::from_file(&path).map_err(|e| format!("{path}: {e}"))?;
        write_out(out, new_handle(tokenizer), "out")
    })
}

/// Loads a tokenizer from the text of a tokenizer.json.
#[no_mangle]
pub unsafe extern "C" fn tt_tokenizer_from_json(json: *const c_char, len: usize, out: *mut *mut TtTokenizer) -> *mut c_char {
    guard(|| {
        let json = utf8_arg(json, len, "json")?;
        let tokenizer = Tokenizer::from_bytes(json.as_bytes()).map_err(|e| e.to_string())?;
        write_out(out, new_handle(tokenizer), "out")
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_tokenizer_free(tokenizer: *mut TtTokenizer) {
    if !tokenizer.is_null() {
        drop(Box::from_raw(tokenizer));
    }
}

/// Per-call options; see include/transmuter_text.h for each field.
#[repr(C)]
pub struct TtEncodeOptions {
    pub add_special_tokens: i32,
    pub truncate: i32,
    pub max_length: usize,
    pub stride: usize,
    pub truncation_strategy: i32,
    pub truncation_side: i32,
    pub padding: i32,
    pub pad_length: usize,
    pub pad_to_multiple_of: usize,
    pub padding_side: i32,
    pub pad_id: u32,
    pub pad_type_id: u32,
    pub pad_token: *const c_char,
    pub pad_token_len: usize,
}

/// One text, or a pair when `pair` is not NULL.
#[repr(C)]
pub struct TtInput {
    pub text: *const c_char,
    pub text_len: usize,
    pub pair: *const c_char,
    pub pair_len: usize,
}

fn truncation_of(o: &TtEncodeOptions) -> Result<Option<TruncationParams>, String> {
    if o.truncate == 0 {
        return Ok(None);
    }
    let strategy = match o.truncation_strategy {
        0 => TruncationStrategy::LongestFirst,
        1 => TruncationStrategy::OnlyFirst,
        2 => TruncationStrategy::OnlySecond,
        s => return Err(format!("unknown truncation strategy {s}")),
    };
    let direction = if o.truncation_side == 1 { TruncationDirection::Left } else { TruncationDirection::Right };
    Ok(Some(TruncationParams { direction, max_length: o.max_length, strategy, stride: o.stride }))
}

/// The pad token: the options' one, else the one tokenizer.json's "padding" named at load.
unsafe fn padding_of(o: &TtEncodeOptions, from_json: Option<&PaddingParams>) -> Result<Option<PaddingParams>, String> {
    let strategy = match o.padding {
        0 => return Ok(None),
        1 => PaddingStrategy::BatchLongest,
        2 => PaddingStrategy::Fixed(o.pad_length),
        p => return Err(format!("unknown padding mode {p}")),
    };
    let (pad_id, pad_token) = if !o.pad_token.is_null() {
        (o.pad_id, utf8_arg(o.pad_token, o.pad_token_len, "pad_token")?.to_string())
    } else if let Some(p) = from_json {
        (p.pad_id, p.pad_token.clone())
    } else {
        return Err("padding asked for, but the tokenizer has no pad token (tokenizer_config.json names none)".into());
    };
    Ok(Some(PaddingParams {
        strategy,
        direction: if o.padding_side == 1 { PaddingDirection::Left } else { PaddingDirection::Right },
        pad_to_multiple_of: if o.pad_to_multiple_of > 0 { Some(o.pad_to_multiple_of) } else { None },
        pad_id,
        pad_type_id: o.pad_type_id,
        pad_token,
    }))
}

fn same_truncation(a: Option<&TruncationParams>, b: Option<&TruncationParams>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            a.max_length == b.max_length && a.stride == b.stride && a.strategy == b.strategy && a.direction == b.direction
        }
        _ => false,
    }
}

fn same_padding(a: Option<&PaddingParams>, b: Option<&PaddingParams>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => {
            let strategy = match (&a.strategy, &b.strategy) {
                (PaddingStrategy::BatchLongest, PaddingStrategy::BatchLongest) => true,
                (PaddingStrategy::Fixed(x), PaddingStrategy::Fixed(y)) => x == y,
                _ => false,
            };
            let direction = matches!(
                (a.direction, b.direction),
                (PaddingDirection::Left, PaddingDirection::Left) | (PaddingDirection::Right, PaddingDirection::Right)
            );
            strategy
                && direction
                && a.pad_to_multiple_of == b.pad_to_multiple_of
                && a.pad_id == b.pad_id
                && a.pad_type_id == b.pad_type_id
                && a.pad_token == b.pad_token
        }
        _ => false,
    }
}

/// One encoding with its offsets flattened for C: `offsets[2i], offsets[2i + 1]` are token i's
/// [begin, end) byte offsets into the text (or pair) it came from; `sequence_ids[i]` is 0 for the
/// text, 1 for the pair, -1 for special and pad tokens.
struct EncodedItem {
    encoding: Encoding,
    offsets: Vec<usize>,
    sequence_ids: Vec<i32>,
}

pub struct TtEncodings {
    items: Vec<EncodedItem>,
}

fn item_of(encoding: Encoding) -> EncodedItem {
    let offsets = encoding.get_offsets().iter().flat_map(|&(b, e)| [b, e]).collect();
    let sequence_ids = encoding.get_sequence_ids().iter().map(|s| s.map_or(-1, |v| v as i32)).collect();
    EncodedItem { encoding, offsets, sequence_ids }
}

unsafe fn inputs_of<'a>(inputs: *const TtInput, count: usize) -> Result<Vec<EncodeInput<'a>>, String> {
    if count == 0 {
        return Ok(Vec::new());
    }
    if inputs.is_null() {
        return Err("inputs is NULL".into());
    }
    let mut out = Vec::with_capacity(count);
    for (i, input) in std::slice::from_raw_parts(inputs, count).iter().enumerate() {
        let text = utf8_arg(input.text, input.text_len, &format!("text {i}"))?;
        out.push(if input.pair.is_null() {
            EncodeInput::Single(text.into())
        } else {
            EncodeInput::Dual(text.into(), utf8_arg(input.pair, input.pair_len, &format!("pair {i}"))?.into())
        });
    }
    Ok(out)
}

/// Encodes `count` inputs as one batch (padding to the longest applies across them). Byte offsets.
#[no_mangle]
pub unsafe extern "C" fn tt_encode(
    tokenizer: *const TtTokenizer,
    options: *const TtEncodeOptions,
    inputs: *const TtInput,
    count: usize,
    out: *mut *mut TtEncodings,
) -> *mut c_char {
    guard(|| {
        let tokenizer = handle(tokenizer, "tokenizer")?;
        let options = handle(options, "options")?;
        let inputs = inputs_of(inputs, count)?;
        let add_special = options.add_special_tokens != 0;
        let truncation = truncation_of(options)?;
        let encodings = {
            let read = tokenizer.inner.read().unwrap_or_else(|e| e.into_inner());
            let padding = padding_of(options, tokenizer.json_padding.as_ref())?;
            if same_truncation(read.get_truncation(), truncation.as_ref()) && same_padding(read.get_padding(), padding.as_ref()) {
                read.encode_batch(inputs, add_special)
            } else {
                drop(read);
                let mut write = tokenizer.inner.write().unwrap_or_else(|e| e.into_inner());
                write.with_truncation(truncation).map_err(|e| e.to_string())?;
                write.with_padding(padding);
                write.encode_batch(inputs, add_special)
            }
        }
        .map_err(|e| e.to_string())?;
        let items = encodings.into_iter().map(item_of).collect();
        write_out(out, Box::into_raw(Box::new(TtEncodings { items })), "out")
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_encodings_free(encodings: *mut TtEncodings) {
    if !encodings.is_null() {
        drop(Box::from_raw(encodings));
    }
}

/// Number of encodings (one per input).
#[no_mangle]
pub unsafe extern "C" fn tt_encodings_count(encodings: *const TtEncodings) -> usize {
    encodings.as_ref().map_or(0, |e| e.items.len())
}

/// The views of encoding `index`: arrays of `len` elements (offsets: 2 * len), valid until
/// `tt_encodings_free`. Index out of range is an error.
#[repr(C)]
pub struct TtEncodingView {
    pub len: usize,
    pub ids: *const u32,
    pub type_ids: *const u32,
    pub attention_mask: *const u32,
    pub special_tokens_mask: *const u32,
    pub offsets: *const usize,
    pub sequence_ids: *const i32,
}

#[no_mangle]
pub unsafe extern "C" fn tt_encodings_get(encodings: *const TtEncodings, index: usize, out: *mut TtEncodingView) -> *mut c_char {
    guard(|| {
        let item = item_at(encodings, index)?;
        let e = &item.encoding;
        let view = TtEncodingView {
            len: e.len(),
            ids: e.get_ids().as_ptr(),
            type_ids: e.get_type_ids().as_ptr(),
            attention_mask: e.get_attention_mask().as_ptr(),
            special_tokens_mask: e.get_special_tokens_mask().as_ptr(),
            offsets: item.offsets.as_ptr(),
            sequence_ids: item.sequence_ids.as_ptr(),
        };
        write_out(out, view, "out")
    })
}

/// Token `token` of encoding `index` as a view into the encoding (not NUL-terminated).
#[no_mangle]
pub unsafe extern "C" fn tt_encodings_token(
    encodings: *const TtEncodings,
    index: usize,
    token: usize,
    data: *mut *const c_char,
    len: *mut usize,
) -> *mut c_char {
    guard(|| {
        let tokens = item_at(encodings, index)?.encoding.get_tokens();
        let t = tokens.get(token).ok_or_else(|| format!("token {token} out of range ({} tokens)", tokens.len()))?;
        write_out(len, t.len(), "len")?;
        write_out(data, t.as_ptr() as *const c_char, "data")
    })
}

unsafe fn item_at<'a>(encodings: *const TtEncodings, index: usize) -> Result<&'a EncodedItem, String> {
    let e = handle(encodings, "encodings")?;
    e.items.get(index).ok_or_else(|| format!("encoding {index} out of range ({} encodings)", e.items.len()))
}

/// Decodes ids into text (ids the vocabulary lacks are skipped, as tokenizers does).
#[no_mangle]
pub unsafe extern "C" fn tt_decode(
    tokenizer: *const TtTokenizer,
    ids: *const u32,
    count: usize,
    skip_special_tokens: i32,
    out: *mut TtString,
) -> *mut c_char {
    guard(|| {
        let tokenizer = handle(tokenizer, "tokenizer")?;
        let ids: &[u32] = if count == 0 { &[] } else if ids.is_null() { return Err("ids is NULL".into()) } else { std::slice::from_raw_parts(ids, count) };
        let read = tokenizer.inner.read().unwrap_or_else(|e| e.into_inner());
        let text = read.decode(ids, skip_special_tokens != 0).map_err(|e| e.to_string())?;
        write_out(out, TtString::from(&text), "out")
    })
}

/// `*found` = 1 and `*id` set when the vocabulary (with added tokens) holds `token`, else 0.
#[no_mangle]
pub unsafe extern "C" fn tt_token_to_id(
    tokenizer: *const TtTokenizer,
    token: *const c_char,
    len: usize,
    id: *mut u32,
    found: *mut i32,
) -> *mut c_char {
    guard(|| {
        let tokenizer = handle(tokenizer, "tokenizer")?;
        let token = utf8_arg(token, len, "token")?;
        let result = tokenizer.inner.read().unwrap_or_else(|e| e.into_inner()).token_to_id(token);
        write_out(found, result.is_some() as i32, "found")?;
        write_out(id, result.unwrap_or(0), "id")
    })
}

/// The token of `id`; `out->data` is NULL when no token has that id.
#[no_mangle]
pub unsafe extern "C" fn tt_id_to_token(tokenizer: *const TtTokenizer, id: u32, out: *mut TtString) -> *mut c_char {
    guard(|| {
        let tokenizer = handle(tokenizer, "tokenizer")?;
        let token = tokenizer.inner.read().unwrap_or_else(|e| e.into_inner()).id_to_token(id);
        write_out(out, token.map_or_else(TtString::null, |t| TtString::from(&t)), "out")
    })
}

/// Vocabulary size, with or without the added tokens.
#[no_mangle]
pub unsafe extern "C" fn tt_vocab_size(tokenizer: *const TtTokenizer, with_added_tokens: i32, out: *mut usize) -> *mut c_char {
    guard(|| {
        let tokenizer = handle(tokenizer, "tokenizer")?;
        let size = tokenizer.inner.read().unwrap_or_else(|e| e.into_inner()).get_vocab_size(with_added_tokens != 0);
        write_out(out, size, "out")
    })
}

/// One added token (tokenizer.json's "added_tokens").
#[repr(C)]
pub struct TtAddedToken {
    pub id: u32,
    pub special: i32,
    pub content: TtString,
}

/// The added tokens sorted by id: `*out` holds `*count` of them, freed with `tt_added_tokens_free`.
#[no_mangle]
pub unsafe extern "C" fn tt_added_tokens(tokenizer: *const TtTokenizer, out: *mut *mut TtAddedToken, count: *mut usize) -> *mut c_char {
    guard(|| {
        let tokenizer = handle(tokenizer, "tokenizer")?;
        if out.is_null() || count.is_null() {
            return Err("out or count is NULL".into());
        }
        let decoder = tokenizer.inner.read().unwrap_or_else(|e| e.into_inner()).get_added_tokens_decoder();
        let mut sorted: Vec<_> = decoder.into_iter().collect();
        sorted.sort_by_key(|(id, _)| *id);
        let list: Box<[TtAddedToken]> = sorted
            .into_iter()
            .map(|(id, t)| TtAddedToken { id, special: t.special as i32, content: TtString::from(&t.content) })
            .collect();
        write_out(count, list.len(), "count")?;
        write_out(out, Box::into_raw(list) as *mut TtAddedToken, "out")
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_added_tokens_free(tokens: *mut TtAddedToken, count: usize) {
    if tokens.is_null() {
        return;
    }
    let list = Box::from_raw(std::ptr::slice_from_raw_parts_mut(tokens, count));
    for token in list.into_vec() {
        crate::ffi::tt_string_free(token.content);
    }
}

/// The tokens joined into text by the tokenizer's decoder (tokens joined by spaces when it has
/// none): transformers' `convert_tokens_to_string`. Token i is `data[offsets[i]..offsets[i + 1]]`
/// (`offsets` has count + 1 entries).
#[no_mangle]
pub unsafe extern "C" fn tt_tokens_to_string(
    tokenizer: *const TtTokenizer,
    data: *const c_char,
    offsets: *const usize,
    count: usize,
    out: *mut TtString,
) -> *mut c_char {
    guard(|| {
        let tokenizer = handle(tokenizer, "tokenizer")?;
        let mut tokens = Vec::with_capacity(count);
        if count > 0 {
            if offsets.is_null() {
                return Err("offsets is NULL".into());
            }
            let offsets = std::slice::from_raw_parts(offsets, count + 1);
            let all = utf8_arg(data, offsets[count], "data")?;
            for pair in offsets.windows(2) {
                let piece = all.get(pair[0]..pair[1]).ok_or("token offsets out of order or inside a character")?;
                tokens.push(piece.to_string());
            }
        }
        let read = tokenizer.inner.read().unwrap_or_else(|e| e.into_inner());
        let text = match read.get_decoder() {
            Some(decoder) => tokenizers::tokenizer::Decoder::decode(decoder, tokens).map_err(|e| e.to_string())?,
            None => tokens.join(" "),
        };
        write_out(out, TtString::from(&text), "out")
    })
}

/// The model's continuing-subword prefix ("##" for WordPiece; a BPE's when it sets one);
/// `out->data` is NULL when it has none.
#[no_mangle]
pub unsafe extern "C" fn tt_continuing_subword_prefix(tokenizer: *const TtTokenizer, out: *mut TtString) -> *mut c_char {
    guard(|| {
        let tokenizer = handle(tokenizer, "tokenizer")?;
        let read = tokenizer.inner.read().unwrap_or_else(|e| e.into_inner());
        let prefix = match read.get_model() {
            tokenizers::models::ModelWrapper::WordPiece(model) => Some(model.continuing_subword_prefix.clone()),
            tokenizers::models::ModelWrapper::BPE(model) => model.continuing_subword_prefix.clone(),
            _ => None,
        };
        write_out(out, prefix.map_or_else(TtString::null, |p| TtString::from(&p)), "out")
    })
}
