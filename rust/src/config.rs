//! The fields of a tokenizer_config.json that Transmuter honours (docs/text.md): what
//! transformers' PreTrainedTokenizerFast reads from it for encoding and decoding.

use std::ffi::{c_char, CStr};

use serde_json::Value;

use crate::ffi::{guard, write_out, TtString};

/// -1 in an int field: the file does not set it.
#[repr(C)]
pub struct TtTokenizerConfig {
    /// 0 when absent or the "no limit" sentinel transformers writes (int(1e30)).
    pub model_max_length: u64,
    /// 0 right, 1 left.
    pub padding_side: i32,
    pub truncation_side: i32,
    /// 0 or 1.
    pub clean_up_tokenization_spaces: i32,
    /// NULL data when absent (or null).
    pub pad_token: TtString,
}

fn side(value: Option<&Value>, field: &str) -> Result<i32, String> {
    match value {
        None | Some(Value::Null) => Ok(-1),
        Some(Value::String(s)) if s == "right" => Ok(0),
        Some(Value::String(s)) if s == "left" => Ok(1),
        Some(other) => Err(format!("{field} must be \"left\" or \"right\", got {other}")),
    }
}

/// A special token is written as a string or as an AddedToken object {"content": ...}.
fn token_text(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

fn max_length(value: Option<&Value>) -> u64 {
    // Anything past 2^53 is transformers' "unlimited" sentinel (stored as 1e30).
    match value.and_then(Value::as_f64) {
        Some(v) if v >= 1.0 && v < 9.0e15 => v as u64,
        _ => 0,
    }
}

fn parse(path: &str) -> Result<TtTokenizerConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let json: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: malformed JSON: {e}"))?;
    let object = json.as_object().ok_or_else(|| format!("{path}: not a JSON object"))?;
    let in_file = |e: String| format!("{path}: {e}");
    Ok(TtTokenizerConfig {
        model_max_length: max_length(object.get("model_max_length")),
        padding_side: side(object.get("padding_side"), "padding_side").map_err(in_file)?,
        truncation_side: side(object.get("truncation_side"), "truncation_side").map_err(in_file)?,
        clean_up_tokenization_spaces: object
            .get("clean_up_tokenization_spaces")
            .and_then(Value::as_bool)
            .map_or(-1, |b| b as i32),
        pad_token: token_text(object.get("pad_token")).map_or_else(TtString::null, |t| TtString::from(&t)),
    })
}

/// Reads a tokenizer_config.json; errors name the file. Free `out->pad_token` with tt_string_free.
#[no_mangle]
pub unsafe extern "C" fn tt_tokenizer_config_read(path: *const c_char, out: *mut TtTokenizerConfig) -> *mut c_char {
    guard(|| {
        if path.is_null() {
            return Err("path is NULL".into());
        }
        let path = CStr::from_ptr(path).to_string_lossy().into_owned();
        write_out(out, parse(&path)?, "out")
    })
}
