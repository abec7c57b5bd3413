//! What every reader of a whole-document input (YAML, TOML, JSON, CSV) checks before parsing,
//! and how parse messages quote the input.
//!
//! - A file that cannot be read, is empty or holds only whitespace is an error naming it: no
//!   reader ever treats it as "nothing to do".
//! - A UTF-8 byte-order mark at the very start is dropped (editors on Windows write one); it is
//!   not part of the document.
//! - Invalid UTF-8 is an error naming the line and the byte column of the first bad byte.
//! - A parser's message never quotes more than [`EXCERPT_CHARS`] characters of the input, so a
//!   huge line (a minified 200 MB document) cannot flood the terminal or a CI log.
//!
//! Line-oriented readers (JSONL) share the same rules per line: `recording::format::RawLines`
//! drops the byte-order mark of line 1 and `parse_line` names the byte column of invalid UTF-8.

use std::path::Path;

/// The UTF-8 byte-order mark.
pub const BOM: &[u8] = b"\xEF\xBB\xBF";

/// At most this many characters of an input line are quoted in a message.
pub const EXCERPT_CHARS: usize = 120;

/// Why a file could not be taken as text.
#[derive(Debug, thiserror::Error)]
pub enum TextError {
    #[error("failed to read {file}: {source}")]
    Read { file: String, source: std::io::Error },
    #[error("{file}: the file is empty")]
    Empty { file: String },
    #[error("{file}:{line}:{column}: invalid UTF-8 (byte 0x{byte:02x} at byte column {column} of line {line})")]
    Utf8 { file: String, line: usize, column: usize, byte: u8 },
}

/// Reads `path` as text ([`decode`]).
pub fn read_text(path: &Path) -> Result<String, TextError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| TextError::Read { file: file.clone(), source })?;
    decode(&bytes, &file).map(str::to_owned)
}

/// The bytes of a file as text: without a leading byte-order mark, valid UTF-8 and not blank.
pub fn decode<'a>(bytes: &'a [u8], file: &str) -> Result<&'a str, TextError> {
    let bytes = bytes.strip_prefix(BOM).unwrap_or(bytes);
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let (line, column) = position(bytes, e.valid_up_to());
        TextError::Utf8 { file: file.to_owned(), line, column, byte: bytes[e.valid_up_to()] }
    })?;
    if text.trim().is_empty() {
        return Err(TextError::Empty { file: file.to_owned() });
    }
    Ok(text)
}

/// 1-based line and byte column of byte `offset` of `bytes`.
pub fn position(bytes: &[u8], offset: usize) -> (usize, usize) {
    let before = &bytes[..offset.min(bytes.len())];
    let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
    let column = offset - before.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1) + 1;
    (line, column)
}

/// The byte column (1-based) of the first invalid UTF-8 byte of one line, if any.
pub fn invalid_utf8_column(line: &[u8]) -> Option<usize> {
    std::str::from_utf8(line).err().map(|e| e.valid_up_to() + 1)
}

/// A JSON path of a parse error (`scenarios.<name>.requests`) as a message shows it: a path
/// holds the input's map keys, and a key can be as long as the input, so it is cut like a
/// quote ([`excerpt`]).
pub fn json_path(path: &serde_path_to_error::Path) -> String {
    excerpt(&path.to_string())
}

/// `text` cut to [`EXCERPT_CHARS`] characters, with `…` and the length when it was cut.
pub fn excerpt(text: &str) -> String {
    let mut chars = text.char_indices();
    match chars.nth(EXCERPT_CHARS) {
        None => text.to_owned(),
        Some((cut, _)) => format!("{}… ({} bytes in all)", &text[..cut], text.len()),
    }
}

/// A TOML parse error as `line L, column C: message`, never quoting the input (toml's own
/// Display prints the whole offending line, however long).
pub fn toml_message(error: &toml::de::Error, text: &str) -> String {
    let message = cap_message(error.message().trim_end());
    match error.span() {
        Some(span) => {
            let (line, column) = position(text.as_bytes(), span.start);
            let line_text = text.lines().nth(line - 1).unwrap_or("");
            format!("line {line}, column {column}: {message} (in `{}`)", excerpt(line_text.trim()))
        }
        None => message,
    }
}

/// A parser's message with any quoted input cut: serde's messages quote a bad value or key
/// whole (`invalid type: string "…", expected u64 at line 1 column 9`), and one can be huge.
/// Every quoted run (between `"` or backticks) longer than [`EXCERPT_CHARS`] is cut; what the
/// parser says itself (an `expected one of` list, the position) is kept, up to a total of
/// [`MAX_MESSAGE_CHARS`] characters, beyond which the middle goes.
pub fn cap_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len().min(4 * MAX_MESSAGE_CHARS));
    let mut quoted = String::new();
    let mut open: Option<char> = None;
    let flush = |out: &mut String, quoted: &mut String| {
        out.push_str(&excerpt(quoted));
        quoted.clear();
    };
    for c in message.chars() {
        match open {
            Some(q) if c == q => {
                flush(&mut out, &mut quoted);
                out.push(c);
                open = None;
            }
            Some(_) => quoted.push(c),
            None => {
                out.push(c);
                if c == '"' || c == '`' {
                    open = Some(c);
                }
            }
        }
    }
    flush(&mut out, &mut quoted);
    let chars = out.chars().count();
    if chars <= MAX_MESSAGE_CHARS {
        return out;
    }
    const TAIL: usize = 120;
    let head: String = out.chars().take(MAX_MESSAGE_CHARS - TAIL).collect();
    let tail: String = out.chars().skip(chars - TAIL).collect();
    format!("{head}… ({} bytes cut) …{tail}", out.len() - head.len() - tail.len())
}

/// The longest message [`cap_message`] lets through, in characters.
pub const MAX_MESSAGE_CHARS: usize = 800;

/// An `f64` read from JSON exactly: the number's own text parsed by `str::parse` (correctly
/// rounded), where serde_json's default parser may land one unit in the last place off for
/// 17-digit numbers. For values written by serde_json and read back (the audit result cache,
/// `replay::audit_cache`), so a value read equals the value written; `null` (how serde_json
/// writes a NaN or an infinity) reads as NaN. Needs a borrowing serde_json deserializer.
pub fn exact_f64<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
    let raw: &serde_json::value::RawValue = serde::Deserialize::deserialize(deserializer)?;
    match raw.get() {
        "null" => Ok(f64::NAN),
        text => text.parse::<f64>().map_err(|e| serde::de::Error::custom(format!("number {}: {e}", excerpt(text)))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bom_is_dropped_and_bad_utf8_is_located() {
        assert_eq!(decode(b"\xEF\xBB\xBFa = 1\n", "f").unwrap(), "a = 1\n");
        let e = decode(b"a\nbc\xFFd\n", "f").unwrap_err().to_string();
        assert_eq!(e, "f:2:3: invalid UTF-8 (byte 0xff at byte column 3 of line 2)");
        assert!(matches!(decode(b" \n\t", "f"), Err(TextError::Empty { .. })));
        assert!(matches!(decode(b"\xEF\xBB\xBF", "f"), Err(TextError::Empty { .. })));
    }

    #[test]
    fn excerpts_are_capped() {
        let long = "x".repeat(10_000);
        let cut = excerpt(&long);
        assert!(cut.len() < 200, "{cut}");
        assert!(cut.ends_with("(10000 bytes in all)"));
        assert_eq!(excerpt("short"), "short");
        let message = format!("invalid type: string \"{long}\", expected u64 at line 1 column 10009");
        let capped = cap_message(&message);
        assert!(capped.len() < 250 && capped.ends_with("\", expected u64 at line 1 column 10009"), "{capped}");
        let list = "unknown field `usr`, expected one of `user`, `assistant`, `tool_output`, `wait`, `write_file`, `remove_file`, `mcp_connect`";
        assert_eq!(cap_message(list), list);
    }
}
