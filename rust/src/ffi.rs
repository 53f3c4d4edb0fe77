//! The pieces every exported function shares: error strings, owned strings, the panic guard.

use std::any::Any;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::null_mut;

/// Bytes owned by Rust, handed to C: `data[len]` is a NUL (not counted), so C can also read it as
/// a C string when it holds no NUL itself. `data` is NULL for "no string".
#[repr(C)]
pub struct TtString {
    pub data: *mut c_char,
    pub len: usize,
}

impl TtString {
    pub fn null() -> TtString {
        TtString { data: null_mut(), len: 0 }
    }

    pub fn from(text: &str) -> TtString {
        let mut bytes = Vec::with_capacity(text.len() + 1);
        bytes.extend_from_slice(text.as_bytes());
        bytes.push(0);
        let len = text.len();
        let data = Box::into_raw(bytes.into_boxed_slice()) as *mut c_char;
        TtString { data, len }
    }
}

/// Frees a string from this library (a NULL one is ignored).
#[no_mangle]
pub extern "C" fn tt_string_free(s: TtString) {
    if s.data.is_null() {
        return;
    }
    // SAFETY: `data` came from `TtString::from`: a boxed slice of `len + 1` bytes.
    unsafe {
        let slice = std::ptr::slice_from_raw_parts_mut(s.data as *mut u8, s.len + 1);
        drop(Box::from_raw(slice));
    }
}

/// Frees an error message returned by any `tt_*` function (NULL is ignored).
#[no_mangle]
pub extern "C" fn tt_error_free(error: *mut c_char) {
    if !error.is_null() {
        // SAFETY: every error comes from `error_string` (CString::into_raw).
        unsafe { drop(CString::from_raw(error)) };
    }
}

pub fn error_string(message: &str) -> *mut c_char {
    let clean: Vec<u8> = message.bytes().filter(|&b| b != 0).collect();
    CString::new(clean).expect("NUL bytes were removed").into_raw()
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_string()
    }
}

/// Runs one exported function's body: Ok -> NULL, Err -> its message, a panic -> "panic in
/// tokenizers: ...". Bodies only write their out-parameters once they cannot fail any more.
pub fn guard<F: FnOnce() -> Result<(), String>>(body: F) -> *mut c_char {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => null_mut(),
        Ok(Err(message)) => error_string(&message),
        Err(payload) => error_string(&format!("panic in tokenizers: {}", panic_message(&*payload))),
    }
}

/// `len` bytes at `data` as UTF-8; `what` names the argument in the error.
///
/// # Safety
/// `data` must point at `len` readable bytes (or be anything when `len` is 0).
pub unsafe fn utf8_arg<'a>(data: *const c_char, len: usize, what: &str) -> Result<&'a str, String> {
    if len == 0 {
        return Ok("");
    }
    if data.is_null() {
        return Err(format!("{what} is NULL"));
    }
    let bytes = std::slice::from_raw_parts(data as *const u8, len);
    std::str::from_utf8(bytes).map_err(|e| format!("{what} is not valid UTF-8: {e}"))
}

/// Dereferences a handle argument, or says which one is NULL.
///
/// # Safety
/// `ptr` must be NULL or a live handle of this type.
pub unsafe fn handle<'a, T>(ptr: *const T, what: &str) -> Result<&'a T, String> {
    ptr.as_ref().ok_or_else(|| format!("{what} is NULL"))
}

/// Writes an out-parameter, or says which one is NULL.
///
/// # Safety
/// `ptr` must be NULL or writable.
pub unsafe fn write_out<T>(ptr: *mut T, value: T, what: &str) -> Result<(), String> {
    if ptr.is_null() {
        return Err(format!("{what} is NULL"));
    }
    ptr.write(value);
    Ok(())
}
