//! A JSON reader of one record line for the importer's picked parse (`picked::Lines`): serde's
//! `Deserializer` over the line's text that hands its visitors what serde_json's hands them, or
//! refuses the line, which then goes to serde_json's parse.
//!
//! serde_json looks for a string's end or next escape eight bytes at a time and starts that scan
//! again after each escape; a transcript's strings are tool results and file contents full of
//! `\n` and `\"` (one escape every ~31 bytes over the 16 shipped sessions), and its string scan
//! was the largest single cost of an import. This reader scans sixteen bytes at a time (SSE2)
//! and copies a string with escapes once into a buffer kept from line to line.
//!
//! It reads what it is sure to read as serde_json does and refuses the rest, the caller then
//! parsing the line by serde_json (so every error, and every value of an odd line, is
//! serde_json's): it refuses a line that serde_json refuses, but also a string with a `\u`
//! escape of a surrogate that is not a pair, nesting deeper than [`DEPTH`], a key that is
//! serde's raw value marker, and a visitor's refusal of what it was given. The values it gives:
//! a string borrowed from the line where it has no escape, else its text unescaped; a number of
//! at most 19 digits with no sign, fraction or exponent as a `u64`, any other number as
//! serde_json reads that number's text alone (its parse of a number does not depend on what is
//! around it); `null`, booleans, arrays and objects as serde_json visits them, and serde's raw
//! value as serde_json gives it (the value's text, borrowed). Tests compare it with serde_json
//! on valid and invalid text; debug builds compare every record it reads with serde_json's.

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Error;

/// The nesting of arrays and objects read; a deeper line is refused (serde_json's limit is 128).
const DEPTH: usize = 100;

/// The token serde_json's raw value deserializes as (a newtype of this name).
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

/// `seed`'s value of `text`, a JSON value with only whitespace around it, as serde_json's parse of
/// `text` gives it, or an error where this reader refuses it (module doc). `scratch` is the
/// buffer of strings with escapes, kept from one call to the next.
pub(crate) fn read<'de, T: DeserializeSeed<'de>>(text: &'de str, seed: T, scratch: &mut String) -> Result<T::Value, Error> {
    let mut reader = LineReader { text, at: 0, depth: DEPTH, scratch: std::mem::take(scratch) };
    let value = seed.deserialize(&mut reader);
    let end = reader.peek();
    *scratch = reader.scratch;
    let value = value?;
    match end {
        None => Ok(value),
        Some(_) => Err(refused()),
    }
}

fn refused() -> Error {
    de::Error::custom("not read by the line reader")
}

struct LineReader<'de> {
    text: &'de str,
    /// The byte read next.
    at: usize,
    /// The nesting still allowed.
    depth: usize,
    /// The text of the last string with escapes.
    scratch: String,
}

/// A string read: borrowed from the line, or its unescaped text in the reader's scratch buffer.
enum Text<'de> {
    Borrowed(&'de str),
    Scratch,
}

impl<'de> LineReader<'de> {
    /// The next byte that is not JSON whitespace (the reader left on it).
    fn peek(&mut self) -> Option<u8> {
        let bytes = self.text.as_bytes();
        while let Some(&byte) = bytes.get(self.at) {
            if !matches!(byte, b' ' | b'\n' | b'\t' | b'\r') {
                return Some(byte);
            }
            self.at += 1;
        }
        None
    }

    /// Reads the string whose opening quote is at `at`.
    fn string(&mut self) -> Result<Text<'de>, Error> {
        let bytes = self.text.as_bytes();
        let start = self.at + 1;
        let mut at = special(bytes, start);
        match bytes.get(at) {
            Some(b'"') => {
                self.at = at + 1;
                return Ok(Text::Borrowed(&self.text[start..at]));
            }
            Some(b'\\') => {}
            _ => return Err(refused()),
        }
        self.scratch.clear();
        let mut copied = start;
        loop {
            match bytes.get(at) {
                Some(b'"') => {
                    self.scratch.push_str(&self.text[copied..at]);
                    self.at = at + 1;
                    return Ok(Text::Scratch);
                }
                Some(b'\\') => {
                    self.scratch.push_str(&self.text[copied..at]);
                    at = self.escape(at)?;
                    copied = at;
                }
                _ => return Err(refused()),
            }
            at = special(bytes, at);
        }
    }

    /// Reads the escape at `at` (its backslash) into the scratch buffer; where the text goes on.
    fn escape(&mut self, at: usize) -> Result<usize, Error> {
        let bytes = self.text.as_bytes();
        let c = match bytes.get(at + 1) {
            Some(b'"') => '"',
            Some(b'\\') => '\\',
            Some(b'/') => '/',
            Some(b'b') => '\x08',
            Some(b'f') => '\x0c',
            Some(b'n') => '\n',
            Some(b'r') => '\r',
            Some(b't') => '\t',
            Some(b'u') => {
                let unit = hex4(bytes, at + 2).ok_or_else(refused)?;
                let (c, len) = match unit {
                    0xD800..=0xDBFF => {
                        let low = match bytes.get(at + 6..at + 8) {
                            Some(b"\\u") => hex4(bytes, at + 8).ok_or_else(refused)?,
                            _ => return Err(refused()),
                        };
                        if !(0xDC00..=0xDFFF).contains(&low) {
                            return Err(refused());
                        }
                        (0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00), 12)
                    }
                    _ => (unit, 6),
                };
                // (`None` for a lone low surrogate.)
                self.scratch.push(char::from_u32(c).ok_or_else(refused)?);
                return Ok(at + len);
            }
            _ => return Err(refused()),
        };
        self.scratch.push(c);
        Ok(at + 2)
    }

    /// Visits the number at `at`.
    fn number<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value, Error> {
        let bytes = self.text.as_bytes();
        let start = self.at;
        let digits = bytes[start..].iter().take_while(|byte| byte.is_ascii_digit()).count();
        let end = start + digits + bytes[start + digits..].iter().take_while(|byte| matches!(byte, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E')).count();
        self.at = end;
        if end == start + digits && (1..=19).contains(&digits) && (bytes[start] != b'0' || digits == 1) {
            let value = bytes[start..end].iter().fold(0u64, |value, digit| value * 10 + u64::from(digit - b'0'));
            return visitor.visit_u64(value);
        }
        let mut alone = serde_json::Deserializer::from_str(&self.text[start..end]);
        let value = alone.deserialize_any(visitor).map_err(|_| refused())?;
        alone.end().map_err(|_| refused())?;
        Ok(value)
    }

    /// Checks that the literal `word` is at `at` and steps over it.
    fn literal(&mut self, word: &[u8]) -> Result<(), Error> {
        if self.text.as_bytes().get(self.at..self.at + word.len()) != Some(word) {
            return Err(refused());
        }
        self.at += word.len();
        Ok(())
    }

    /// Steps into an array or object (at its opening bracket).
    fn enter(&mut self) -> Result<(), Error> {
        self.depth -= 1;
        if self.depth == 0 {
            return Err(refused());
        }
        self.at += 1;
        Ok(())
    }

    /// Steps out of an array or object whose entries the visitor read all: `close` is next.
    fn leave(&mut self, close: u8) -> Result<(), Error> {
        self.depth += 1;
        if self.peek() != Some(close) {
            return Err(refused());
        }
        self.at += 1;
        Ok(())
    }

    /// Steps over the separator before an entry of an array or object closed by `close`:
    /// whether there is one.
    fn next_entry(&mut self, first: &mut bool, close: u8) -> Result<bool, Error> {
        let mut next = self.peek();
        if next == Some(close) {
            return Ok(false);
        }
        if !std::mem::take(first) {
            if next != Some(b',') {
                return Err(refused());
            }
            self.at += 1;
            next = self.peek();
            if next == Some(close) {
                return Err(refused());
            }
        }
        Ok(next.is_some())
    }
}

/// Where the first `"`, `\` or control character at or after `from` is in `bytes` (their length
/// where none is).
fn special(bytes: &[u8], from: usize) -> usize {
    // SAFETY: every x86_64 processor has SSE2.
    #[cfg(target_arch = "x86_64")]
    let found = unsafe { special_sse2(bytes, from) };
    #[cfg(not(target_arch = "x86_64"))]
    let found = special_by_bytes(bytes, from);
    debug_assert_eq!(found, special_by_bytes(bytes, from), "the scan of {bytes:?} from {from}");
    found
}

fn special_by_bytes(bytes: &[u8], from: usize) -> usize {
    from + bytes[from..].iter().position(|&byte| byte == b'"' || byte == b'\\' || byte < 0x20).unwrap_or(bytes.len() - from)
}

/// [`special`] sixteen bytes at a time by SSE2 (every x86_64 processor has it), the last
/// fewer than sixteen byte by byte.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn special_sse2(bytes: &[u8], from: usize) -> usize {
    use std::arch::x86_64::{_mm_cmpeq_epi8, _mm_loadu_si128, _mm_max_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8};
    // `_mm_set1_epi8` takes the byte's bits as an `i8`.
    let (quote, backslash, control) = (_mm_set1_epi8(b'"' as i8), _mm_set1_epi8(b'\\' as i8), _mm_set1_epi8(0x1f));
    let mut at = from;
    while let Some(chunk) = bytes.get(at..at + 16) {
        // SAFETY: `chunk` is 16 bytes to read, the 128 bits of an unaligned load.
        let chunk = unsafe { _mm_loadu_si128(chunk.as_ptr().cast()) };
        // A control character is a byte whose unsigned maximum with 0x1f is 0x1f.
        let marks = _mm_or_si128(_mm_or_si128(_mm_cmpeq_epi8(chunk, quote), _mm_cmpeq_epi8(chunk, backslash)), _mm_cmpeq_epi8(_mm_max_epu8(chunk, control), control));
        let marks = _mm_movemask_epi8(marks) as u32;
        if marks != 0 {
            return at + marks.trailing_zeros() as usize;
        }
        at += 16;
    }
    special_by_bytes(bytes, at)
}

/// The four hex digits at `at`, as serde_json reads a `\u` escape's.
fn hex4(bytes: &[u8], at: usize) -> Option<u32> {
    bytes.get(at..at + 4)?.iter().try_fold(0u32, |value, &digit| Some(value * 16 + char::from(digit).to_digit(16)?))
}

impl<'de> Deserializer<'de> for &mut LineReader<'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.peek() {
            Some(b'"') => match self.string()? {
                Text::Borrowed(text) => visitor.visit_borrowed_str(text),
                Text::Scratch => visitor.visit_str(&self.scratch),
            },
            Some(b'{') => {
                self.enter()?;
                let value = visitor.visit_map(Entries { reader: self, first: true })?;
                self.leave(b'}')?;
                Ok(value)
            }
            Some(b'[') => {
                self.enter()?;
                let value = visitor.visit_seq(Entries { reader: self, first: true })?;
                self.leave(b']')?;
                Ok(value)
            }
            Some(b'n') => {
                self.literal(b"null")?;
                visitor.visit_unit()
            }
            Some(b't') => {
                self.literal(b"true")?;
                visitor.visit_bool(true)
            }
            Some(b'f') => {
                self.literal(b"false")?;
                visitor.visit_bool(false)
            }
            Some(b'-' | b'0'..=b'9') => self.number(visitor),
            _ => Err(refused()),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self.peek() {
            Some(b'n') => {
                self.literal(b"null")?;
                visitor.visit_none()
            }
            _ => visitor.visit_some(self),
        }
    }

    /// serde_json's raw value (the value's text, borrowed), as serde_json hands it to the
    /// visitor: a map of the token and the text. Any other newtype as serde_json reads it.
    fn deserialize_newtype_struct<V: Visitor<'de>>(self, name: &'static str, visitor: V) -> Result<V::Value, Error> {
        if name != RAW_VALUE_TOKEN {
            return visitor.visit_newtype_struct(self);
        }
        self.peek();
        let start = self.at;
        <de::IgnoredAny as de::Deserialize>::deserialize(&mut *self)?;
        let raw = &self.text[start..self.at];
        visitor.visit_map(RawValue { raw: Some(raw) })
    }

    fn deserialize_enum<V: Visitor<'de>>(self, _: &'static str, _: &'static [&'static str], _: V) -> Result<V::Value, Error> {
        Err(refused())
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(refused())
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Error> {
        Err(refused())
    }

    // (serde_json reads these as `deserialize_any` reads the values they take; a value of
    // another kind a typed visitor refuses.)
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        unit unit_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

/// The entries of an array or object being read.
struct Entries<'r, 'de> {
    reader: &'r mut LineReader<'de>,
    first: bool,
}

impl<'de> SeqAccess<'de> for Entries<'_, 'de> {
    type Error = Error;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>, Error> {
        if !self.reader.next_entry(&mut self.first, b']')? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.reader).map(Some)
    }
}

impl<'de> MapAccess<'de> for Entries<'_, 'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        if !self.reader.next_entry(&mut self.first, b'}')? {
            return Ok(None);
        }
        if self.reader.peek() != Some(b'"') {
            return Err(refused());
        }
        let key = match self.reader.string()? {
            Text::Borrowed(text) => seed.deserialize(Key::Borrowed(text)),
            Text::Scratch if self.reader.scratch == RAW_VALUE_TOKEN => Err(refused()),
            Text::Scratch => seed.deserialize(Key::Copied(&self.reader.scratch)),
        };
        key.map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        if self.reader.peek() != Some(b':') {
            return Err(refused());
        }
        self.reader.at += 1;
        seed.deserialize(&mut *self.reader)
    }
}

/// An object's key, as serde_json hands it to a visitor: borrowed where it has no escape.
enum Key<'a, 'de> {
    Borrowed(&'de str),
    Copied(&'a str),
}

impl<'de> Deserializer<'de> for Key<'_, 'de> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        match self {
            Key::Borrowed(RAW_VALUE_TOKEN) => Err(refused()),
            Key::Borrowed(text) => visitor.visit_borrowed_str(text),
            Key::Copied(text) => visitor.visit_str(text),
        }
    }

    // (Keys are read as strings: serde_json reads a key as a number, an option or an enum
    // otherwise, which the importer's visitors never ask for; those refuse it.)
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

/// serde_json's raw value: a map of its token to the value's text.
struct RawValue<'de> {
    raw: Option<&'de str>,
}

impl<'de> MapAccess<'de> for RawValue<'de> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>, Error> {
        if self.raw.is_none() {
            return Ok(None);
        }
        seed.deserialize(de::value::BorrowedStrDeserializer::new(RAW_VALUE_TOKEN)).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        seed.deserialize(de::value::BorrowedStrDeserializer::new(self.raw.take().ok_or_else(refused)?))
    }
}
