//! Information loss of each compaction of a real session, as recorded or in a what-if through
//! the agent (where it compacts and the recording did not, or kept where the recording had one):
//!
//! - **tokens dropped**: the main lane's context before the compaction (the previous main
//!   call's simulated context) less the first call after it;
//! - **references lost**: file paths and identifiers that later recorded turns use (the string
//!   inputs of the model's tool calls and the user's prompts, up to the next compaction) and that
//!   were in the conversation before the compaction but are in neither the summary (recorded,
//!   or the stand-in of a what-if) nor the files the client restores — what the model would
//!   have to find again;
//! - **re-reads**: later recorded `Read` calls (up to the next compaction) of a file a `Read`
//!   before the compaction had shown.
//!
//! A reference is a token of `[A-Za-z0-9_./-]` characters: a path when it holds a `/` and a
//! letter, an identifier when it is at least 5 characters, starts with a letter or `_` and is
//! `snake_case` or `camelCase` (holds a `_` or a lower-to-upper change). Later recorded turns
//! are the ones the recording holds, whatever the strategy: the same work is assumed to happen.

use std::borrow::Cow;
use std::collections::BTreeSet;
use std::sync::{Arc, OnceLock, RwLock};

use serde::Serialize;
use serde_json::Value;

use crate::api::{ContentBlock, Message, MessageContent, SharedText, ToolResultContent};
use crate::recording::format::LANE_MAIN;
use crate::recording::claude_code::{ATTACHMENTS_NOT_SENT, attachment_text};
use crate::recording::{EventKind, ImportedSession, UserPrompt};

/// References of a lost list shown by name (the rest are counted).
pub const SHOWN_REFERENCES: usize = 5;

/// The information loss of one compaction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CompactionLoss {
    /// Index of the first call after the compaction (the session's call list).
    pub call: usize,
    pub tokens_dropped: u64,
    /// Distinct references in the conversation before and not after.
    pub references_dropped: usize,
    /// Of those, the ones later recorded turns use.
    pub references_lost: usize,
    /// The first [`SHOWN_REFERENCES`] lost, sorted.
    pub lost: Vec<String>,
    pub rereads: usize,
}

/// Adds the references of `text` to `out`.
pub fn references(text: &str, out: &mut BTreeSet<String>) {
    each_reference(text, &mut |r| {
        out.insert(r.into_owned());
    });
}

/// Calls `f` with each reference of `text` (in order, repeats included), borrowed from it but
/// for a Windows path.
///
/// One pass over the bytes: the token characters are ASCII, and every byte of a multi-byte
/// character is at least 0x80, so splitting the bytes splits the text where its characters
/// split it, and every token is a slice at character boundaries. A token that opens with a
/// drive (`D:\omp\src\a.go`, `d:/omp/a.go`) runs on over backslashes too and is one reference,
/// named as [`crate::agent::skills::file_key`] names the file (`/d/omp/src/a.go`): a Windows
/// client's tool inputs and results spell the files its later turns use so, in either spelling.
/// Anywhere else a backslash ends a token, as in a POSIX session's `\n`.
///
/// Only a token holding a `/`, a `_` or a lower-case letter followed by an upper-case one
/// makes a reference ([`reference_of`]), and only a `:` after a token's first letter opens a
/// drive: the scan looks for those bytes thirty-two at a time ([`WideMarks`]) and reads the
/// tokens around them, where [`each_reference_by_bytes`] reads every token (debug builds
/// compare).
fn each_reference<'a>(text: &'a str, f: &mut dyn FnMut(Cow<'a, str>)) {
    if cfg!(debug_assertions) {
        let (mut marked, mut by_bytes) = (Vec::new(), Vec::new());
        each_marked_reference(text, &mut |r| marked.push(r));
        each_reference_by_bytes(text, &mut |r| by_bytes.push(r));
        assert_eq!(marked, by_bytes, "the references found by marks are not those of every token");
        marked.into_iter().for_each(f);
    } else {
        each_marked_reference(text, f);
    }
}

/// [`each_reference`] by reading the tokens around the bytes [`chunk_marks`] finds, [`WIDE`]
/// bytes at a time: by AVX2 where the processor has it (the scan's bytes read in half the
/// instructions), else by SSE2 ([`WideMarks`]).
fn each_marked_reference<'a>(text: &'a str, f: &mut dyn FnMut(Cow<'a, str>)) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2.
        return unsafe { each_marked_reference_avx2(text, f) };
    }
    scan_marks::<ByChunks>(text, f);
}

/// [`each_marked_reference`] by AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn each_marked_reference_avx2<'a>(text: &'a str, f: &mut dyn FnMut(Cow<'a, str>)) {
    scan_marks::<Avx2>(text, f);
}

/// [`each_marked_reference`] with the marks `M` finds.
#[inline(always)]
fn scan_marks<'a, M: WideMarks>(text: &'a str, f: &mut dyn FnMut(Cow<'a, str>)) {
    let bytes = text.as_bytes();
    // Every byte before `read` is read; a token never runs on from before it (the byte at
    // `read` is none of a token's or a drive path's, or the text's start).
    let mut read = 0;
    let mut at = 0;
    let mut after_lower = false;
    while let Some(chunk) = bytes.get(at..).and_then(<[u8]>::first_chunk::<WIDE>) {
        let (marks, lower) = M::marks(chunk, after_lower);
        after_lower = lower;
        if marks != 0 {
            read = read_marks(text, at, marks, read, f);
            if read > at + WIDE {
                // (The byte at `read` is no letter: no upper-case one after a lower-case one.)
                (at, after_lower) = (read, false);
                continue;
            }
        }
        at += WIDE;
    }
    // The last bytes, padded with zeros (which no mark, letter or token holds).
    if let Some(rest) = bytes.get(at..).filter(|rest| !rest.is_empty()) {
        let mut chunk = [0u8; WIDE];
        chunk[..rest.len()].copy_from_slice(rest);
        let (marks, _) = M::marks(&chunk, after_lower);
        read_marks(text, at, marks, read, f);
    }
}

/// The bytes the scan reads the marks of at a time ([`WideMarks`]).
const WIDE: usize = 2 * CHUNK;

/// [`chunk_marks`] of [`WIDE`] bytes: the marks one bit each (byte `i` in bit `i`), and whether
/// the last byte is a lower-case letter.
trait WideMarks {
    fn marks(chunk: &[u8; WIDE], after_lower: bool) -> (u32, bool);
}

/// [`WideMarks`] of two chunks by [`chunk_marks`].
struct ByChunks;

impl WideMarks for ByChunks {
    #[inline(always)]
    fn marks(chunk: &[u8; WIDE], after_lower: bool) -> (u32, bool) {
        let (low, high) = (chunk.first_chunk::<CHUNK>().expect("half a wide chunk"), chunk.last_chunk::<CHUNK>().expect("half a wide chunk"));
        let (low_marks, low_lower) = chunk_marks(low, after_lower);
        let (high_marks, high_lower) = chunk_marks(high, low_lower);
        (low_marks | high_marks << CHUNK, high_lower)
    }
}

/// [`WideMarks`] by AVX2, read only where the processor has it ([`each_marked_reference`];
/// debug builds compare [`ByChunks`]).
#[cfg(target_arch = "x86_64")]
struct Avx2;

#[cfg(target_arch = "x86_64")]
impl WideMarks for Avx2 {
    #[inline(always)]
    fn marks(chunk: &[u8; WIDE], after_lower: bool) -> (u32, bool) {
        // SAFETY: `Avx2` scans only where the processor has AVX2.
        let marks = unsafe { wide_marks_avx2(chunk, after_lower) };
        debug_assert_eq!(marks, ByChunks::marks(chunk, after_lower), "AVX2 marks of {chunk:?}");
        marks
    }
}

/// [`chunk_marks_sse2`] of [`WIDE`] bytes by AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn wide_marks_avx2(chunk: &[u8; WIDE], after_lower: bool) -> (u32, bool) {
    use std::arch::x86_64::{_mm256_add_epi8, _mm256_cmpeq_epi8, _mm256_cmpgt_epi8, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_or_si256, _mm256_set1_epi8};
    // SAFETY: `chunk` is `WIDE` bytes to read, the 256 bits of an unaligned load.
    let bytes = unsafe { _mm256_loadu_si256(chunk.as_ptr().cast()) };
    // `_mm256_set1_epi8` takes the byte's bits as an `i8`.
    let equal = |c: u8| _mm256_cmpeq_epi8(bytes, _mm256_set1_epi8(c as i8));
    let marks = _mm256_movemask_epi8(_mm256_or_si256(_mm256_or_si256(equal(b'/'), equal(b'_')), equal(b':'))) as u32;
    // `first..first + 26` moved onto `-128..-102`: the only bytes below -102 then.
    let letters = |first: u8| {
        let moved = _mm256_add_epi8(bytes, _mm256_set1_epi8(0x80u8.wrapping_sub(first) as i8));
        _mm256_movemask_epi8(_mm256_cmpgt_epi8(_mm256_set1_epi8((0x80u8 + 26) as i8), moved)) as u32
    };
    let (lower, upper) = (letters(b'a'), letters(b'A'));
    (marks | (((lower << 1) | u32::from(after_lower)) & upper), lower >> (WIDE - 1) != 0)
}

/// Reads the marks of the [`WIDE`] bytes at `at` ([`WideMarks`]) from `read` on
/// ([`read_mark`]); returns where reading goes on.
#[inline]
fn read_marks<'a>(text: &'a str, at: usize, mut marks: u32, mut read: usize, f: &mut dyn FnMut(Cow<'a, str>)) -> usize {
    while marks != 0 {
        let mark = at + marks.trailing_zeros() as usize;
        marks &= marks - 1;
        if mark >= read {
            read = read_mark(text, mark, read, f);
        }
    }
    read
}

/// The bytes [`chunk_marks`] tests at a time.
const CHUNK: usize = 16;

/// The bytes of `chunk` a reference scan must look at, one bit each (byte `i` in bit `i`): a
/// `/`, `_` or `:`, or an upper-case letter after a lower-case one (`after_lower`: the byte
/// before the chunk was a lower-case letter); and whether its last byte is a lower-case letter
/// (the next chunk's `after_lower`). By SSE2, which every x86_64 processor has (debug builds
/// compare [`chunk_marks_by_words`]); elsewhere by words.
fn chunk_marks(chunk: &[u8; CHUNK], after_lower: bool) -> (u32, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of the x86_64 baseline, enabled on every x86_64 target.
        let marks = unsafe { chunk_marks_sse2(chunk, after_lower) };
        debug_assert_eq!(marks, chunk_marks_by_words(chunk, after_lower), "SSE2 marks of {chunk:?}");
        marks
    }
    #[cfg(not(target_arch = "x86_64"))]
    chunk_marks_by_words(chunk, after_lower)
}

/// [`chunk_marks`] by SSE2: a byte's marks by comparing lanes, its class as a letter by a
/// signed comparison of its offset from `a` (or `A`) moved to the bottom of the signed range.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn chunk_marks_sse2(chunk: &[u8; CHUNK], after_lower: bool) -> (u32, bool) {
    use std::arch::x86_64::{_mm_add_epi8, _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_movemask_epi8, _mm_or_si128, _mm_set_epi64x, _mm_set1_epi8};
    let (low, high) = chunk.split_at(CHUNK / 2);
    let word = |half: &[u8]| i64::from_le_bytes(half.try_into().expect("half a chunk"));
    let bytes = _mm_set_epi64x(word(high), word(low));
    // `_mm_set1_epi8` takes the byte's bits as an `i8`.
    let equal = |c: u8| _mm_cmpeq_epi8(bytes, _mm_set1_epi8(c as i8));
    let marks = _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(equal(b'/'), equal(b'_')), equal(b':'))) as u32;
    // `first..first + 26` moved onto `-128..-102`: the only bytes below -102 then.
    let letters = |first: u8| {
        let moved = _mm_add_epi8(bytes, _mm_set1_epi8(0x80u8.wrapping_sub(first) as i8));
        _mm_movemask_epi8(_mm_cmplt_epi8(moved, _mm_set1_epi8((0x80u8 + 26) as i8))) as u32
    };
    let (lower, upper) = (letters(b'a'), letters(b'A'));
    (marks | (((lower << 1) | u32::from(after_lower)) & upper), lower >> (CHUNK - 1) != 0)
}

/// [`chunk_marks`] eight bytes at a time in a `u64` ([`marks_of`]).
fn chunk_marks_by_words(chunk: &[u8; CHUNK], after_lower: bool) -> (u32, bool) {
    let (low, high) = chunk.split_at(CHUNK / 2);
    let word = |half: &[u8]| u64::from_le_bytes(half.try_into().expect("half a chunk"));
    let (low_marks, low_lower) = marks_of(word(low), u64::from(after_lower) << 7);
    let (high_marks, high_lower) = marks_of(word(high), low_lower);
    (high_bits(low_marks) | high_bits(high_marks) << 8, high_lower != 0)
}

/// The high bit of each byte of `word`, byte `i`'s in bit `i` (the multiplication moves byte
/// `i`'s bit to bit `56 + i`, and no two of its terms meet below that).
fn high_bits(word: u64) -> u32 {
    u32::from(((word >> 7).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8)
}

/// Eight bytes at a time (little-endian: byte `i` in bits `8i..8i + 8`).
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// [`chunk_marks`] of eight bytes, by their high bit; `after_lower` and the second value in
/// byte 0's high bit (as a lower-case letter in byte 7 sets it). Each byte is tested on its
/// own: no carry crosses a byte.
fn marks_of(word: u64, after_lower: u64) -> (u64, u64) {
    // A byte's high bit is clear here if it equals `c` (its low seven bits added to 0x7F carry
    // into the high bit unless all are zero).
    let unequal = |c: u8| {
        let x = word ^ (ONES * u64::from(c));
        ((x & !HIGHS) + !HIGHS) | x
    };
    let marks = !(unequal(b'/') & unequal(b'_') & unequal(b':')) & HIGHS;
    // A letter: an ASCII byte whose lower-case form (0x20 set) lies in `a..=z`.
    let folded = (word | (ONES * 0x20)) & !HIGHS;
    let letter = (folded + ONES * u64::from(0x80 - b'a')) & !(folded + ONES * u64::from(0x7F - b'z')) & !word & HIGHS;
    // Lower case has 0x20 set (shifted onto the high bit).
    let lower = letter & (word << 2);
    let upper = letter & !(word << 2);
    (marks | (((lower << 8) | after_lower) & upper), lower >> 56)
}

/// Reads the token holding the byte at `mark` ([`chunk_marks`]; `read` as in
/// [`each_marked_reference`]), or the drive path opening at the letter before a `:`, giving
/// its reference to `f`; returns where reading goes on.
fn read_mark<'a>(text: &'a str, mark: usize, read: usize, f: &mut dyn FnMut(Cow<'a, str>)) -> usize {
    let bytes = text.as_bytes();
    let is_token = |at: usize| BYTE_CLASS[usize::from(bytes[at])] & TOKEN != 0;
    if !is_token(mark) {
        // A `:`: a drive path opens only at a token's first byte ([`drive_path_end`]), then
        // a one-letter token (which makes no reference).
        let Some(start) = mark.checked_sub(1) else { return read };
        if start < read || (start > 0 && is_token(start - 1)) {
            return read;
        }
        return match drive_path_end(bytes, start) {
            Some(end) => {
                windows_reference(&text[start..end], f);
                end
            }
            None => read,
        };
    }
    // The token's bounds, and its bytes' [`SLASH`] and [`DOT_DASH`] bits together: sixteen
    // bytes at a time ([`ChunkClasses`]) where that many lie on the side walked, else byte by
    // byte.
    let class = |at: usize| BYTE_CLASS[usize::from(bytes[at])];
    let (mut start, mut end, mut classes) = (mark, mark + 1, class(mark));
    while start > read {
        let Some(chunk) = start.checked_sub(CHUNK).and_then(|from| bytes[from..start].first_chunk::<CHUNK>()) else {
            while start > read && class(start - 1) & TOKEN != 0 {
                start -= 1;
                classes |= class(start);
            }
            break;
        };
        // Byte `i` of the chunk is byte `start - CHUNK + i`: the run ends at its top bit.
        let chunk = ChunkClasses::of(chunk);
        let run = ((chunk.token << CHUNK).leading_ones() as usize).min(start - read);
        classes |= chunk.classes_in((0xFFFF << (CHUNK - run)) & 0xFFFF);
        start -= run;
        if run < CHUNK {
            break;
        }
    }
    loop {
        let Some(chunk) = bytes.get(end..).and_then(<[u8]>::first_chunk::<CHUNK>) else {
            while end < bytes.len() && class(end) & TOKEN != 0 {
                classes |= class(end);
                end += 1;
            }
            break;
        };
        let chunk = ChunkClasses::of(chunk);
        let run = chunk.token.trailing_ones() as usize;
        classes |= chunk.classes_in((1 << run) - 1);
        end += run;
        if run < CHUNK {
            break;
        }
    }
    // A token holding a mark opens no drive path (that opens with a one-letter token), and
    // holds a mark: [`read_token`] would give its reference.
    debug_assert!(drive_path_end(bytes, start).is_none(), "a drive path opens with a token holding a mark");
    marked_reference_of(&text[start..end], classes, f);
    end
}

/// The classes of sixteen bytes (a token's, around a mark: [`read_mark`]), one bit each (byte
/// `i` in bit `i`): token bytes ([`TOKEN`]), and the bytes of the [`SLASH`] and [`DOT_DASH`]
/// classes (those [`marked_reference_of`] tells a token by, besides its letters).
#[derive(Debug, PartialEq, Eq)]
struct ChunkClasses {
    token: u32,
    slash: u32,
    dot_dash: u32,
}

impl ChunkClasses {
    /// By SSE2 (debug builds compare [`ChunkClasses::by_bytes`]); elsewhere by bytes.
    fn of(chunk: &[u8; CHUNK]) -> ChunkClasses {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: SSE2 is part of the x86_64 baseline, enabled on every x86_64 target.
            let classes = unsafe { chunk_classes_sse2(chunk) };
            debug_assert_eq!(classes, ChunkClasses::by_bytes(chunk), "SSE2 classes of {chunk:?}");
            classes
        }
        #[cfg(not(target_arch = "x86_64"))]
        ChunkClasses::by_bytes(chunk)
    }

    /// [`ChunkClasses::of`] by each byte's [`BYTE_CLASS`].
    fn by_bytes(chunk: &[u8; CHUNK]) -> ChunkClasses {
        let mut classes = ChunkClasses { token: 0, slash: 0, dot_dash: 0 };
        for (i, &b) in chunk.iter().enumerate() {
            let class = BYTE_CLASS[usize::from(b)];
            let bit = |of: u8| u32::from(class & of != 0) << i;
            classes.token |= bit(TOKEN);
            classes.slash |= bit(SLASH);
            classes.dot_dash |= bit(DOT_DASH);
        }
        classes
    }

    /// The [`SLASH`] and [`DOT_DASH`] bits of the bytes in `range` (bit `i` for byte `i`)
    /// together.
    fn classes_in(&self, range: u32) -> u8 {
        u8::from(self.slash & range != 0) * SLASH | u8::from(self.dot_dash & range != 0) * DOT_DASH
    }
}

/// [`ChunkClasses::of`] by SSE2: by comparing lanes, and by signed comparisons of a byte's
/// offset from the first of a range moved to the bottom of the signed range (as
/// [`chunk_marks_sse2`]): the token bytes are `-./0-9` (one range), the letters (a range once
/// `0x20` is set, which makes no other byte a lower-case letter) and `_`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn chunk_classes_sse2(chunk: &[u8; CHUNK]) -> ChunkClasses {
    use std::arch::x86_64::{__m128i, _mm_add_epi8, _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_movemask_epi8, _mm_or_si128, _mm_set_epi64x, _mm_set1_epi8};
    let (low, high) = chunk.split_at(CHUNK / 2);
    let word = |half: &[u8]| i64::from_le_bytes(half.try_into().expect("half a chunk"));
    let bytes = _mm_set_epi64x(word(high), word(low));
    // `_mm_set1_epi8` takes the byte's bits as an `i8`.
    let within = |bytes: __m128i, first: u8, len: u8| {
        let moved = _mm_add_epi8(bytes, _mm_set1_epi8(0x80u8.wrapping_sub(first) as i8));
        _mm_cmplt_epi8(moved, _mm_set1_epi8((0x80u8 + len) as i8))
    };
    let slash = _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'/' as i8));
    let dot_dash = within(bytes, b'-', 2);
    let letter = within(_mm_or_si128(bytes, _mm_set1_epi8(0x20)), b'a', 26);
    let token = _mm_or_si128(_mm_or_si128(within(bytes, b'-', b'9' - b'-' + 1), letter), _mm_cmpeq_epi8(bytes, _mm_set1_epi8(b'_' as i8)));
    let mask = |v: __m128i| _mm_movemask_epi8(v) as u32;
    ChunkClasses { token: mask(token), slash: mask(slash), dot_dash: mask(dot_dash) }
}

/// [`reference_of`] of a token holding a mark ([`chunk_marks`]) whose bytes' [`SLASH`] and
/// [`DOT_DASH`] bits together are those of `classes`, told by them where it can be
/// (`reference_of` trims the ends, then searches the token for a `/`, a letter, and, for an
/// identifier, reads every byte): with no `.` or `-` at its ends it needs no trimming; then a
/// `/` makes it a path (if it holds a letter), a `.` or `-` inside no identifier; else it is letters, digits and `_` holding a `_` or a
/// lower-to-upper change (its mark), an identifier if long enough and opening as one. Debug
/// builds compare [`reference_of`].
fn marked_reference_of<'a>(token: &'a str, classes: u8, f: &mut dyn FnMut(Cow<'a, str>)) {
    if cfg!(debug_assertions) {
        let (mut told, mut read) = (Vec::new(), Vec::new());
        marked_reference_by_classes(token, classes, &mut |r| told.push(r));
        reference_of(token, &mut |r| read.push(r));
        assert_eq!(told, read, "the reference of {token:?} told by its classes");
        told.into_iter().for_each(f);
    } else {
        marked_reference_by_classes(token, classes, f);
    }
}

/// [`marked_reference_of`] without its debug check.
fn marked_reference_by_classes<'a>(token: &'a str, classes: u8, f: &mut dyn FnMut(Cow<'a, str>)) {
    if classes & DOT_DASH != 0 {
        let bytes = token.as_bytes();
        if bytes.first().is_some_and(|b| matches!(b, b'.' | b'-')) || bytes.last().is_some_and(|b| matches!(b, b'.' | b'-')) {
            return reference_of(token, f);
        }
        if classes & SLASH == 0 {
            return;
        }
    }
    if token.len() < 4 {
        return;
    }
    if classes & SLASH != 0 {
        if token.bytes().any(|b| b.is_ascii_alphabetic()) {
            f(Cow::Borrowed(token.trim_end_matches('/')));
        }
        return;
    }
    let first = token.as_bytes()[0];
    if token.len() >= 5 && (first.is_ascii_alphabetic() || first == b'_') {
        f(Cow::Borrowed(token));
    }
}

/// [`each_reference`] by reading every token.
fn each_reference_by_bytes<'a>(text: &'a str, f: &mut dyn FnMut(Cow<'a, str>)) {
    let bytes = text.as_bytes();
    let mut at = 0;
    while at < bytes.len() {
        if BYTE_CLASS[usize::from(bytes[at])] & TOKEN == 0 {
            at += 1;
        } else {
            at = read_token(text, at, f);
        }
    }
}

/// Reads the token (or drive path) starting at `start`, giving its reference, if any, to `f`;
/// returns where it ends.
fn read_token<'a>(text: &'a str, start: usize, f: &mut dyn FnMut(Cow<'a, str>)) -> usize {
    let bytes = text.as_bytes();
    if let Some(end) = drive_path_end(bytes, start) {
        windows_reference(&text[start..end], f);
        return end;
    }
    // A token makes a reference only where it holds a `/`, a `_` or a lower-case letter
    // followed by an upper-case one ([`reference_of`]: a path or an identifier; trimming
    // its ends keeps none that was not there): the others (most words) are not looked at.
    // Without a branch per byte: the previous byte's `LOWER` bit shifted onto `UPPER` marks
    // a lower-to-upper change.
    let (mut marks, mut previous) = (0u8, 0u8);
    let mut at = start;
    while at < bytes.len() {
        let class = BYTE_CLASS[usize::from(bytes[at])];
        if class & TOKEN == 0 {
            break;
        }
        marks |= (class & MARK) | ((previous & LOWER) << 1 & class);
        previous = class;
        at += 1;
    }
    if marks != 0 {
        reference_of(&text[start..at], f);
    }
    at
}

/// [`BYTE_CLASS`] bits: a token byte ([`is_token_byte`]); `/` or `_`; lower and upper case;
/// `/`; `.` or `-`.
const TOKEN: u8 = 1;
const MARK: u8 = 2;
const LOWER: u8 = 4;
/// One bit above [`LOWER`] (the scan shifts a byte's `LOWER` onto the next byte's `UPPER`).
const UPPER: u8 = LOWER << 1;
const SLASH: u8 = 16;
const DOT_DASH: u8 = 32;

/// Per byte: its [`TOKEN`], [`MARK`], [`LOWER`], [`UPPER`], [`SLASH`] and [`DOT_DASH`] bits.
static BYTE_CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        let mut class = 0;
        if byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'/' | b'-') {
            class |= TOKEN;
        }
        if matches!(byte, b'_' | b'/') {
            class |= MARK;
        }
        if byte.is_ascii_lowercase() {
            class |= LOWER;
        }
        if byte.is_ascii_uppercase() {
            class |= UPPER;
        }
        if byte == b'/' {
            class |= SLASH;
        }
        if matches!(byte, b'.' | b'-') {
            class |= DOT_DASH;
        }
        table[b] = class;
        b += 1;
    }
    table
};

/// Where the Windows path starting at `start` (the first byte of a token) ends: a drive letter,
/// `:`, a separator (a backslash only after an upper-case letter) and a token byte, then token
/// bytes and backslashes.
fn drive_path_end(bytes: &[u8], start: usize) -> Option<usize> {
    // A backslash after a lower-case letter and a colon is an escape in a POSIX session's code
    // (`"%s:\n"`); Windows clients write the drive in upper case there.
    let opens = bytes[start].is_ascii_alphabetic()
        && bytes.get(start + 1) == Some(&b':')
        && match bytes.get(start + 2) {
            Some(b'/') => true,
            Some(b'\\') => bytes[start].is_ascii_uppercase(),
            _ => false,
        }
        && bytes.get(start + 3).is_some_and(|&b| is_token_byte(b) && b != b'/');
    if !opens {
        return None;
    }
    let mut at = start + 3;
    while at < bytes.len() && (is_token_byte(bytes[at]) || bytes[at] == b'\\') {
        at += 1;
    }
    Some(at)
}

/// Calls `f` with the reference a Windows drive path makes ([`drive_path_end`]): the file's
/// [`crate::agent::skills::file_key`], its trailing separators and dots left out.
fn windows_reference<'a>(token: &'a str, f: &mut dyn FnMut(Cow<'a, str>)) {
    let token = token.trim_end_matches(['.', '-', '\\', '/']);
    if token.len() >= 4 && token[3..].bytes().any(|b| b.is_ascii_alphabetic()) {
        f(Cow::Owned(crate::agent::skills::file_key(token).into_owned()));
    }
}

fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'/' | b'-')
}

/// Calls `f` with the reference `token` (a maximal run of token characters) makes, if any.
fn reference_of<'a>(token: &'a str, f: &mut dyn FnMut(Cow<'a, str>)) {
    let token = token.trim_matches(|c: char| matches!(c, '.' | '-'));
    if token.len() < 4 {
        return;
    }
    if token.contains('/') {
        if token.bytes().any(|b| b.is_ascii_alphabetic()) {
            f(Cow::Borrowed(token.trim_end_matches('/')));
        }
        return;
    }
    if is_identifier(token) {
        f(Cow::Borrowed(token));
    }
}

fn is_identifier(token: &str) -> bool {
    let bytes = token.as_bytes();
    token.len() >= 5
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes.iter().all(|b| b.is_ascii_alphanumeric() || *b == b'_')
        && (token.contains('_') || bytes.windows(2).any(|w| w[0].is_ascii_lowercase() && w[1].is_ascii_uppercase()))
}

/// A set of references borrowed from the texts they were found in (membership only: nothing
/// reaches output in its order).
type RefSet<'a> = rustc_hash::FxHashSet<Cow<'a, str>>;

fn value_references<'a>(value: &'a Value, out: &mut RefSet<'a>) {
    match value {
        Value::String(s) => each_reference(s, &mut |r| {
            out.insert(r);
        }),
        Value::Array(items) => items.iter().for_each(|v| value_references(v, out)),
        Value::Object(map) => map.values().for_each(|v| value_references(v, out)),
        _ => {}
    }
}

fn block_references<'a>(block: &'a ContentBlock, out: &mut RefSet<'a>) {
    let mut text = |t: &'a str| {
        each_reference(t, &mut |r| {
            out.insert(r);
        })
    };
    match block {
        ContentBlock::Text { text: t, .. } => text(t),
        ContentBlock::Thinking { thinking, .. } => text(thinking),
        ContentBlock::ToolUse { input, .. } | ContentBlock::ServerToolUse { input, .. } => value_references(input, out),
        ContentBlock::ToolResult { content: Some(ToolResultContent::Text(t)), .. } => text(t),
        ContentBlock::ToolResult { content: Some(ToolResultContent::Blocks(blocks)), .. } => blocks.iter().for_each(|b| block_references(b, out)),
        _ => {}
    }
}

/// The references of a conversation.
pub fn message_references(messages: &[Message]) -> BTreeSet<String> {
    borrowed_references(messages).into_iter().map(Cow::into_owned).collect()
}

fn borrowed_references(messages: &[Message]) -> RefSet<'_> {
    let mut out = RefSet::default();
    for message in messages {
        content_references(&message.content, &mut out);
    }
    out
}

/// The references of a message content.
fn content_references<'a>(content: &'a MessageContent, out: &mut RefSet<'a>) {
    match content {
        MessageContent::Text(text) => each_reference(text, &mut |r| {
            out.insert(r);
        }),
        MessageContent::Blocks(blocks) => blocks.iter().for_each(|b| block_references(b, out)),
    }
}

/// Adds the paths the `Read` calls among `blocks` read (a message's own blocks: a text content
/// holds no tool use, a tool result's blocks are not the model's calls), as
/// [`crate::agent::skills::file_key`] names the file: a Windows client's `D:\omp\a.go` and
/// `d:/omp/a.go` are one re-read.
fn add_read_paths<'a>(blocks: &'a [ContentBlock], out: &mut BTreeSet<Cow<'a, str>>) {
    for block in blocks {
        if let ContentBlock::ToolUse { name, input, .. } = block
            && name == "Read"
            && let Some(path) = input.get("file_path").and_then(Value::as_str)
        {
            out.insert(crate::agent::skills::file_key(path));
        }
    }
}

/// Whether `input` is a Read of a file in `read_before` ([`add_read_paths`]).
fn reads_again(input: &Value, read_before: &BTreeSet<Cow<'_, str>>) -> bool {
    input.get("file_path").and_then(Value::as_str).is_some_and(|p| read_before.contains(crate::agent::skills::file_key(p).as_ref()))
}

/// The references of the events of an imported session, each event's found once and shared
/// by every compaction judged in that session (the what-ifs' too: their conversations are
/// mostly the recorded session's events again). A reference is
/// numbered once per memo ([`Names`]); an event's are its distinct numbers. Shared between
/// threads: an event's numbers are set once, and numbers are only ever added.
#[derive(Debug)]
pub struct ReferenceMemo {
    names: RwLock<Names>,
    /// Per event: the references of its content in the conversation
    /// ([`held_references`]).
    held: Box<[OnceLock<Box<[u32]>>]>,
    /// Per model reply: the references of its tool calls' inputs (what a later turn uses).
    used: Box<[OnceLock<Box<[u32]>>]>,
    /// Per event: its rough tokens as the client counts what it adds
    /// ([`crate::replay::triggers::event_rough_tokens`]), read by every plan-search step.
    rough: Box<[OnceLock<u64>]>,
    /// References of long texts (summaries, restored files, results) the requests after a
    /// compaction hold, by the text's xxh3-128: what-ifs of one session send the same ones.
    texts: std::sync::Mutex<rustc_hash::FxHashMap<u128, Arc<[u32]>>>,
    /// Per edit result carrying the file before it: the file after it
    /// ([`crate::replay::working_set::WorkingSet::observe_memoized`]), shared with each working
    /// set that holds it (the record view's and the workload's follow the same results).
    edited: Box<[OnceLock<SharedText>]>,
    /// The numbered renderings of the files compactions restore, by the text's xxh3-128
    /// ([`crate::replay::working_set::WorkingSet::compact_memoized`]).
    rendered: std::sync::Mutex<rustc_hash::FxHashMap<u128, Arc<str>>>,
    /// [`compaction_loss`] by what it reads ([`LossKey`]), its `tokens_dropped` left at 0: a
    /// family's runs and branches judge the run as recorded's compactions again, with the same
    /// calls and the same request after them.
    losses: std::sync::Mutex<rustc_hash::FxHashMap<LossKey, CompactionLoss>>,
    /// The references later recorded turns use, numbered for the count-only judgement
    /// ([`Judgement::Counts`]), made at its first.
    used_names: OnceLock<UsedNames>,
    /// Per event: the [`UsedNames`] numbers of the references it holds in the conversation.
    held_used: Box<[OnceLock<Box<[u32]>>]>,
    /// [`Self::texts`] in the numbers of [`UsedNames`].
    used_texts: std::sync::Mutex<rustc_hash::FxHashMap<u128, Arc<[u32]>>>,
    /// The walk of the main lane's chain of the last view read for a judgement, which the next
    /// one extends (judgements come in call order within a run).
    views: std::sync::Mutex<crate::recording::claude_code::ViewCache>,
}

/// The references some later recorded turn of a session uses, numbered: the references of the
/// main lane's replies' tool inputs and of its prompts but compactions' summaries (what a
/// judgement's later turns use, [`Turns`], whichever compaction it judges). The count-only
/// judgement ([`Judgement::Counts`]) reads no other reference.
#[derive(Debug)]
struct UsedNames {
    ids: rustc_hash::FxHashMap<Box<str>, u32>,
    /// Per event: the numbers of the references it uses (empty for an event no later turn's).
    used: Box<[Box<[u32]>]>,
}

impl UsedNames {
    fn of(session: &ImportedSession) -> UsedNames {
        let mut ids: rustc_hash::FxHashMap<Box<str>, u32> = rustc_hash::FxHashMap::default();
        let mut numbers: Vec<u32> = Vec::new();
        let used = session
            .recording
            .events
            .iter()
            .map(|event| {
                // Each reference numbered as found (the texts [`used_references`] reads).
                let mut number = |text: &str, _: Option<&SharedText>| {
                    each_reference(text, &mut |r| {
                        let n = match ids.get(r.as_ref()) {
                            Some(&n) => n,
                            None => {
                                let n = u32::try_from(ids.len()).expect("fewer than 2^32 distinct references");
                                ids.insert(r.into(), n);
                                n
                            }
                        };
                        numbers.push(n);
                    })
                };
                match &event.kind {
                    EventKind::ModelReply(reply) if event.lane == LANE_MAIN => {
                        reply.content.iter().filter(|b| matches!(b, ContentBlock::ToolUse { .. })).for_each(|b| each_block_text(b, &mut number));
                    }
                    EventKind::UserPrompt(prompt) if event.lane == LANE_MAIN && !prompt.is_compact_summary => each_content_text(&prompt.content, &mut number),
                    _ => return Box::default(),
                }
                numbers.sort_unstable();
                numbers.dedup();
                if cfg!(debug_assertions) {
                    let mut read: Vec<u32> = used_references(&event.kind).iter().map(|r| ids[r.as_ref()]).collect();
                    read.sort_unstable();
                    assert_eq!(numbers, read, "the references an event uses, numbered as found");
                }
                numbers.drain(..).collect()
            })
            .collect();
        UsedNames { ids, used }
    }

    /// Adds to `numbers` those of the references of `text` ([`each_reference`]) it holds.
    fn add_numbers(&self, text: &str, numbers: &mut Vec<u32>) {
        each_reference(text, &mut |r| {
            if let Some(&n) = self.ids.get(r.as_ref()) {
                numbers.push(n);
            }
        });
    }
}

/// What [`compaction_loss`] reads beyond the two context sizes and the session's events: the
/// call after the compaction and the previous main call (their positions in the session's call
/// list, and what it reads of each: the first's number and event, the second's event and lane,
/// which place its view) and the texts of the request after it, as [`each_message_text`] gives
/// them; all but the positions by their xxh3-128 (each text's length before its bytes, so that
/// no two lists of texts hash one stream; a text of [`MEMOIZED_TEXT`] bytes or more by its own
/// xxh3-128, the key of its references in the memo, which its length tells apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct LossKey {
    call_index: usize,
    previous: usize,
    judgement: Judgement,
    read: u128,
}

impl LossKey {
    /// The key, and the xxh3-128 of each text of `after` of [`MEMOIZED_TEXT`] bytes or more, in
    /// order (the keys of their references in the memo, [`ReferenceMemo::text_numbers`]).
    fn of(session: &ImportedSession, call_index: usize, previous: usize, after: &[Message], judgement: Judgement) -> (LossKey, Vec<u128>) {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut long = Vec::new();
        let mut text = |text: &str, shared: Option<&SharedText>| {
            hasher.update(&(text.len() as u64).to_le_bytes());
            if text.len() >= MEMOIZED_TEXT {
                // (A shared text hashes once for every run holding it: restored files are.)
                let digest = shared.map_or_else(|| xxhash_rust::xxh3::xxh3_128(text.as_bytes()), SharedText::xxh3_128);
                hasher.update(&digest.to_le_bytes());
                long.push(digest);
            } else {
                hasher.update(text.as_bytes());
            }
        };
        for (position, fields) in [(call_index, true), (previous, false)] {
            if let Some(call) = session.calls.get(position) {
                let number = if fields { call.index } else { usize::MAX };
                text(&format!("{number} {} ", call.event_index), None);
                text(if fields { "" } else { &call.lane }, None);
            }
        }
        each_message_text(after, &mut text);
        (LossKey { call_index, previous, judgement, read: hasher.digest128() }, long)
    }
}

#[derive(Debug, Default)]
struct Names {
    ids: rustc_hash::FxHashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl Names {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(&id) = self.ids.get(name) {
            return id;
        }
        let id = u32::try_from(self.names.len()).expect("fewer than 2^32 distinct references");
        let name: Arc<str> = name.into();
        self.names.push(name.clone());
        self.ids.insert(name, id);
        id
    }
}

impl ReferenceMemo {
    /// A memo for a session of `events` events.
    pub fn new(events: usize) -> ReferenceMemo {
        let slots = || (0..events).map(|_| OnceLock::new()).collect();
        ReferenceMemo {
            names: RwLock::new(Names::default()),
            held: slots(),
            used: slots(),
            rough: (0..events).map(|_| OnceLock::new()).collect(),
            texts: std::sync::Mutex::default(),
            edited: (0..events).map(|_| OnceLock::new()).collect(),
            rendered: std::sync::Mutex::default(),
            losses: std::sync::Mutex::default(),
            used_names: OnceLock::new(),
            held_used: slots(),
            used_texts: std::sync::Mutex::default(),
            views: std::sync::Mutex::default(),
        }
    }

    /// `compute`'s text for event `i` (a function of the event alone), memoized.
    pub(crate) fn edited(&self, i: usize, compute: &dyn Fn() -> String) -> SharedText {
        match self.edited.get(i) {
            Some(slot) => {
                let text = slot.get_or_init(|| compute().into()).clone();
                debug_assert!(*text == compute(), "the memoized edit of event {i} is not the event's");
                text
            }
            None => compute().into(),
        }
    }

    /// `render(text)`, memoized by the text's content hash.
    pub(crate) fn rendered(&self, text: &str, render: impl FnOnce(&str) -> String) -> String {
        let key = xxhash_rust::xxh3::xxh3_128(text.as_bytes());
        if let Some(rendered) = self.rendered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
            return rendered.to_string();
        }
        let rendered = render(text);
        self.rendered.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, rendered.as_str().into());
        rendered
    }

    /// `compute`'s value for event `i` (a pure function of the event), memoized.
    pub(crate) fn rough(&self, i: usize, compute: impl FnOnce() -> u64) -> u64 {
        match self.rough.get(i) {
            Some(slot) => *slot.get_or_init(compute),
            None => compute(),
        }
    }

    /// The numbers of the references of `text` (each numbered, repeats left out), memoized by
    /// the text's content hash `key` (its xxh3-128: debug builds hash it again and compare).
    fn text_numbers(&self, text: &str, key: u128) -> Arc<[u32]> {
        debug_assert_eq!(key, xxhash_rust::xxh3::xxh3_128(text.as_bytes()), "a long text's given hash");
        if let Some(numbers) = self.texts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
            return numbers.clone();
        }
        let mut refs = RefSet::default();
        each_reference(text, &mut |r| {
            refs.insert(r);
        });
        let numbers: Arc<[u32]> = self.numbers(refs).into();
        self.texts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, numbers.clone());
        numbers
    }

    fn numbers(&self, refs: RefSet<'_>) -> Box<[u32]> {
        if refs.is_empty() {
            return Box::default();
        }
        let mut names = self.names.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        refs.into_iter().map(|r| names.id(&r)).collect()
    }

    /// The event indices of the view of the call at `position` of `session`'s call list
    /// ([`ImportedSession::view_event_indices`]), the walk of its chain extending the last one's
    /// (debug builds walk it alone too and compare).
    fn view(&self, session: &ImportedSession, position: usize) -> Vec<usize> {
        let call = &session.calls[position];
        let view = session.view_event_indices_cached(call, 0, &mut self.views.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        debug_assert_eq!(view, session.view_event_indices(call), "the view of call {position}, the walk extended and alone");
        view
    }

    /// The session's [`UsedNames`], made at the first count-only judgement.
    fn used_names(&self, session: &ImportedSession) -> &UsedNames {
        self.used_names.get_or_init(|| UsedNames::of(session))
    }

    /// The [`UsedNames`] numbers of the references event `i` of `session` holds in the
    /// conversation ([`held_references`]), memoized: those of a later turn's own event are the
    /// ones it uses, and of a reply's other blocks (its tool inputs are what it uses); any other
    /// event's texts are scanned (debug builds number every reference and compare).
    fn held_used(&self, session: &ImportedSession, i: usize, names: &UsedNames) -> &[u32] {
        let compute = || -> Box<[u32]> {
            let Some(event) = session.recording.events.get(i) else { return Box::default() };
            let own = &names.used[i];
            let mut numbers = Vec::new();
            let is_use = event.lane == LANE_MAIN;
            match &event.kind {
                EventKind::UserPrompt(prompt) if is_use && !prompt.is_compact_summary => return own.clone(),
                EventKind::ModelReply(reply) if is_use => {
                    numbers.extend_from_slice(own);
                    for block in reply.content.iter().filter(|b| !matches!(b, ContentBlock::ToolUse { .. })) {
                        each_block_text(block, &mut |text, _| names.add_numbers(text, &mut numbers));
                    }
                }
                EventKind::UserPrompt(prompt) => each_content_text(&prompt.content, &mut |text, _| names.add_numbers(text, &mut numbers)),
                EventKind::ToolResult(result) => match &result.content {
                    Some(ToolResultContent::Text(text)) => names.add_numbers(text, &mut numbers),
                    Some(ToolResultContent::Blocks(blocks)) => blocks.iter().for_each(|b| each_block_text(b, &mut |text, _| names.add_numbers(text, &mut numbers))),
                    None => {}
                },
                EventKind::ModelReply(reply) => reply.content.iter().for_each(|b| each_block_text(b, &mut |text, _| names.add_numbers(text, &mut numbers))),
                EventKind::Attachment(attachment) if !ATTACHMENTS_NOT_SENT.contains(&attachment.attachment_type.as_str()) => {
                    names.add_numbers(&attachment_text(attachment), &mut numbers);
                }
                _ => {}
            }
            numbers.sort_unstable();
            numbers.dedup();
            if cfg!(debug_assertions) {
                let mut every: Vec<u32> = held_references(&event.kind, |refs| refs.iter().filter_map(|r| names.ids.get(r.as_ref()).copied()).collect());
                every.sort_unstable();
                assert_eq!(numbers, every, "the used references event {i} holds, of its own and scanned");
            }
            numbers.into()
        };
        match self.held_used.get(i) {
            Some(slot) => slot.get_or_init(compute),
            None => &[],
        }
    }

    /// [`Self::text_numbers`] in the numbers of [`UsedNames`].
    fn text_used_numbers(&self, text: &str, key: u128, names: &UsedNames) -> Arc<[u32]> {
        debug_assert_eq!(key, xxhash_rust::xxh3::xxh3_128(text.as_bytes()), "a long text's given hash");
        if let Some(numbers) = self.used_texts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key) {
            return numbers.clone();
        }
        let mut numbers = Vec::new();
        names.add_numbers(text, &mut numbers);
        numbers.sort_unstable();
        numbers.dedup();
        let numbers: Arc<[u32]> = numbers.into();
        self.used_texts.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, numbers.clone());
        numbers
    }

    /// The numbers of the references event `i` of `session` holds (`used`: of those a later
    /// turn uses), memoized.
    fn event<'s>(&'s self, session: &ImportedSession, i: usize, used: bool) -> Cow<'s, [u32]> {
        let Some(event) = session.recording.events.get(i) else { return Cow::Borrowed(&[]) };
        let compute = || if used { self.numbers(used_references(&event.kind)) } else { held_references(&event.kind, |refs| self.numbers(refs)) };
        let slots = if used { &self.used } else { &self.held };
        match slots.get(i) {
            Some(slot) => Cow::Borrowed(slot.get_or_init(compute)),
            None => Cow::Owned(compute().into_vec()),
        }
    }
}

/// The references event `kind` holds in the conversation: its content as a message holds it
/// (a prompt's, a tool result's, a reply's blocks, a sent attachment's text), given to `with`.
fn held_references<T>(kind: &EventKind, with: impl FnOnce(RefSet<'_>) -> T) -> T {
    fn text<'a>(t: &'a str, refs: &mut RefSet<'a>) {
        each_reference(t, &mut |r| {
            refs.insert(r);
        })
    }
    let mut refs = RefSet::default();
    match kind {
        EventKind::UserPrompt(prompt) => content_references(&prompt.content, &mut refs),
        EventKind::ToolResult(result) => match &result.content {
            Some(ToolResultContent::Text(t)) => text(t, &mut refs),
            Some(ToolResultContent::Blocks(blocks)) => blocks.iter().for_each(|b| block_references(b, &mut refs)),
            None => {}
        },
        EventKind::ModelReply(reply) => reply.content.iter().for_each(|b| block_references(b, &mut refs)),
        EventKind::Attachment(attachment) if !ATTACHMENTS_NOT_SENT.contains(&attachment.attachment_type.as_str()) => {
            let rendered = attachment_text(attachment);
            let mut owned = RefSet::default();
            text(&rendered, &mut owned);
            return with(owned);
        }
        _ => {}
    }
    with(refs)
}

/// The references of event `kind` a later turn uses: a model reply's tool calls' inputs, a
/// prompt's content (the caller leaves out a compaction's summary).
fn used_references(kind: &EventKind) -> RefSet<'_> {
    let mut refs = RefSet::default();
    match kind {
        EventKind::ModelReply(reply) => {
            for block in &reply.content {
                if let ContentBlock::ToolUse { input, .. } = block {
                    value_references(input, &mut refs);
                }
            }
        }
        EventKind::UserPrompt(prompt) => content_references(&prompt.content, &mut refs),
        _ => {}
    }
    refs
}

/// Calls `f` with each text of `messages` whose references a message holds (the strings of
/// tool inputs one by one), and the [`SharedText`] holding it where one does (which keeps its
/// hash, [`SharedText::xxh3_128`]).
fn each_message_text<'a>(messages: &'a [Message], f: &mut dyn FnMut(&'a str, Option<&'a SharedText>)) {
    for message in messages {
        each_content_text(&message.content, f);
    }
}

/// [`each_message_text`] of one message's content.
fn each_content_text<'a>(content: &'a MessageContent, f: &mut dyn FnMut(&'a str, Option<&'a SharedText>)) {
    match content {
        MessageContent::Text(text) => f(text, Some(text)),
        MessageContent::Blocks(blocks) => blocks.iter().for_each(|b| each_block_text(b, f)),
    }
}

/// [`each_message_text`] of one block ([`block_references`] reads the same texts).
fn each_block_text<'a>(block: &'a ContentBlock, f: &mut dyn FnMut(&'a str, Option<&'a SharedText>)) {
    fn value<'a>(v: &'a Value, f: &mut dyn FnMut(&'a str, Option<&'a SharedText>)) {
        match v {
            Value::String(s) => f(s, None),
            Value::Array(items) => items.iter().for_each(|v| value(v, f)),
            Value::Object(map) => map.values().for_each(|v| value(v, f)),
            _ => {}
        }
    }
    match block {
        ContentBlock::Text { text, .. } => f(text, Some(text)),
        ContentBlock::Thinking { thinking, .. } => f(thinking, None),
        ContentBlock::ToolUse { input, .. } | ContentBlock::ServerToolUse { input, .. } => value(input, f),
        ContentBlock::ToolResult { content: Some(ToolResultContent::Text(t)), .. } => f(t, Some(t)),
        ContentBlock::ToolResult { content: Some(ToolResultContent::Blocks(blocks)), .. } => blocks.iter().for_each(|b| each_block_text(b, f)),
        _ => {}
    }
}

/// Texts at least this long have their references memoized by content ([`ReferenceMemo`]):
/// the summaries, restored files and long results the what-ifs of a session send again.
const MEMOIZED_TEXT: usize = 1024;

/// A set of small numbers.
struct Bits(Vec<u64>);

impl Bits {
    fn new(len: usize) -> Bits {
        Bits(vec![0; len.div_ceil(64)])
    }

    fn insert(&mut self, i: u32) {
        self.0[i as usize / 64] |= 1 << (i % 64);
    }

    fn remove(&mut self, i: u32) {
        if let Some(word) = self.0.get_mut(i as usize / 64) {
            *word &= !(1 << (i % 64));
        }
    }

    fn contains(&self, i: u32) -> bool {
        self.0.get(i as usize / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
    }

    fn len(&self) -> usize {
        self.0.iter().map(|w| w.count_ones() as usize).sum()
    }
}

/// What a compaction's loss judgement finds ([`compaction_loss`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Judgement {
    /// Everything [`CompactionLoss`] holds (what `compare` prints).
    #[default]
    Full,
    /// Only the counts the audit reads, `references_lost` and `rereads`
    /// ([`crate::replay::audit::agent_info_loss`]): `references_dropped` is 0 and `lost` empty.
    /// Only the references some later recorded turn of the session uses are numbered
    /// ([`UsedNames`]), not every one the conversation holds.
    Counts,
}

/// The loss of the compaction before the main-lane call at `call_index` of `session`, whose
/// request holds `after` (summary, restored files and what follows) and whose previous main
/// call is `previous`; `context_before` and `context_after` are the two calls' contexts; all of
/// it or only its counts, as `judgement` says.
/// Memoized per session by what it reads ([`LossKey`]); debug builds judge every hit again and
/// compare, and judge a count-only one in full too and compare the counts.
pub fn compaction_loss(
    session: &ImportedSession,
    call_index: usize,
    previous: usize,
    after: &[Message],
    context_before: u64,
    context_after: u64,
    judgement: Judgement,
) -> CompactionLoss {
    let memo = session.reference_memo();
    let (key, long) = LossKey::of(session, call_index, previous, after, judgement);
    let judge = || {
        let loss = match judgement {
            Judgement::Full => references_lost(session, call_index, previous, after, &long),
            Judgement::Counts => references_counted(session, call_index, previous, after, &long),
        };
        if cfg!(debug_assertions) && judgement == Judgement::Counts {
            let full = references_lost(session, call_index, previous, after, &long);
            assert_eq!((loss.references_lost, loss.rereads), (full.references_lost, full.rereads), "the counts of the loss of call {call_index} after {previous}, judged in full and counted");
        }
        loss
    };
    let hit = memo.losses.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(&key).cloned();
    let mut loss = match hit {
        Some(loss) => {
            debug_assert_eq!(loss, judge(), "memoized compaction loss of call {call_index} after {previous}");
            loss
        }
        None => {
            let loss = judge();
            memo.losses.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key, loss.clone());
            loss
        }
    };
    loss.tokens_dropped = context_before.saturating_sub(context_after);
    loss
}

/// The view of the previous call and the later recorded turns of a judgement
/// ([`compaction_loss`]): the events of the conversation before the compaction, and of the
/// later turns up to the next compaction of the main lane, the events whose references they
/// use (main-lane replies, prompts but a compaction's summary) and their re-reads.
struct Turns {
    view: Vec<usize>,
    uses: Vec<usize>,
    rereads: usize,
}

impl Turns {
    fn of(session: &ImportedSession, call_index: usize, previous: usize) -> Turns {
        // The conversation the previous call saw, read from the events of its view (the
        // messages `messages_for_call` builds of them, without building them).
        let view = session.reference_memo().view(session, previous);
        let mut read_before = BTreeSet::new();
        for event in view.iter().filter_map(|&i| session.recording.events.get(i)) {
            match &event.kind {
                EventKind::UserPrompt(UserPrompt { content: MessageContent::Blocks(blocks), .. }) => add_read_paths(blocks, &mut read_before),
                EventKind::ModelReply(reply) => add_read_paths(&reply.content, &mut read_before),
                _ => {}
            }
        }
        let mut uses = Vec::new();
        let mut rereads = 0;
        let start = session.calls[call_index].event_index;
        for (i, event) in session.recording.events.iter().enumerate().skip(start) {
            if event.lane != LANE_MAIN {
                continue;
            }
            match &event.kind {
                EventKind::Compaction(_) => break,
                EventKind::ModelReply(reply) => {
                    uses.push(i);
                    for block in &reply.content {
                        if let ContentBlock::ToolUse { name, input, .. } = block
                            && name == "Read"
                            && reads_again(input, &read_before)
                        {
                            rereads += 1;
                        }
                    }
                }
                EventKind::UserPrompt(prompt) if !prompt.is_compact_summary => uses.push(i),
                _ => {}
            }
        }
        Turns { view, uses, rereads }
    }
}

/// [`compaction_loss`] but its `tokens_dropped` (0), judged in full without its memo; `long`
/// holds the xxh3-128 of each text of `after` of [`MEMOIZED_TEXT`] bytes or more, in order
/// ([`LossKey::of`]).
fn references_lost(session: &ImportedSession, call_index: usize, previous: usize, after: &[Message], long: &[u128]) -> CompactionLoss {
    let memo = session.reference_memo();
    let Turns { view, uses, rereads } = Turns::of(session, call_index, previous);
    // Each event's references from the memo.
    let before_numbers: Vec<Cow<[u32]>> = view.iter().map(|&i| memo.event(session, i, false)).collect();
    // What later recorded turns use: a reply's tool inputs, a prompt's references (those it
    // holds).
    let used_numbers: Vec<Cow<[u32]>> =
        uses.iter().map(|&i| memo.event(session, i, matches!(session.recording.events[i].kind, EventKind::ModelReply(_)))).collect();
    // The references `after` holds: long texts' from the memo (numbered before the names are
    // read below), short ones scanned.
    let mut keys = long.iter();
    let mut long: Vec<Arc<[u32]>> = Vec::new();
    let mut short: Vec<&str> = Vec::new();
    each_message_text(after, &mut |text, _| {
        if text.len() >= MEMOIZED_TEXT {
            let key = keys.next().copied().unwrap_or_else(|| xxhash_rust::xxh3::xxh3_128(text.as_bytes()));
            long.push(memo.text_numbers(text, key));
        } else {
            short.push(text);
        }
    });
    let names = memo.names.read().unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut before = Bits::new(names.names.len());
    for &n in before_numbers.iter().flat_map(|ns| ns.iter()) {
        before.insert(n);
    }
    // Those `after` holds too (a reference no event holds is not one of them).
    let mut kept = Bits::new(names.names.len());
    for &n in long.iter().flat_map(|ns| ns.iter()) {
        if before.contains(n) {
            kept.insert(n);
        }
    }
    for text in short {
        each_reference(text, &mut |r| {
            if let Some(&n) = names.ids.get(r.as_ref())
                && before.contains(n)
            {
                kept.insert(n);
            }
        });
    }
    let mut used = Bits::new(names.names.len());
    for &n in used_numbers.iter().flat_map(|ns| ns.iter()) {
        used.insert(n);
    }
    let mut references_dropped = 0;
    // Sorted: the first lost ones are shown.
    let mut lost: Vec<&str> = Vec::new();
    for (word, (b, k)) in before.0.iter().zip(&kept.0).enumerate() {
        let mut dropped = b & !k;
        references_dropped += dropped.count_ones() as usize;
        let u = used.0[word];
        dropped &= u;
        while dropped != 0 {
            let bit = dropped.trailing_zeros();
            lost.push(&names.names[word * 64 + bit as usize]);
            dropped &= dropped - 1;
        }
    }
    lost.sort_unstable();
    CompactionLoss {
        call: session.calls[call_index].index,
        tokens_dropped: 0,
        references_dropped,
        references_lost: lost.len(),
        lost: lost.iter().take(SHOWN_REFERENCES).map(|r| (*r).to_owned()).collect(),
        rereads,
    }
}

/// [`references_lost`]'s counts ([`Judgement::Counts`]): the references later turns use that
/// the conversation before held, less those `after` holds, in the numbers of [`UsedNames`].
fn references_counted(session: &ImportedSession, call_index: usize, previous: usize, after: &[Message], long: &[u128]) -> CompactionLoss {
    let memo = session.reference_memo();
    let names = memo.used_names(session);
    let Turns { view, uses, rereads } = Turns::of(session, call_index, previous);
    let mut used = Bits::new(names.ids.len());
    for &n in uses.iter().flat_map(|&i| names.used[i].iter()) {
        used.insert(n);
    }
    // Those the conversation before held (none to look for: no event's read).
    let mut lost = Bits::new(names.ids.len());
    if used.0.iter().any(|&w| w != 0) {
        for &n in view.iter().flat_map(|&i| memo.held_used(session, i, names).iter()) {
            if used.contains(n) {
                lost.insert(n);
            }
        }
    }
    // Less those `after` holds: long texts' from the memo, short ones scanned (none once
    // nothing is lost).
    let mut keys = long.iter();
    each_message_text(after, &mut |text, _| {
        if lost.0.iter().all(|&w| w == 0) {
            return;
        }
        if text.len() >= MEMOIZED_TEXT {
            let key = keys.next().copied().unwrap_or_else(|| xxhash_rust::xxh3::xxh3_128(text.as_bytes()));
            memo.text_used_numbers(text, key, names).iter().for_each(|&n| lost.remove(n));
        } else {
            each_reference(text, &mut |r| {
                if let Some(&n) = names.ids.get(r.as_ref()) {
                    lost.remove(n);
                }
            });
        }
    });
    CompactionLoss { call: session.calls[call_index].index, tokens_dropped: 0, references_dropped: 0, references_lost: lost.len(), lost: Vec::new(), rereads }
}

/// [`compaction_loss`] found by scanning every text each time, without the memo (what the
/// tests compare it with).
#[doc(hidden)]
pub fn compaction_loss_by_scan(
    session: &ImportedSession,
    call_index: usize,
    previous: usize,
    after: &[Message],
    context_before: u64,
    context_after: u64,
) -> CompactionLoss {
    // The conversation the previous call saw, read from the events of its view (the messages
    // `messages_for_call` builds of them, without building them).
    let view = session.view_event_indices(&session.calls[previous]);
    let events = || view.iter().filter_map(|&i| session.recording.events.get(i));
    let attachment_texts: Vec<String> = events()
        .filter_map(|e| match &e.kind {
            EventKind::Attachment(attachment) if !ATTACHMENTS_NOT_SENT.contains(&attachment.attachment_type.as_str()) => Some(attachment_text(attachment)),
            _ => None,
        })
        .collect();
    let mut before = RefSet::default();
    let mut read_before = BTreeSet::new();
    for event in events() {
        match &event.kind {
            EventKind::UserPrompt(prompt) => {
                content_references(&prompt.content, &mut before);
                if let MessageContent::Blocks(blocks) = &prompt.content {
                    add_read_paths(blocks, &mut read_before);
                }
            }
            EventKind::ToolResult(result) => match &result.content {
                Some(ToolResultContent::Text(text)) => each_reference(text, &mut |r| {
                    before.insert(r);
                }),
                Some(ToolResultContent::Blocks(blocks)) => blocks.iter().for_each(|b| block_references(b, &mut before)),
                None => {}
            },
            EventKind::ModelReply(reply) => {
                reply.content.iter().for_each(|b| block_references(b, &mut before));
                add_read_paths(&reply.content, &mut read_before);
            }
            _ => {}
        }
    }
    for text in &attachment_texts {
        each_reference(text, &mut |r| {
            before.insert(r);
        });
    }
    let kept = borrowed_references(after);
    // Sorted: the first lost ones are shown.
    let dropped: BTreeSet<&str> = before.difference(&kept).map(AsRef::as_ref).collect();
    // What later recorded turns use, up to the next compaction of the main lane.
    let mut used = RefSet::default();
    let mut rereads = 0;
    let start = session.calls[call_index].event_index;
    for event in session.recording.events.iter().skip(start) {
        if event.lane != LANE_MAIN {
            continue;
        }
        match &event.kind {
            EventKind::Compaction(_) => break,
            EventKind::ModelReply(reply) => {
                for block in &reply.content {
                    if let ContentBlock::ToolUse { name, input, .. } = block {
                        value_references(input, &mut used);
                        if name == "Read" && reads_again(input, &read_before) {
                            rereads += 1;
                        }
                    }
                }
            }
            EventKind::UserPrompt(prompt) if !prompt.is_compact_summary => {
                match &prompt.content {
                    MessageContent::Text(text) => each_reference(text, &mut |r| {
                        used.insert(r);
                    }),
                    MessageContent::Blocks(blocks) => blocks.iter().for_each(|b| block_references(b, &mut used)),
                }
            }
            _ => {}
        }
    }
    let lost: Vec<String> = dropped.iter().filter(|r| used.contains(**r)).map(|r| (*r).to_owned()).collect();
    CompactionLoss {
        call: session.calls[call_index].index,
        tokens_dropped: context_before.saturating_sub(context_after),
        references_dropped: dropped.len(),
        references_lost: lost.len(),
        lost: lost.iter().take(SHOWN_REFERENCES).cloned().collect(),
        rereads,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The scan by characters [`each_reference`] must equal.
    fn by_chars(text: &str) -> Vec<Cow<'_, str>> {
        let mut out = Vec::new();
        for token in text.split(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-'))) {
            reference_of(token, &mut |r| out.push(r));
        }
        out
    }

    fn by_bytes(text: &str) -> Vec<Cow<'_, str>> {
        let mut out = Vec::new();
        each_reference(text, &mut |r| out.push(r));
        out
    }

    #[test]
    fn references_split_at_multibyte_characters() {
        let text = "é src/a.rs→parse_line… «camelCase» ./x/ --flag-name--- 12/3 é/ab ñsnake_caseñ";
        assert_eq!(by_bytes(text), vec!["src/a.rs", "parse_line", "camelCase", "snake_case"]);
        assert_eq!(by_bytes(text), by_chars(text));
    }

    #[test]
    fn a_windows_drive_path_is_one_reference_in_either_spelling() {
        let text = r#"Read D:\omp\src\Git.go, then d:/omp/src/git.go: ok. "C:\Users\me\x.txt"."#;
        assert_eq!(by_bytes(text), vec!["/d/omp/src/git.go", "/d/omp/src/git.go", "/c/users/me/x.txt"]);
        // A POSIX session's escapes and a lone drive letter make no path.
        // (`\n` ends a token, as before.)
        assert_eq!(by_bytes(r"print(a\nparse_line) e:\ x:/ s:\nparse src\main_file.rs"), vec!["nparse_line"]);
    }

    #[test]
    fn words_without_a_path_or_identifier_mark_are_no_references() {
        let text = "the and for Build build.rs --camelCase-- .snake_case. aB Ab ABc xY.z src/ 12/3 lower-Upper x.Yz";
        assert_eq!(by_bytes(text), by_chars(text));
        assert_eq!(by_bytes(text), vec!["camelCase", "snake_case", "src"]);
    }

    proptest! {
        #[test]
        fn the_byte_scan_finds_what_the_character_scan_does(text in "[a-zA-Z0-9_./ é→\\-]{0,60}") {
            prop_assert_eq!(by_bytes(&text), by_chars(&text));
        }

        #[test]
        fn the_marks_of_a_chunk_are_those_of_its_bytes(chunk in any::<[u8; CHUNK]>(), letters in prop::array::uniform16(prop::sample::select(b"aAzZ@[`{/_:.09 \x80\xE1\xFA".to_vec())), after_lower in any::<bool>()) {
            for chunk in [chunk, letters] {
                let by_words = chunk_marks_by_words(&chunk, after_lower);
                prop_assert_eq!(chunk_marks(&chunk, after_lower), by_words);
                // The marks by the characters' classes.
                let mut previous_lower = after_lower;
                for (i, &b) in chunk.iter().enumerate() {
                    let mark = matches!(b, b'/' | b'_' | b':') || (previous_lower && b.is_ascii_uppercase());
                    prop_assert_eq!(by_words.0 >> i & 1 != 0, mark);
                    previous_lower = b.is_ascii_lowercase();
                }
                prop_assert_eq!(by_words.1, previous_lower);
            }
        }

        #[test]
        fn the_scan_by_marks_finds_what_the_byte_scan_does(text in "[a-zA-Z0-9_./:\\\\ é→\\-]{0,80}") {
            let mut marked = Vec::new();
            each_marked_reference(&text, &mut |r| marked.push(r));
            let mut every = Vec::new();
            each_reference_by_bytes(&text, &mut |r| every.push(r));
            prop_assert_eq!(marked, every);
        }
    }
}
