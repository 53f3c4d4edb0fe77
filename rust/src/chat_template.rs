//! Chat templates: minijinja configured as transformers renders `apply_chat_template`
//! (transformers/utils/chat_template_utils.py, `_compile_jinja_template`): an immutable sandbox
//! with `trim_blocks` and `lstrip_blocks`, the loop-controls extension, the globals
//! `raise_exception` and `strftime_now`, and a `tojson` filter that is Python's
//! `json.dumps(ensure_ascii=False, ...)`. Python's str/dict/list methods (`.strip()`, `.items()`,
//! `.startswith()`, ...) come from minijinja-contrib's pycompat.

use std::cell::RefCell;
use std::ffi::{c_char, CStr};
use std::fmt::Write as _;

use minijinja::value::{Kwargs, Value};
use minijinja::{Environment, Error, ErrorKind};
use serde_json::{Map, Value as Json};

use crate::ffi::{guard, handle, utf8_arg, write_out, TtString};

const TEMPLATE_NAME: &str = "chat_template";

/// A compiled chat template: the environment owns the template source.
pub struct TtChatTemplate {
    env: Environment<'static>,
}

thread_local! {
    /// The message of the last `raise_exception` on this thread: it becomes the render error as
    /// is, without minijinja's "invalid operation: ... (in chat_template:N)" around it.
    static RAISED: RefCell<Option<String>> = const { RefCell::new(None) };
}

fn raise_exception(message: String) -> Result<Value, Error> {
    RAISED.with(|r| *r.borrow_mut() = Some(message.clone()));
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// transformers' `strftime_now`: the local time formatted with a strftime format.
fn strftime_now(format: String) -> Result<Value, Error> {
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format))
        .map_err(|_| Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {format:?}")))?;
    Ok(Value::from(out))
}

/// How Python's json.dumps lays out containers.
struct JsonStyle {
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
    ensure_ascii: bool,
}

/// Python's `repr(float)` (what json.dumps writes): the shortest round-trip digits, in exponent
/// form when the exponent is < -4 or >= 16, else positional with at least one decimal.
fn python_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity".into() } else { "-Infinity".into() };
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0.0".into() } else { "0.0".into() };
    }
    let sci = format!("{v:e}"); // e.g. "-1.2345e-7": shortest round-trip digits
    let (mantissa, exponent) = sci.split_once('e').expect("{:e} has an exponent");
    let exponent: i32 = exponent.parse().expect("{:e} exponent is an integer");
    let (sign, mantissa) = mantissa.strip_prefix('-').map_or(("", mantissa), |m| ("-", m));
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if !(-4..16).contains(&exponent) {
        let m = if digits.len() > 1 { format!("{}.{}", &digits[..1], &digits[1..]) } else { digits };
        return format!("{sign}{m}e{}{:02}", if exponent < 0 { '-' } else { '+' }, exponent.abs());
    }
    let point = exponent + 1; // digits before the decimal point
    if point <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
    } else if (point as usize) >= digits.len() {
        format!("{sign}{digits}{}.0", "0".repeat(point as usize - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..point as usize], &digits[point as usize..])
    }
}

fn write_json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => write!(out, "\\u{:04x}", c as u32).unwrap(),
            c if ensure_ascii && (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    write!(out, "\\u{unit:04x}").unwrap();
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn write_json(out: &mut String, value: &Json, style: &JsonStyle, depth: usize) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(indent) = &style.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    };
    match value {
        Json::Null => out.push_str("null"),
        Json::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Json::Number(n) => match (n.as_i64(), n.as_u64()) {
            (Some(i), _) => write!(out, "{i}").unwrap(),
            (_, Some(u)) => write!(out, "{u}").unwrap(),
            _ => out.push_str(&python_float(n.as_f64().unwrap_or(f64::NAN))),
        },
        Json::String(s) => write_json_string(out, s, style.ensure_ascii),
        Json::Array(items) if items.is_empty() => out.push_str("[]"),
        Json::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(out, depth + 1);
                write_json(out, item, style, depth + 1);
            }
            newline(out, depth);
            out.push(']');
        }
        Json::Object(map) if map.is_empty() => out.push_str("{}"),
        Json::Object(map) => {
            let mut entries: Vec<(&String, &Json)> = map.iter().collect();
            if style.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0)); // UTF-8 byte order is code point order
            }
            out.push('{');
            for (i, (key, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(&style.item_separator);
                }
                newline(out, depth + 1);
                write_json_string(out, key, style.ensure_ascii);
                out.push_str(&style.key_separator);
                write_json(out, item, style, depth + 1);
            }
            newline(out, depth);
            out.push('}');
        }
    }
}

fn kwarg_error(what: &str, got: &Value) -> Error {
    Error::new(ErrorKind::InvalidOperation, format!("tojson: {what}, got {got}"))
}

/// transformers' `tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)`:
/// `json.dumps` with these arguments (no HTML escaping, unlike minijinja's own tojson).
fn tojson(value: Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => {
            if let Some(s) = v.as_str() {
                Some(s.to_string())
            } else if let Ok(n) = i64::try_from(v.clone()) {
                Some(" ".repeat(n.max(0) as usize))
            } else {
                return Err(kwarg_error("indent must be an int or a string", &v));
            }
        }
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Value>>("separators")? {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter().map_err(|_| kwarg_error("separators must be a pair", &v))?.collect();
            match parts.as_slice() {
                [a, b] if a.as_str().is_some() && b.as_str().is_some() => {
                    (a.as_str().unwrap().to_string(), b.as_str().unwrap().to_string())
                }
                _ => return Err(kwarg_error("separators must be a pair of strings", &v)),
            }
        }
        // json.dumps: (", ", ": ") without indent, (",", ": ") with one.
        _ => (if indent.is_some() { "," } else { ", " }.to_string(), ": ".to_string()),
    };
    kwargs.assert_all_used()?;
    let json = serde_json::to_value(&value)
        .map_err(|e| Error::new(ErrorKind::InvalidOperation, format!("tojson: not serializable: {e}")))?;
    let style = JsonStyle { indent, item_separator, key_separator, sort_keys, ensure_ascii };
    let mut out = String::new();
    write_json(&mut out, &json, &style, 0);
    Ok(Value::from(out))
}

/// "line N: message" for errors that know their line (syntax errors always do).
fn describe(error: &Error) -> String {
    let what = match error.detail() {
        Some(detail) => format!("{}: {detail}", error.kind()),
        None => error.kind().to_string(),
    };
    match error.line() {
        Some(line) => format!("chat template line {line}: {what}"),
        None => format!("chat template: {what}"),
    }
}

fn environment(source: String) -> Result<Environment<'static>, String> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_keep_trailing_newline(false); // Jinja2's default, as transformers leaves it
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_filter("tojson", tojson);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_template_owned(TEMPLATE_NAME, source).map_err(|e| describe(&e))?;
    Ok(env)
}

/// `len` bytes of JSON at `data` (nothing when `data` is NULL).
unsafe fn json_arg(data: *const c_char, len: usize, what: &str) -> Result<Option<Json>, String> {
    if data.is_null() {
        return Ok(None);
    }
    let text = utf8_arg(data, len, what)?;
    serde_json::from_str(text).map(Some).map_err(|e| format!("{what} is not valid JSON: {e}"))
}

unsafe fn json_object_arg(data: *const c_char, len: usize, what: &str) -> Result<Map<String, Json>, String> {
    match json_arg(data, len, what)? {
        None => Ok(Map::new()),
        Some(Json::Object(map)) => Ok(map),
        Some(_) => Err(format!("{what} must be a JSON object")),
    }
}

/// The variables of one rendering; every string is JSON text (pointer + length, NULL: absent).
#[repr(C)]
pub struct TtChatContext {
    /// An array of messages.
    pub messages: *const c_char,
    pub messages_len: usize,
    /// An array of tool definitions; NULL: `tools` is none, as transformers passes it.
    pub tools: *const c_char,
    pub tools_len: usize,
    /// An array of documents; NULL: `documents` is none.
    pub documents: *const c_char,
    pub documents_len: usize,
    pub add_generation_prompt: i32,
    /// An object of special tokens (bos_token, eos_token, ...), set first.
    pub special_tokens: *const c_char,
    pub special_tokens_len: usize,
    /// An object of further variables, set last (they override everything above).
    pub extra: *const c_char,
    pub extra_len: usize,
}

unsafe fn context_of(c: &TtChatContext) -> Result<Json, String> {
    let mut context = json_object_arg(c.special_tokens, c.special_tokens_len, "special_tokens")?;
    let messages = json_arg(c.messages, c.messages_len, "messages")?.unwrap_or(Json::Array(vec![]));
    if !messages.is_array() {
        return Err("messages must be a JSON array".into());
    }
    context.insert("messages".into(), messages);
    context.insert("tools".into(), json_arg(c.tools, c.tools_len, "tools")?.unwrap_or(Json::Null));
    context.insert("documents".into(), json_arg(c.documents, c.documents_len, "documents")?.unwrap_or(Json::Null));
    context.insert("add_generation_prompt".into(), Json::Bool(c.add_generation_prompt != 0));
    for (key, value) in json_object_arg(c.extra, c.extra_len, "extra context")? {
        context.insert(key, value);
    }
    Ok(Json::Object(context))
}

/// Compiles a chat template; a syntax error names its line ("chat template line N: ...").
#[no_mangle]
pub unsafe extern "C" fn tt_chat_template_new(
    source: *const c_char,
    len: usize,
    out: *mut *mut TtChatTemplate,
) -> *mut c_char {
    guard(|| {
        let source = utf8_arg(source, len, "source")?.to_string();
        let template = TtChatTemplate { env: environment(source)? };
        write_out(out, Box::into_raw(Box::new(template)), "out")
    })
}

#[no_mangle]
pub unsafe extern "C" fn tt_chat_template_free(template: *mut TtChatTemplate) {
    if !template.is_null() {
        drop(Box::from_raw(template));
    }
}

/// Renders with the given variables. A `raise_exception(message)` in the template makes the
/// error exactly `message`.
#[no_mangle]
pub unsafe extern "C" fn tt_chat_template_render(
    template: *const TtChatTemplate,
    context: *const TtChatContext,
    out: *mut TtString,
) -> *mut c_char {
    guard(|| {
        let template = handle(template, "template")?;
        let context = context_of(handle(context, "context")?)?;
        let compiled = template.env.get_template(TEMPLATE_NAME).map_err(|e| describe(&e))?;
        RAISED.with(|r| r.borrow_mut().take());
        let rendered = compiled.render(Value::from_serialize(&context)).map_err(|e| {
            RAISED.with(|r| r.borrow_mut().take()).unwrap_or_else(|| describe(&e))
        })?;
        write_out(out, TtString::from(&rendered), "out")
    })
}

/// A special token of tokenizer_config.json: a string or an AddedToken object {"content": ...}.
fn token_text(value: &Json) -> Option<Json> {
    match value {
        Json::String(s) => Some(Json::String(s.clone())),
        Json::Object(o) => o.get("content").filter(|c| c.is_string()).cloned(),
        _ => None,
    }
}

fn read_config(path: &str, name: &str) -> Result<(Option<String>, String), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let json: Json = serde_json::from_str(&text).map_err(|e| format!("{path}: malformed JSON: {e}"))?;
    let object = json.as_object().ok_or_else(|| format!("{path}: not a JSON object"))?;
    // transformers' special_tokens_map: the named special tokens that are set.
    let mut special = Map::new();
    for key in ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"] {
        if let Some(token) = object.get(key).and_then(token_text) {
            special.insert(key.to_string(), token);
        }
    }
    if let Some(Json::Array(tokens)) = object.get("additional_special_tokens") {
        special.insert(
            "additional_special_tokens".into(),
            Json::Array(tokens.iter().filter_map(token_text).collect()),
        );
    }
    let wanted = if name.is_empty() { "default" } else { name };
    let template = match object.get("chat_template") {
        None | Some(Json::Null) => None,
        Some(Json::String(s)) if name.is_empty() || name == "default" => Some(s.clone()),
        Some(Json::String(_)) => return Err(format!("{path}: no chat template named {wanted:?} (there is one string)")),
        Some(Json::Array(list)) => {
            let mut names = Vec::new();
            let mut found = None;
            for entry in list {
                let entry_name = entry.get("name").and_then(Json::as_str).unwrap_or("");
                names.push(entry_name.to_string());
                if entry_name == wanted {
                    found = entry.get("template").and_then(Json::as_str).map(str::to_string);
                }
            }
            match found {
                Some(t) => Some(t),
                None => return Err(format!("{path}: no chat template named {wanted:?} (there are {names:?})")),
            }
        }
        Some(other) => return Err(format!("{path}: chat_template must be a string or a list, got {other}")),
    };
    Ok((template, serde_json::to_string(&Json::Object(special)).expect("a JSON map serializes")))
}

/// Reads a tokenizer_config.json: its chat template (`name` empty: the string, or the entry
/// "default" of a list; data NULL when the file has none) and its special tokens as a JSON object.
#[no_mangle]
pub unsafe extern "C" fn tt_chat_template_config_read(
    path: *const c_char,
    name: *const c_char,
    name_len: usize,
    chat_template: *mut TtString,
    special_tokens: *mut TtString,
) -> *mut c_char {
    guard(|| {
        if path.is_null() {
            return Err("path is NULL".into());
        }
        let path = CStr::from_ptr(path).to_string_lossy().into_owned();
        let name = utf8_arg(name, name_len, "name")?;
        let (template, special) = read_config(&path, name)?;
        if chat_template.is_null() || special_tokens.is_null() {
            return Err("out is NULL".into());
        }
        write_out(chat_template, template.map_or_else(TtString::null, |t| TtString::from(&t)), "chat_template")?;
        write_out(special_tokens, TtString::from(&special), "special_tokens")
    })
}

#[cfg(test)]
mod tests {
    use super::python_float;

    #[test]
    fn floats_print_as_python_repr() {
        for (v, s) in [(1.0, "1.0"), (0.5, "0.5"), (1e16, "1e+16"), (1e-5, "1e-05"), (123.456, "123.456"),
                       (0.0001, "0.0001"), (-2.5e-7, "-2.5e-07"), (1234567890123456.0, "1234567890123456.0")] {
            assert_eq!(python_float(v), s);
        }
    }
}
