//! The `bpe` count: tiktoken-rs `o200k_base`, with its pre-tokenizing split run by a DFA.
//!
//! tiktoken splits a text into pieces with one regular expression, then byte-pair-encodes each
//! piece that is not itself a token. Its `o200k_base` expression has one look-ahead,
//! `\s+(?!\S)`, so tiktoken-rs runs the whole expression in fancy-regex's backtracking VM,
//! which is about 70% of its encoding time. Counting here gives exactly
//! `o200k_base_singleton().encode_ordinary(text).len()` (tests compare the two on every text of
//! `realdata/` and on generated text) at several times the speed:
//!
//! - **Split.** The alternatives run as the patterns of one regex-automata lazy DFA, searched
//!   forward from each piece's start, anchored, leftmost-first (so the first alternative that
//!   matches wins, as in the backtracking VM); the match names its pattern. The sixth and
//!   seventh alternatives, `\s+(?!\S)` and `\s+`, are one pattern `\s+`, and its look-ahead is
//!   applied to the match:
//!   the pattern takes the whole whitespace run (the fifth alternative has already taken any
//!   run holding a line break); when text follows the run, the look-ahead would have given the
//!   last whitespace character back, so a run of two or more characters loses its last one
//!   (a single character stays: that is the seventh alternative).
//! - **ASCII by hand.** Most text is ASCII, where every class of the expression is a byte
//!   test: [`scan_ascii`] matches the alternatives in order from a piece's start as the
//!   backtracking VM would, and hands the piece to the DFA whenever a byte it must look at is
//!   not ASCII (a letter, mark, digit, symbol or space outside ASCII may continue a run; `ſ`
//!   folds to the `s` of `'s`). Tests compare its pieces with the DFA's on generated text;
//!   the counts are compared with tiktoken-rs's on every real text. The DFA's search, with its
//!   setup per piece, was about a quarter of a cold audit's instructions. The scan tells bytes
//!   apart by a table of their classes ([`CLASS`]) and reads a run of lowercase letters eight
//!   bytes at a time ([`lower_run`]); debug builds check every piece against the same scan a
//!   byte at a time by comparisons ([`scan_ascii_bytewise`]).
//! - **Merge.** A piece that is a token counts one; any other piece is merged as tiktoken
//!   merges a piece under 100 bytes (`byte_pair_split`): start from its bytes, and while some
//!   two neighbouring parts together are a token, join the pair of lowest rank, the leftmost
//!   of equal ones; the count is the parts left ([`O200k::merged_parts`], our own code over
//!   our own tables). build.rs reads tiktoken-rs's ranks at build time and writes them as two
//!   tables: the tokens of at most 15 bytes as a hash table by their packed value (below),
//!   read in place from the executable ([`ShortRanks`]: nothing to build at run time, only the
//!   pages a lookup touches are read in), and every token, whose longer ones are loaded here
//!   into a map by their bytes (about 3,000), where building tiktoken-rs's encoder takes
//!   about 170 ms. tiktoken-rs switches to a heap-based
//!   merge, with the same result, for pieces of 100 bytes or more. Here the quadratic merge
//!   serves pieces under 128 bytes, and a heap finds the pair to join in longer ones, up to
//!   1 KiB ([`O200k::merge_long`], checked against the quadratic merge in debug builds); tested
//!   properties hold both to tiktoken-rs's count. A text with a longer piece (a long rule of
//!   dashes, a run of spaces) is counted by tiktoken-rs itself, whose encoder is then built
//!   once.
//! - **Short pieces by value.** A piece of at most 15 bytes is looked up as one `u128` (its
//!   bytes and its length), not as a byte string: whether it is a token, and, in a memo of the
//!   thread's ([`ThreadCaches`]), the count of each short piece that is not one, which is
//!   merged by that value too, its parts cut out of it ([`O200k::merge_short`]). A piece's
//!   count never changes, so that memo is a pure cache, capped in size.
//! - **Long pieces merged once per thread.** A thread keeps the counts of the long pieces it
//!   merged by their xxh3-128 ([`ThreadCaches`]): rules of `=` or `-` and runs of spaces recur
//!   in many texts, and each took thousands of instructions to merge.
//! - **Recent pieces first.** Before those tables (200k entries, several megabytes: most
//!   lookups missed the processor's caches), a short piece is looked up in a small
//!   direct-mapped table of the pieces this thread counted lately ([`Recent`], 8,192 slots,
//!   128 KB): a text's common pieces (` the`, `\n   `, `fn`) are found there. A slot holds one
//!   piece and its count, overwritten by the next piece hashed to it; a count never changes, so
//!   what the table holds changes only the speed, never a count.
//! - **Long texts in chunks.** A text of 4 KiB or more is cut, only where the split always
//!   has a boundary ([`cuts_at`]), into chunks the text around each cut picks
//!   ([`chunk_ends`]), and its count is the sum of theirs, each looked up first in a table of
//!   the chunks the process counted ([`CHUNKS`]): the system prompts of the what-ifs of a
//!   session, and a file read again after an edit, are tokenized where they differ. A long
//!   line is cut after a word instead ([`cuts_at_word`]): the replay's fillers, one line of
//!   the same few words repeated, each tens of kilobytes, were a quarter of the bytes
//!   tokenized in a cold audit; cut so, their chunks repeat and are tokenized once.
//! - **Built in the background.** The split DFA and the long tokens' map, on a thread of their
//!   own when a command warms the tokenizer up ([`warm_up_in_background`]).

use regex_automata::hybrid::dfa::{Cache, DFA};
use regex_automata::{Anchored, Input};
use rustc_hash::FxHashMap;
use std::cell::RefCell;
use std::sync::LazyLock;
use tiktoken_rs::{CoreBPE, Rank};

/// The alternatives of tiktoken-rs's `O200K_BASE_PAT_STR`, in order, the look-ahead
/// alternative merged with the last (see the module documentation).
const PATTERNS: [&str; 6] = [
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}",
    r" ?[^\s\p{L}\p{N}]+[\r\n/]*",
    r"\s*[\r\n]+",
    r"\s+",
];
/// The pattern whose match gets the look-ahead of `\s+(?!\S)`.
const WHITESPACE_RUN: usize = 5;
/// From this piece length on, a text is counted by tiktoken-rs, whose merge for long pieces is
/// linear ([`O200k::merged_parts`]'s is quadratic in the worst case).
const LONG_PIECE: usize = 1024;

/// The number of ordinary tokens of o200k_base, ranked densely from 0 (the special tokens come
/// after them).
const O200K_ORDINARY_TOKENS: Rank = 199_998;
/// Pieces up to this length are handled as a packed `u128`.
const SHORT_PIECE: usize = 15;
/// Pieces shorter than this are merged in buffers on the stack ([`O200k::merged_parts`]).
const STACK_MERGE: usize = 128;
/// Texts of at least this many bytes are counted chunk by chunk ([`chunk_ends`]).
const CHUNKED_TEXT: usize = 4096;
/// A chunk (but a text's last) holds at least this many bytes.
const CHUNK_MIN: usize = 512;
/// At most this many chunk counts are kept per thread ([`ThreadCaches`]).
const CHUNK_MEMO_CAP: usize = 1 << 16;

struct O200k {
    split: DFA,
    /// The ranks of the tokens of at most [`SHORT_PIECE`] bytes, by their packed value.
    short_ranks: ShortRanks,
    /// The ranks of the longer tokens, by their bytes (build.rs's table, borrowed).
    long_ranks: FxHashMap<&'static [u8], Rank>,
}

static O200K: LazyLock<O200k> = LazyLock::new(O200k::new);

#[path = "o200k_short.rs"]
mod short_layout;

/// build.rs's table of the tokens of at most [`SHORT_PIECE`] bytes and their ranks, by their
/// packed value ([`pack`]), read in place (layout: `o200k_short.rs`).
static SHORT_TABLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/o200k.short"));

/// The ranks of the short tokens: [`SHORT_TABLE`] looked up as the hash table it is.
struct ShortRanks(&'static [[u8; short_layout::SLOT_BYTES]; short_layout::SLOTS]);

impl ShortRanks {
    /// The rank of the token packed as `packed`, if it is one: probed from its slot on to the
    /// first that holds it or is empty.
    #[inline]
    fn get(&self, packed: u128) -> Option<Rank> {
        use short_layout::{SLOTS, slot};
        // An empty piece packs to 0, the key of an empty slot: no token.
        if packed == 0 {
            return None;
        }
        let mut at = slot(packed);
        // At most every slot once (the table is about a third full: a lookup reads one or two).
        for _ in 0..SLOTS {
            let [key @ .., r0, r1, r2, r3] = self.0[at & (SLOTS - 1)];
            let key = u128::from_le_bytes(key);
            if key == packed {
                return Some(Rank::from_le_bytes([r0, r1, r2, r3]));
            }
            if key == 0 {
                return None;
            }
            at += 1;
        }
        None
    }

    #[inline]
    fn contains_key(&self, packed: u128) -> bool {
        self.get(packed).is_some()
    }

    /// The tokens in the table (reads all of it).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.iter().filter(|entry| entry[..16] != [0u8; 16]).count()
    }
}

thread_local! {
    /// The lazy DFA's states, built as texts need them, like the regex caches tiktoken-rs keeps
    /// per thread, and the thread's memos of pieces ([`ThreadCaches`]).
    static SPLIT_CACHE: RefCell<ThreadCaches> = RefCell::new(ThreadCaches {
        split: O200K.split.create_cache(),
        recent: Recent::new(),
        short_pieces: FxHashMap::default(),
        long_pieces: FxHashMap::default(),
    });
}

/// The counts of the chunks of long texts ([`chunk_ends`]) by their xxh3-128, shared by the
/// process's threads (the sessions of one project, on different threads, send the same system
/// prompt and files), emptied when [`CHUNK_MEMO_CAP`] are held. A count never changes, so what
/// it holds changes only the speed.
static CHUNKS: LazyLock<std::sync::Mutex<FxHashMap<u128, u32>>> = LazyLock::new(Default::default);

/// A thread's caches: the split DFA's states, [`Recent`], and the counts of the pieces that are
/// not tokens: the short ones (at most [`SHORT_PIECE`] bytes) by their packed value, emptied
/// when [`SHORT_MEMO_CAP`] are held, and the long ones by their xxh3-128, emptied when
/// [`LONG_MEMO_CAP`] are held. A short piece that [`Recent`] no longer holds is merged once per
/// thread, not once per counting run (an audit makes many). Long pieces are mostly rules of
/// one repeated character (a line of `=` or `-`, a run of spaces), the same ones in many
/// texts, and each costs thousands of instructions to merge. A count never changes, so what
/// the memos hold changes only the speed.
struct ThreadCaches {
    split: Cache,
    recent: Recent,
    short_pieces: FxHashMap<u128, u32>,
    long_pieces: FxHashMap<u128, u32>,
}

/// At most this many short pieces' counts are kept per thread ([`ThreadCaches`]).
const SHORT_MEMO_CAP: usize = 1 << 16;
/// At most this many long pieces' counts are kept per thread ([`ThreadCaches`]).
const LONG_MEMO_CAP: usize = 1 << 12;

/// log2 of [`Recent`]'s slots.
const RECENT_BITS: u32 = 13;

/// The short pieces a thread counted lately, direct-mapped by a hash of the packed piece: a
/// piece's slot holds it and its count until another piece hashed to the same slot replaces
/// it. An empty slot holds 0, which no piece packs to (a piece has at least one byte, and its
/// length is in the packed value). A short piece has at most 15 bytes and so at most 15
/// tokens: a slot holds the count in the top four bits of the packed value, above the length
/// (at most 15, in the low four bits of the last byte), so that one load reads both.
struct Recent {
    slots: Box<[u128; 1 << RECENT_BITS]>,
}

/// Where [`Recent`] keeps a count in a slot.
const RECENT_COUNT_SHIFT: u32 = 124;

impl Recent {
    fn new() -> Recent {
        let slots = vec![0u128; 1 << RECENT_BITS].into_boxed_slice().try_into();
        Recent { slots: slots.expect("a boxed slice of the table's length") }
    }

    fn slot(packed: u128) -> usize {
        let mixed = (packed as u64) ^ ((packed >> 64) as u64).rotate_left(29);
        (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - RECENT_BITS)) as usize
    }

    /// The count of the piece packed as `packed` if its slot holds it: compared as two
    /// 64-bit halves, the count's four bits shifted out of the upper one (a `u128` compare
    /// under a mask took twice the instructions).
    #[inline]
    fn get(&self, slot: usize, packed: u128) -> Option<u32> {
        let held = self.slots[slot];
        let (held_lo, held_hi) = (held as u64, (held >> 64) as u64);
        let (lo, hi) = (packed as u64, (packed >> 64) as u64);
        const COUNT_SHIFT: u32 = RECENT_COUNT_SHIFT - 64;
        (held_lo == lo && (held_hi ^ hi) << (64 - COUNT_SHIFT) == 0).then_some((held_hi >> COUNT_SHIFT) as u32)
    }

    /// Keeps the piece packed as `packed` (at most [`SHORT_PIECE`] bytes) and its count `n` in
    /// its slot.
    #[inline]
    fn set(&mut self, slot: usize, packed: u128, n: u32) {
        debug_assert!(n as usize <= SHORT_PIECE && packed >> RECENT_COUNT_SHIFT == 0, "at most one token per byte");
        self.slots[slot] = packed | (u128::from(n) << RECENT_COUNT_SHIFT);
    }
}

/// A piece of at most [`SHORT_PIECE`] bytes as one value: its bytes, zero-padded, and its
/// length in the last byte (so two pieces pack equal only when they are equal).
fn pack(piece: &[u8]) -> Option<u128> {
    if piece.len() > SHORT_PIECE {
        return None;
    }
    let mut buf = [0u8; 16];
    buf[..piece.len()].copy_from_slice(piece);
    buf[15] = piece.len() as u8;
    Some(u128::from_le_bytes(buf))
}

/// `bytes[at..end]` packed as [`pack`] packs it, read as two unaligned 8-byte loads masked to
/// the piece when 16 bytes from `at` are in `bytes` (no copy through a buffer on the stack,
/// whose store the load after it would wait for; as one 16-byte load, the halves took a
/// vector register's shuffles to come out).
#[inline]
fn pack_in(bytes: &[u8], at: usize, end: usize) -> Option<u128> {
    let len = end - at;
    if len > SHORT_PIECE {
        return None;
    }
    match bytes.get(at..).and_then(<[u8]>::first_chunk::<16>) {
        Some(chunk) => {
            let (lo, hi) = chunk.split_at(8);
            let [lo_mask, hi_mask] = PIECE_MASKS[len];
            let lo = u64::from_le_bytes(lo.try_into().unwrap_or_default()) & lo_mask;
            let hi = (u64::from_le_bytes(hi.try_into().unwrap_or_default()) & hi_mask) | ((len as u64) << 56);
            Some(u128::from(lo) | (u128::from(hi) << 64))
        }
        None => pack(&bytes[at..end]),
    }
}

/// The mask of a piece's bytes in a packed value, by the piece's length, as its lower and
/// upper 64 bits (a table: a shift by a variable amount takes several instructions).
static PIECE_MASKS: [[u64; 2]; SHORT_PIECE + 1] = {
    let mut masks = [[0u64; 2]; SHORT_PIECE + 1];
    let mut len = 0;
    while len <= SHORT_PIECE {
        let mask = (1u128 << (8 * len)) - 1;
        masks[len] = [mask as u64, (mask >> 64) as u64];
        len += 1;
    }
    masks
};

/// What the hand-written scan found at a piece's start: the piece's end, or that the piece
/// needs the DFA (its start, or a character the scan had to look at, is not ASCII).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    End(usize),
    NotAscii,
}

/// The end of `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` from `at`: `at` itself when none follows.
/// `Err` when a byte it had to look at is not ASCII (case folding maps `ſ` to `s`).
#[inline(always)]
fn contraction_end(bytes: &[u8], at: usize) -> Result<usize, ()> {
    if bytes.get(at) != Some(&b'\'') {
        return Ok(at);
    }
    let lower = |k: usize| -> Result<Option<u8>, ()> {
        match bytes.get(at + k) {
            Some(&b) if b >= 0x80 => Err(()),
            Some(&b) => Ok(Some(b.to_ascii_lowercase())),
            None => Ok(None),
        }
    };
    Ok(match lower(1)? {
        Some(b's' | b't' | b'm' | b'd') => at + 2,
        Some(b'r' | b'v') if lower(2)? == Some(b'e') => at + 3,
        Some(b'l') if lower(2)? == Some(b'l') => at + 3,
        _ => at,
    })
}

/// The end of the piece of o200k's split starting at `at` (`at < bytes.len()`), found by hand
/// on ASCII text: the alternatives of [`PATTERNS`] in order, each as the backtracking VM
/// would match it, the look-ahead of the whitespace run included. Whenever the answer could
/// depend on a character that is not ASCII (a letter, digit, mark, symbol or whitespace
/// outside ASCII continuing a run), [`Scan::NotAscii`]: the DFA splits that piece. Bytes are
/// told apart by their [`CLASS`], runs of lowercase letters eight at a time ([`lower_run`]);
/// debug builds check each piece against [`scan_ascii_bytewise`]. A piece it leaves may be
/// one of the few next to `→` that [`scan_arrow`] knows.
#[inline(always)]
fn scan_ascii(bytes: &[u8], at: usize) -> Scan {
    let scan = scan_ascii_inner(bytes, at).map_or(Scan::NotAscii, Scan::End);
    debug_assert_eq!(scan, scan_ascii_bytewise(bytes, at), "the class scan splits as the bytewise one at {at}");
    match scan {
        Scan::NotAscii => scan_arrow(bytes, at),
        scan => scan,
    }
}

/// `→` (U+2192, a math symbol: `[^\s\p{L}\p{N}]`) in UTF-8. Claude Code's Read tool puts it
/// after the number of each line of a file it returns (`    12→`): the line's number and
/// the arrow with what follows it were most of the pieces [`scan_ascii`] left to the DFA
/// (60,000 of 70,000 in an audit of the 16).
const ARROW: [u8; 3] = [0xE2, 0x86, 0x92];

/// The end of the piece from `at` when it is one of the commonest that [`scan_ascii_inner`]
/// leaves, told apart as the backtracking VM would match them; else [`Scan::NotAscii`]:
/// - one or two ASCII digits before `→`: the third alternative, which `→` (no digit) ends;
/// - `→` before an ASCII letter: the optional other character of the first two
///   alternatives, and the letters after it, which end where they would without it;
/// - `→` before ASCII that is no letter, or the end: the fourth alternative, `→` and the
///   ASCII symbols after it (a byte that is not ASCII may continue them), then line breaks
///   and slashes.
///
/// Not inlined: in [`O200k::count_whole`]'s loop, it would take registers from the path of
/// every piece.
#[inline(never)]
fn scan_arrow(bytes: &[u8], at: usize) -> Scan {
    let arrow_at = |at: usize| bytes.get(at..at + ARROW.len()) == Some(&ARROW);
    let digits = bytes[at..].iter().take(2).take_while(|b| b.is_ascii_digit()).count();
    if digits > 0 {
        return if arrow_at(at + digits) { Scan::End(at + digits) } else { Scan::NotAscii };
    }
    if !arrow_at(at) {
        return Scan::NotAscii;
    }
    let after = at + ARROW.len();
    match class_at(bytes, after) {
        LOWER | UPPER => scan_ascii_inner(bytes, after).map_or(Scan::NotAscii, Scan::End),
        WIDE => Scan::NotAscii,
        _ => {
            let (mut end, next) = run(bytes, after, SYMBOL);
            if next == WIDE {
                return Scan::NotAscii;
            }
            while let Some(b'\r' | b'\n' | b'/') = bytes.get(end) {
                end += 1;
            }
            Scan::End(end)
        }
    }
}

#[inline(always)]
fn scan_ascii_inner(bytes: &[u8], at: usize) -> Result<usize, ()> {
    let first = CLASS[usize::from(bytes[at])];
    // 1 and 2: an optional other character (`[^\r\n\p{L}\p{N}]`), then letters, told
    // apart by the class of the first letter. (A first byte that is not ASCII is taken as the
    // letters' start, and is not ASCII there.)
    let letters = at + usize::from(first & (BLANK | SYMBOL) != 0);
    match class_at(bytes, letters) {
        // 1 with no upper-case letter, most pieces (` the`, `fn`, `.to`): the lower-case run
        // after the first letter, then a contraction.
        LOWER => return lower_word_end(bytes, letters + 1),
        UPPER => {
            let (upper_end, next) = run(bytes, letters + 1, UPPER);
            return match next {
                // 1: `[upper]+[lower]+`, then a contraction.
                LOWER => lower_word_end(bytes, upper_end),
                WIDE => Err(()),
                // 2: `[upper]+` (no lowercase follows), then a contraction.
                _ => contraction_end(bytes, upper_end),
            };
        }
        // A letter (or mark) outside ASCII may be where the letters start.
        WIDE => return Err(()),
        // No letters: the other alternatives.
        _ => {}
    }
    // 3: one to three digits.
    if first == DIGIT {
        let mut end = at + 1;
        while end < at + 3 {
            match class_at(bytes, end) {
                WIDE => return Err(()),
                DIGIT => end += 1,
                _ => break,
            }
        }
        return Ok(end);
    }
    // 4: an optional space, symbols, then line breaks and slashes.
    let symbols = if bytes[at] == b' ' { at + 1 } else { at };
    match class_at(bytes, symbols) {
        WIDE => return Err(()),
        SYMBOL => {
            let (mut end, next) = run(bytes, symbols, SYMBOL);
            if next == WIDE {
                return Err(());
            }
            while let Some(b'\r' | b'\n' | b'/') = bytes.get(end) {
                end += 1;
            }
            return Ok(end);
        }
        _ => {}
    }
    // 5 and 6: a whitespace run (`first` is whitespace here: every other ASCII byte has
    // matched above), and the end of its last line break.
    let (mut run, mut after_break) = (at, None);
    loop {
        match class_at(bytes, run) {
            BLANK => run += 1,
            BREAK => {
                run += 1;
                after_break = Some(run);
            }
            WIDE => return Err(()),
            _ => break,
        }
    }
    // 5: `\s*[\r\n]+`: through the last line break of the run.
    if let Some(end) = after_break {
        return Ok(end);
    }
    // 6: `\s+(?!\S)`, else `\s+`: the run less its last character when text follows it.
    if run < bytes.len() && run - at > 1 { Ok(run - 1) } else { Ok(run) }
}

/// The end of the first alternative's word whose lower-case run goes on from `at`
/// (`at <= bytes.len()`): the run, then a contraction. `Err` when a byte it had to look at is
/// not ASCII. The byte that ends the run comes from the run's scan, so that the usual ends, a
/// byte that is neither an apostrophe nor outside ASCII, are told by it alone.
#[inline(always)]
fn lower_word_end(bytes: &[u8], at: usize) -> Result<usize, ()> {
    match lower_run(bytes, at) {
        (_, 0x80..) => Err(()),
        (end, b'\'') => contraction_end(bytes, end),
        (end, _) => Ok(end),
    }
}

/// The byte classes [`scan_ascii`] tells apart, one bit each ([`CLASS`]); the end of the text
/// has none (class 0), and ends every run.
const LOWER: u8 = 1;
const UPPER: u8 = 2;
const DIGIT: u8 = 4;
/// `\s` but a line break: tab, vertical tab, form feed, space.
const BLANK: u8 = 8;
/// A line break: `\r`, `\n`.
const BREAK: u8 = 16;
/// `[^\s\p{L}\p{N}]` on ASCII: punctuation, symbols and the control characters that are not
/// whitespace.
const SYMBOL: u8 = 32;
/// Not ASCII: a byte of a character the scan leaves to the DFA.
const WIDE: u8 = 64;

/// The class of each byte value.
static CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = match byte {
            0x80.. => WIDE,
            b'a'..=b'z' => LOWER,
            b'A'..=b'Z' => UPPER,
            b'0'..=b'9' => DIGIT,
            b'\r' | b'\n' => BREAK,
            b'\t' | 0x0B | 0x0C | b' ' => BLANK,
            _ => SYMBOL,
        };
        b += 1;
    }
    table
};

/// The class of `bytes[at]`, 0 past the end.
#[inline(always)]
fn class_at(bytes: &[u8], at: usize) -> u8 {
    bytes.get(at).map_or(0, |&b| CLASS[usize::from(b)])
}

/// The end of the run of bytes from `at` of the classes `members`, and the class of the byte
/// that ends it (0 at the end of the text).
#[inline(always)]
fn run(bytes: &[u8], mut at: usize, members: u8) -> (usize, u8) {
    while let Some(&b) = bytes.get(at) {
        let class = CLASS[usize::from(b)];
        if class & members == 0 {
            return (at, class);
        }
        at += 1;
    }
    (at, 0)
}

/// The end of the run of lowercase letters from `at` (`at <= bytes.len()`) and the byte that
/// ends it (0 at the end of the text, which is neither an apostrophe nor outside ASCII, all
/// its callers ask of it), eight bytes at a time while eight are left: a word's letters are
/// most of what the scan reads. The stopping byte is shifted out of the eight read (not read
/// again), and the rest of the text is a slice that shrinks (one test of its length a word).
#[inline(always)]
fn lower_run(bytes: &[u8], at: usize) -> (usize, u8) {
    let mut rest = &bytes[at..];
    let mut end = at;
    while let Some((word, tail)) = rest.split_first_chunk::<8>() {
        let word = u64::from_le_bytes(*word);
        let others = !lower_bytes(word) & HIGH_BITS;
        if others != 0 {
            let stop = others.trailing_zeros();
            return (end + stop as usize / 8, (word >> (stop & 56)) as u8);
        }
        end += 8;
        rest = tail;
    }
    for &b in rest {
        if !b.is_ascii_lowercase() {
            return (end, b);
        }
        end += 1;
    }
    (end, 0)
}

/// The high bit of every byte.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;
/// The low bit of every byte.
const LOW_BITS: u64 = 0x0101_0101_0101_0101;

/// The high bit set in each byte of `word` (little-endian: its first byte lowest) that is an
/// ASCII lowercase letter, exact up to the first byte that is not one (the lowest clear high
/// bit), which is all [`lower_run`] reads. For an ASCII byte `b`, `b + 0x1f` has its high bit
/// set when `b >= b'a'` and `b + 0x05` when `b > b'z'`, neither carrying into the next byte; a
/// byte that is not ASCII has its own high bit set, so it is not a letter, and the carry it
/// may make only reaches the bytes after it.
#[inline(always)]
fn lower_bytes(word: u64) -> u64 {
    let from_a = word.wrapping_add(0x1f * LOW_BITS);
    let past_z = word.wrapping_add(0x05 * LOW_BITS);
    from_a & !past_z & !word & HIGH_BITS
}

/// `[^\r\n\p{L}\p{N}]` on an ASCII byte: neither a line break, a letter nor a digit.
fn is_other(b: u8) -> bool {
    !(b == b'\r' || b == b'\n' || b.is_ascii_alphanumeric())
}

/// `\s` on an ASCII byte: tab, line feed, vertical tab, form feed, carriage return, space.
fn is_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | 0x0B | 0x0C | b'\r' | b' ')
}

/// `[^\s\p{L}\p{N}]` on an ASCII byte: punctuation, symbols and the control characters that
/// are not whitespace.
fn is_symbol(b: u8) -> bool {
    !(is_space(b) || b.is_ascii_alphanumeric())
}

/// The end of the run of bytes from `at` that `class` holds, or [`Scan::NotAscii`] when the
/// run stops at a byte that is not ASCII (a character that may continue it).
fn run_end(bytes: &[u8], mut at: usize, class: fn(u8) -> bool) -> Result<usize, ()> {
    while let Some(&b) = bytes.get(at) {
        if b >= 0x80 {
            return Err(());
        }
        if !class(b) {
            break;
        }
        at += 1;
    }
    Ok(at)
}

/// [`scan_ascii`] a byte at a time, each byte tested by comparisons: the reference the
/// class table and the word-at-a-time runs are checked against (debug builds, tests). The end
/// of the piece of o200k's split starting at `at` (`at < bytes.len()`), found by hand on ASCII
/// text: the alternatives of [`PATTERNS`] in order, each as the backtracking VM
/// would match it, the look-ahead of the whitespace run included. Whenever the answer could
/// depend on a character that is not ASCII (a letter, digit, mark, symbol or whitespace
/// outside ASCII continuing a run), [`Scan::NotAscii`]: the DFA splits that piece.
fn scan_ascii_bytewise(bytes: &[u8], at: usize) -> Scan {
    scan_ascii_bytewise_inner(bytes, at).map_or(Scan::NotAscii, Scan::End)
}

fn scan_ascii_bytewise_inner(bytes: &[u8], at: usize) -> Result<usize, ()> {
    let first = bytes[at];
    if first >= 0x80 {
        return Err(());
    }
    // 1 and 2: an optional other character, then letters.
    let letters = if is_other(first) { at + 1 } else { at };
    let upper_end = run_end(bytes, letters, |b| b.is_ascii_uppercase())?;
    match bytes.get(upper_end) {
        Some(&b) if b >= 0x80 => return Err(()),
        Some(b) if b.is_ascii_lowercase() => {
            // 1: `[upper]*[lower]+`, then a contraction.
            let lower_end = run_end(bytes, upper_end, |b| b.is_ascii_lowercase())?;
            return contraction_end(bytes, lower_end);
        }
        // 2: `[upper]+[lower]*` (no lowercase follows), then a contraction.
        _ if upper_end > letters => return contraction_end(bytes, upper_end),
        _ => {}
    }
    // 3: one to three digits.
    if first.is_ascii_digit() {
        let mut end = at + 1;
        while end < at + 3 {
            match bytes.get(end) {
                Some(&b) if b >= 0x80 => return Err(()),
                Some(b) if b.is_ascii_digit() => end += 1,
                _ => break,
            }
        }
        return Ok(end);
    }
    // 4: an optional space, symbols, then line breaks and slashes.
    let symbols = if first == b' ' { at + 1 } else { at };
    match bytes.get(symbols) {
        Some(&b) if b >= 0x80 => return Err(()),
        Some(&b) if is_symbol(b) => {
            let end = run_end(bytes, symbols, is_symbol)?;
            let mut end = end;
            while let Some(b'\r' | b'\n' | b'/') = bytes.get(end) {
                end += 1;
            }
            return Ok(end);
        }
        _ => {}
    }
    // 5 and 6: a whitespace run (`first` is whitespace here: every other ASCII byte has
    // matched above).
    let run = run_end(bytes, at, is_space)?;
    // 5: `\s*[\r\n]+`: through the last line break of the run.
    if let Some(last) = bytes[at..run].iter().rposition(|&b| b == b'\r' || b == b'\n') {
        return Ok(at + last + 1);
    }
    // 6: `\s+(?!\S)`, else `\s+`: the run less its last character when text follows it.
    if run < bytes.len() && run - at > 1 { Ok(run - 1) } else { Ok(run) }
}

/// The o200k vocabulary as build.rs wrote it from tiktoken-rs: per ordinary token in rank
/// order, a little-endian `u16` length and the bytes.
static TOKEN_TABLE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/o200k.tokens"));

impl O200k {
    fn new() -> O200k {
        let (slots, rest) = SHORT_TABLE.as_chunks::<{ short_layout::SLOT_BYTES }>();
        let slots = <&[_; short_layout::SLOTS]>::try_from(slots).ok().filter(|_| rest.is_empty());
        let slots = slots.expect("build.rs wrote the short tokens' table in the layout of o200k_short.rs");
        assert_eq!(Self::tokens().count(), O200K_ORDINARY_TOKENS as usize, "build.rs wrote the whole o200k vocabulary");
        O200k { split: Self::build_split(), short_ranks: ShortRanks(slots), long_ranks: Self::build_long_ranks() }
    }

    fn build_split() -> DFA {
        DFA::builder()
            .configure(DFA::config().cache_capacity(8 << 20))
            .build_many(&PATTERNS)
            .expect("the o200k split patterns compile")
    }

    /// build.rs's table, token by token in rank order, with the ranks.
    fn tokens() -> impl Iterator<Item = (&'static [u8], Rank)> {
        let mut rest = TOKEN_TABLE;
        let mut rank: Rank = 0;
        std::iter::from_fn(move || {
            let [lo, hi, tail @ ..] = rest else { return None };
            let len = usize::from(u16::from_le_bytes([*lo, *hi]));
            let (bytes, tail) = tail.split_at(len);
            rest = tail;
            rank += 1;
            Some((bytes, rank - 1))
        })
    }

    fn build_long_ranks() -> FxHashMap<&'static [u8], Rank> {
        Self::tokens().filter(|(bytes, _)| bytes.len() > SHORT_PIECE).collect()
    }

    /// The rank of the token `bytes`, if they are one.
    #[cfg(test)]
    fn rank(&self, bytes: &[u8]) -> Option<Rank> {
        match pack(bytes) {
            Some(packed) => self.short_ranks.get(packed),
            None => self.long_ranks.get(bytes).copied(),
        }
    }

    /// The rank of the token `bytes[at..end]`, if they are one.
    #[inline]
    fn rank_in(&self, bytes: &[u8], at: usize, end: usize) -> Option<Rank> {
        match pack_in(bytes, at, end) {
            Some(packed) => self.short_ranks.get(packed),
            None => self.long_ranks.get(&bytes[at..end]).copied(),
        }
    }

    /// The number of tokens the merge leaves of `piece` (as many as tiktoken-rs's
    /// `byte_pair_split(piece, ranks).len()`): from single bytes, the neighbouring pair whose
    /// join is the token of lowest rank (the leftmost of equal ranks) is joined until no pair
    /// joins to a token.
    ///
    /// The piece is `rest[..len]`; the bytes after it (the rest of its text) are only read
    /// past, to pack a part with one load ([`pack_in`]).
    fn merged_parts(&self, rest: &[u8], len: usize) -> u32 {
        if len < 2 {
            return len as u32;
        }
        // Most pieces that are not tokens are short: their part boundaries and pair ranks fit
        // on the stack, so counting one allocates nothing (and a piece of at most
        // [`SHORT_PIECE`] bytes, most of them, fills only a few entries).
        if len <= SHORT_PIECE {
            let mut starts = [0usize; SHORT_PIECE + 1];
            let mut joins = [Rank::MAX; SHORT_PIECE + 1];
            self.merge(rest, len, &mut starts[..=len], &mut joins[..=len])
        } else if len < STACK_MERGE {
            let mut starts = [0usize; STACK_MERGE + 1];
            let mut joins = [Rank::MAX; STACK_MERGE + 1];
            self.merge(rest, len, &mut starts[..=len], &mut joins[..=len])
        } else {
            let parts = self.merge_long(rest, len);
            debug_assert_eq!(parts, self.merge(rest, len, &mut vec![0; len + 1], &mut vec![Rank::MAX; len + 1]), "the heap merges as the scan");
            parts
        }
    }

    /// [`Self::merge`] of a long piece `rest[..len]` (two bytes or more), the pair of lowest
    /// rank taken from a heap instead of found by a scan of every pair after every join (in a
    /// piece of hundreds of bytes, the scans were most of its count). The parts are a list
    /// linked by their starts, and the heap gets a pair's rank and start each time the pair is
    /// ranked; an entry whose pair has since been joined or ranked again no longer holds its
    /// pair's rank, and is dropped when it comes up. Equal ranks come up leftmost first, as the
    /// scan takes them: the start is the heap's second key. (An entry that holds its pair's
    /// rank again after a change stands for that pair as well as the new entry does.)
    fn merge_long(&self, rest: &[u8], len: usize) -> u32 {
        use std::cmp::Reverse;
        // `next[i]`: the start of the part after the part that starts at `i` (`len`: none);
        // `prev[i]`: the start of the part before it (the part at 0 has none, and is never
        // joined to one before it); `joins[i]`: the rank of the part at `i` joined with the
        // next (`Rank::MAX`: not a token, no part after it, or no part starts at `i`).
        let mut next: Vec<usize> = (1..=len).collect();
        let mut prev: Vec<usize> = (0..len).map(|i| i.saturating_sub(1)).collect();
        let join = |next: &[usize], i: usize| match next.get(next[i]) {
            Some(&end) => self.rank_in(rest, i, end).unwrap_or(Rank::MAX),
            None => Rank::MAX,
        };
        let mut joins: Vec<Rank> = (0..len).map(|i| join(&next, i)).collect();
        let mut heap: std::collections::BinaryHeap<Reverse<(Rank, usize)>> =
            joins.iter().enumerate().filter(|&(_, &rank)| rank != Rank::MAX).map(|(i, &rank)| Reverse((rank, i))).collect();
        let mut parts = len;
        while let Some(Reverse((rank, i))) = heap.pop() {
            if joins[i] != rank {
                continue;
            }
            // The part at `i` takes the next one, `j` (there is one: the pair has a rank).
            let j = next[i];
            let after = next[j];
            next[i] = after;
            if after < len {
                prev[after] = i;
            }
            joins[j] = Rank::MAX;
            parts -= 1;
            // The pairs the join changed: the part at `i` with its new next, and the part
            // before it with it.
            let changed = [Some(i), (i > 0).then(|| prev[i])];
            for k in changed.into_iter().flatten() {
                joins[k] = join(&next, k);
                if joins[k] != Rank::MAX {
                    heap.push(Reverse((joins[k], k)));
                }
            }
        }
        parts as u32
    }

    /// [`Self::merged_parts`] of a short piece (two to [`SHORT_PIECE`] bytes) by its packed
    /// value, as [`Self::merge`] merges it in place, with less work per pair: a part is cut out
    /// of the value by a shift and a mask (not packed again from the text), the parts' starts
    /// are the bits of one word (no boundaries moved after a join), and each part's pair with
    /// the next is one key, the rank of its join above the part's start, so that the least key
    /// is the pair to join (the lowest rank, the leftmost of equal ones). Not inlined: in
    /// [`Self::count_whole`]'s loop it took registers from the path of every piece.
    #[inline(never)]
    fn merge_short(&self, packed: u128) -> u32 {
        let len = (packed >> 120) as usize;
        debug_assert!((2..=SHORT_PIECE).contains(&len), "a short piece of two bytes or more");
        let bytes = packed & !(0xff << 120);
        // The part `at..end` packed.
        let part = |at: usize, end: usize| {
            let [lo, hi] = PIECE_MASKS[end - at];
            ((bytes >> (8 * at)) & (u128::from(lo) | (u128::from(hi) << 64))) | (((end - at) as u128) << 120)
        };
        // The key of the part at `at` joined with the next, which ends at `end` (a rank is below
        // 2^28, a start below 16); `u32::MAX` when the join is not a token.
        let key = |at: usize, end: usize| self.short_ranks.get(part(at, end)).map_or(u32::MAX, |rank| (rank << 4) | at as u32);
        // Bit k: a part starts at byte k (bit `len`: the piece's end).
        let mut starts: u32 = (2 << len) - 1;
        let next = |starts: u32, at: usize| (starts & !((2u32 << at) - 1)).trailing_zeros() as usize;
        // `keys[k]`: the key of the part at `k` (`u32::MAX`: no pair that is a token, or no
        // part starts at `k`). Indexes are below `len`; the masks only spare the bounds tests.
        let mut keys = [u32::MAX; 16];
        for k in 0..len - 1 {
            keys[k] = key(k, k + 2);
        }
        loop {
            let best = keys.iter().copied().min().unwrap_or(u32::MAX);
            if best == u32::MAX {
                break;
            }
            // The part at `at` takes the next one, which started at `gone`.
            let at = (best & 15) as usize;
            let gone = next(starts, at);
            starts &= !(1 << gone);
            keys[gone & 15] = u32::MAX;
            let end = next(starts, at);
            keys[at] = if end < len { key(at, next(starts, end)) } else { u32::MAX };
            if at > 0 {
                let before = 31 - (starts & ((1 << at) - 1)).leading_zeros() as usize;
                keys[before & 15] = key(before, end);
            }
        }
        starts.count_ones() - 1
    }

    /// [`Self::merged_parts`] of a piece `rest[..len]` of two bytes or more in the buffers
    /// given (`len + 1` entries each, contents ignored).
    fn merge(&self, rest: &[u8], len: usize, starts: &mut [usize], joins: &mut [Rank]) -> u32 {
        // `starts[k]`: where part k starts, `starts[parts]` the end; `joins[k]`: the rank of
        // parts k and k + 1 joined (`Rank::MAX`: not a token; entry `parts - 1` has no pair).
        // Entries past `parts` are stale.
        let mut parts = len;
        for (k, start) in starts.iter_mut().enumerate() {
            *start = k;
        }
        let join = |starts: &[usize], parts: usize, k: usize| {
            if k + 2 <= parts { self.rank_in(rest, starts[k], starts[k + 2]).unwrap_or(Rank::MAX) } else { Rank::MAX }
        };
        for k in 0..parts {
            joins[k] = join(starts, parts, k);
        }
        loop {
            let mut best = (Rank::MAX, 0);
            for (k, &rank) in joins[..parts - 1].iter().enumerate() {
                if rank < best.0 {
                    best = (rank, k);
                }
            }
            if best.0 == Rank::MAX {
                break;
            }
            let k = best.1;
            // Parts k and k + 1 become one: drop boundary k + 1 and pair k + 1.
            starts.copy_within(k + 2..=parts, k + 1);
            joins.copy_within(k + 2..parts, k + 1);
            parts -= 1;
            joins[k] = join(starts, parts, k);
            if k > 0 {
                joins[k - 1] = join(starts, parts, k - 1);
            }
        }
        parts as u32
    }

    /// tiktoken-rs's own encoder, built on first use: only a text holding a piece of
    /// [`LONG_PIECE`] bytes or more is counted by it.
    fn core() -> &'static CoreBPE {
        tiktoken_rs::o200k_base_singleton()
    }

    /// The end of the piece of the split starting at `at`, found by the DFA (the look-ahead of
    /// the whitespace run applied); `None` if the DFA gives up, which it is not configured to.
    fn split_at(&self, cache: &mut Cache, input: &mut Input<'_>, text: &str, at: usize) -> Option<usize> {
        input.set_start(at);
        let m = self.split.try_search_fwd(cache, input).ok()??;
        let mut end = m.offset();
        if m.pattern().as_usize() == WHITESPACE_RUN && end < text.len() {
            let last = text[at..end].chars().next_back().map_or(0, char::len_utf8);
            if end - at > last {
                end -= last;
            }
        }
        Some(end)
    }

    /// The count of `text`: a long one as the sum of its chunks' counts ([`chunk_ends`]), each
    /// looked up in the process's chunk memo ([`CHUNKS`]) first, so that a text that differs from an earlier
    /// one in a few places (a system prompt with another section, a file after an edit) is
    /// tokenized only there.
    fn count(&self, text: &str, caches: &mut ThreadCaches) -> u32 {
        match self.count_unless(text, caches, &|_| false) {
            Ok(n) | Err(n) => n,
        }
    }

    /// [`Self::count`] (`Ok`), unless `past` holds for the count of the chunks so far before the
    /// last: then `Err` of that count, the chunks after them not counted. `past` must hold for
    /// every count above one it holds for (a limit passed), so that `Err` says it holds for the
    /// whole text's count, which is at least the part's.
    fn count_unless(&self, text: &str, caches: &mut ThreadCaches, past: &dyn Fn(u32) -> bool) -> Result<u32, u32> {
        if text.len() < CHUNKED_TEXT {
            return Ok(self.count_whole(text, caches));
        }
        let mut total = 0;
        let mut start = 0;
        let mut ends = chunk_ends(text.as_bytes(), CHUNK_MIN).peekable();
        while let Some(end) = ends.next() {
            let chunk = &text[start..end];
            start = end;
            let key = xxhash_rust::xxh3::xxh3_128(chunk.as_bytes());
            let known = CHUNKS.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied();
            total += match known {
                Some(n) => n,
                None => {
                    let n = self.count_whole(chunk, caches);
                    let mut chunks = CHUNKS.lock().unwrap_or_else(|e| e.into_inner());
                    if chunks.len() >= CHUNK_MEMO_CAP {
                        chunks.clear();
                    }
                    chunks.insert(key, n);
                    n
                }
            };
            if ends.peek().is_some() && past(total) {
                return Err(total);
            }
        }
        #[cfg(debug_assertions)]
        if text.len() <= 1 << 16 {
            debug_assert_eq!(total, self.count_whole(text, caches), "a text's count is the sum of its chunks'");
        }
        Ok(total)
    }

    /// The count of `text` piece by piece.
    fn count_whole(&self, text: &str, caches: &mut ThreadCaches) -> u32 {
        let ThreadCaches { split: cache, recent, short_pieces, long_pieces } = caches;
        let bytes = text.as_bytes();
        let mut input = Input::new(text).anchored(Anchored::Yes);
        let mut at = 0;
        let mut tokens = 0u32;
        while at < bytes.len() {
            let end = match scan_ascii(bytes, at) {
                Scan::End(end) => end,
                Scan::NotAscii => match self.split_at(cache, &mut input, text, at) {
                    Some(end) => end,
                    // Unreachable: every character starts a match of one of the patterns, and
                    // the lazy DFA is not configured to give up.
                    None => return Self::core().encode_ordinary(text).len() as u32,
                },
            };
            // (Debug builds: a piece next to a byte that is not ASCII, such as [`scan_arrow`]'s,
            // against the DFA's.)
            #[cfg(debug_assertions)]
            if bytes[at] >= 0x80 || bytes.get(end).is_some_and(|&b| b >= 0x80) {
                debug_assert_eq!(self.split_at(cache, &mut input, text, at), Some(end), "the scan splits as the DFA at {at}");
            }
            let start = at;
            at = end;
            // A piece of one byte is one token, whatever the byte (the merge has nothing to
            // join; every byte is a token of o200k too).
            if end - start == 1 {
                debug_assert!(self.short_ranks.contains_key(pack(&bytes[start..end]).unwrap_or(0)), "every byte is a token");
                tokens += 1;
                continue;
            }
            if let Some(packed) = pack_in(bytes, start, end) {
                let slot = Recent::slot(packed);
                if let Some(n) = recent.get(slot, packed) {
                    tokens += n;
                    continue;
                }
                let n = if self.short_ranks.contains_key(packed) {
                    1
                } else if let Some(&n) = short_pieces.get(&packed) {
                    debug_assert_eq!(n, self.merged_parts(&bytes[start..], end - start), "a short piece's memoized count is its merge's");
                    n
                } else {
                    let n = self.merge_short(packed);
                    debug_assert_eq!(n, self.merged_parts(&bytes[start..], end - start), "a short piece merges by its value as in place");
                    if short_pieces.len() >= SHORT_MEMO_CAP {
                        short_pieces.clear();
                    }
                    short_pieces.insert(packed, n);
                    n
                };
                recent.set(slot, packed, n);
                tokens += n;
            } else if self.long_ranks.contains_key(&bytes[start..end]) {
                tokens += 1;
            } else if end - start >= LONG_PIECE {
                return Self::core().encode_ordinary(text).len() as u32;
            } else {
                let key = xxhash_rust::xxh3::xxh3_128(&bytes[start..end]);
                tokens += match long_pieces.get(&key) {
                    Some(&n) => {
                        debug_assert_eq!(n, self.merged_parts(&bytes[start..], end - start), "a long piece's memoized count is its merge's");
                        n
                    }
                    None => {
                        let n = self.merged_parts(&bytes[start..], end - start);
                        if long_pieces.len() >= LONG_MEMO_CAP {
                            long_pieces.clear();
                        }
                        long_pieces.insert(key, n);
                        n
                    }
                };
            }
        }
        tokens
    }
}

/// Whether the split into pieces always has a boundary at `at`, whatever comes before it:
/// `at` follows a line break and starts a run of spaces and tabs (maybe empty) that ends at a
/// printable ASCII character, not a `/` right after the break. Of the expression's
/// alternatives, only three can take a line break: `\s*[\r\n]+` and the whitespace runs end
/// with the run's last line break (the run here has no other), and ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
/// can go on after a break only with `\r`, `\n` or `/`. No alternative starts with a line
/// break and goes on with anything else (the letters' optional first character is not one).
/// So no piece holds both `at - 1` and `at`, and the count of a text cut there is the sum of
/// its two parts' counts (tests compare on generated and real text).
fn cuts_at(bytes: &[u8], at: usize) -> bool {
    if at == 0 || bytes[at - 1] != b'\n' {
        return false;
    }
    let mut end = at;
    while end < bytes.len() && matches!(bytes[end], b' ' | b'\t') {
        end += 1;
    }
    end < bytes.len() && bytes[end].is_ascii_graphic() && !(end == at && bytes[end] == b'/')
}

/// Whether the split into pieces always has a boundary at `at`, whatever comes before and after
/// it: a space after an ASCII letter or digit. Only the letters' and the digits' alternatives
/// take a letter or digit, and neither goes on with a space after one (the letters' optional
/// other character comes before them); the piece the space starts depends only on what
/// follows it. So the count of a text cut there is the sum of its two parts' counts (tests
/// compare on generated text). A line of words has such a boundary every few bytes.
fn cuts_at_word(bytes: &[u8], at: usize) -> bool {
    at > 0 && bytes.get(at) == Some(&b' ') && bytes[at - 1].is_ascii_alphanumeric()
}

/// A chunk that would run past this many times the least chunk's length to its line cut is cut
/// at a word instead ([`chunk_ends`]).
const LINE_CHUNK_MINS: usize = 4;

/// Where a long text is cut into chunks for counting, the last end being the text's length:
/// at a [`cuts_at`] boundary at least `min` bytes into the chunk, where the few bytes that
/// follow the boundary pick it (about one in four), so that the cuts depend on the text
/// around them, not on where the text starts: two texts that differ in one place share the
/// chunks before and, from a few boundaries on, after it. When no such boundary comes within
/// [`LINE_CHUNK_MINS`] times `min` bytes of the chunk's start (a long line: a filler's words,
/// JSON on one line), the chunk ends at its first word boundary ([`cuts_at_word`]) from `min`
/// bytes on, if one comes before that: a line of one repeated run of words (the replay's
/// fillers) is then cut into chunks of a few kinds that repeat, counted once each, not tokenized
/// whole as one chunk.
fn chunk_ends(bytes: &[u8], min: usize) -> impl Iterator<Item = usize> + '_ {
    let min = min.max(1);
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        let (from, long) = (start + min, start + LINE_CHUNK_MINS * min);
        let end = line_cut(bytes, from, long)
            .or_else(|| word_cut(bytes, from, long))
            .or_else(|| line_cut(bytes, long.max(from), bytes.len()))
            .unwrap_or(bytes.len());
        start = end;
        Some(end)
    })
}

/// The first [`cuts_at`] boundary in `from..to` (`from >= 1`) that [`picks`] picks, short of
/// the text's end.
fn line_cut(bytes: &[u8], mut from: usize, to: usize) -> Option<usize> {
    let to = to.min(bytes.len());
    while from < to {
        // A boundary `at` follows a line feed at `at - 1`.
        let at = from + memchr::memchr(b'\n', &bytes[from - 1..to - 1])?;
        if cuts_at(bytes, at) && picks(&bytes[at..]) {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// The first [`cuts_at_word`] boundary in `from..to`, short of the text's end.
fn word_cut(bytes: &[u8], from: usize, to: usize) -> Option<usize> {
    let to = to.min(bytes.len());
    let spaces = bytes.get(from..to)?;
    memchr::memchr_iter(b' ', spaces).map(|i| from + i).find(|&at| cuts_at_word(bytes, at))
}

/// Whether the bytes after a boundary pick it as a cut: about one in four, from up to 8 of
/// them (after the run of spaces the boundary starts with).
fn picks(rest: &[u8]) -> bool {
    let rest = &rest[rest.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(rest.len())..];
    let mut h: u32 = 0x9e37_79b9;
    for &b in rest.iter().take(8) {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    (h >> 13) & 3 == 0
}

/// o200k_base token count of `text`, special-token text counted as ordinary text: exactly
/// `o200k_base_singleton().encode_ordinary(text).len()`.
pub fn count(text: &str) -> u32 {
    SPLIT_CACHE.with(|caches| O200K.count(text, &mut caches.borrow_mut()))
}

/// [`count`] (`Ok`), unless `past` holds for the count of a leading part of `text` (the chunks a
/// long text is counted in, [`chunk_ends`], so far): then `Err` of that part's count, the rest
/// not counted. `past` must hold for every count above one it holds for (a limit passed):
/// `Err` says it holds for the whole text's count, which is at least the part's.
pub fn count_unless(text: &str, past: &dyn Fn(u32) -> bool) -> Result<u32, u32> {
    SPLIT_CACHE.with(|caches| O200K.count_unless(text, &mut caches.borrow_mut(), past))
}

/// Builds the tokenizer (the rank tables from build.rs's table and the split DFA)
/// on another thread, so that it is ready, or nearly, when the caller has read its
/// input. Counts do not depend on it; a count asked for sooner waits for the build.
pub fn warm_up_in_background() {
    std::thread::spawn(|| LazyLock::force(&O200K));
}

/// The same count by tiktoken-rs alone, the reference [`count`] is tested against.
pub fn count_by_tiktoken(text: &str) -> u32 {
    tiktoken_rs::o200k_base_singleton().encode_ordinary(text).len() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ordinary_tokens_are_the_ranks_below_the_bound() {
        let core = tiktoken_rs::o200k_base_singleton();
        assert!(core.decode_bytes(&[O200K_ORDINARY_TOKENS - 1]).is_ok());
        assert!(core.decode_bytes(&[O200K_ORDINARY_TOKENS]).is_err());
        let specials: Vec<Rank> = core.special_tokens().iter().map(|s| core.encode_with_special_tokens(s)[0]).collect();
        assert!(specials.iter().all(|&rank| rank > O200K_ORDINARY_TOKENS), "{specials:?}");
        // The tables hold tiktoken-rs's tokens, rank for rank, each once.
        assert_eq!(O200K.short_ranks.len() + O200K.long_ranks.len(), O200K_ORDINARY_TOKENS as usize);
        // Every byte is a token (a piece of one byte counts one without a lookup).
        assert!((0..=255u8).all(|b| O200K.rank(&[b]).is_some()));
        for rank in 0..O200K_ORDINARY_TOKENS {
            assert_eq!(O200K.rank(&core.decode_bytes(&[rank]).unwrap()), Some(rank));
        }
    }

    #[test]
    fn a_piece_packed_by_one_load_packs_as_through_a_buffer() {
        let text = "héllo, wörld: fn main() { let x = 42; }\n\t  \u{1F600} the end".as_bytes();
        for at in 0..text.len() {
            for end in at..=text.len() {
                assert_eq!(pack_in(text, at, end), pack(&text[at..end]), "{at}..{end}");
                assert_eq!(O200K.rank_in(text, at, end), O200K.rank(&text[at..end]), "{at}..{end}");
            }
        }
    }

    /// The pieces of `text` by the DFA alone and by the hand-written scan (the DFA where it
    /// says the piece is not ASCII).
    fn pieces(text: &str) -> (Vec<usize>, Vec<usize>) {
        let mut cache = O200K.split.create_cache();
        let mut input = Input::new(text).anchored(Anchored::Yes);
        let (mut by_dfa, mut by_scan) = (Vec::new(), Vec::new());
        let mut at = 0;
        while at < text.len() {
            at = O200K.split_at(&mut cache, &mut input, text, at).unwrap();
            by_dfa.push(at);
        }
        let mut at = 0;
        while at < text.len() {
            at = match scan_ascii(text.as_bytes(), at) {
                Scan::End(end) => end,
                Scan::NotAscii => O200K.split_at(&mut cache, &mut input, text, at).unwrap(),
            };
            by_scan.push(at);
        }
        (by_dfa, by_scan)
    }

    /// Every ASCII character class the split tells apart, the contractions in both cases and
    /// the non-ASCII characters that continue an ASCII run (a letter, a mark, a digit, a
    /// symbol, whitespace, the long s that folds to `s`).
    fn ascii_heavy_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let atoms = prop::sample::select(vec![
            "a", "b", "Z", "Q", "x", "1", "0", "7", "'", "'s", "'S", "'t", "'re", "'RE", "'ve", "'m", "'ll", "'Ll", "'d", "'r", "'l", "'v", " ",
            "  ", "\t", "\n", "\r", "\r\n", "\u{0b}", "\u{0c}", "\u{00}", "\u{1f}", "\u{7f}", "-", "/", ".", "{", "\"", "_", "!", "é", "É",
            "\u{0301}", "٣", "—", "\u{00a0}", "\u{2003}", "\u{0085}", "ſ", "日", "😀", "→", "→", "←",
        ]);
        prop::collection::vec(atoms, 0..40).prop_map(|parts| parts.concat())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4000))]
        #[test]
        fn the_scan_splits_as_the_dfa(text in ascii_heavy_text()) {
            let (by_dfa, by_scan) = pieces(&text);
            proptest::prop_assert_eq!(by_dfa, by_scan, "{:?}", text);
        }

        #[test]
        fn the_scan_splits_arbitrary_ascii_as_the_dfa(text in "[\\x00-\\x7f]{0,80}") {
            let (by_dfa, by_scan) = pieces(&text);
            proptest::prop_assert_eq!(by_dfa, by_scan, "{:?}", text);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
        /// Every boundary [`cuts_at`] and [`cuts_at_word`] name is one of the split's, and tiktoken-rs's count of a
        /// text is the sum of its counts of the chunks [`chunk_ends`] cuts it into, at any
        /// chunk size; so is this module's, through the chunk memo too.
        #[test]
        fn a_text_counts_as_the_sum_of_its_chunks(parts in proptest::collection::vec(ascii_heavy_text(), 1..8), min in 1usize..40) {
            let text = parts.join("\n");
            let (ends, _) = pieces(&text);
            for at in 1..text.len() {
                if cuts_at(text.as_bytes(), at) || cuts_at_word(text.as_bytes(), at) {
                    proptest::prop_assert!(ends.contains(&at), "no boundary at {} in {:?}", at, text);
                }
            }
            let mut start = 0;
            let mut sum = 0;
            for end in chunk_ends(text.as_bytes(), min) {
                proptest::prop_assert!(end > start && (end == text.len() || cuts_at(text.as_bytes(), end) || cuts_at_word(text.as_bytes(), end)));
                sum += count_by_tiktoken(&text[start..end]);
                start = end;
            }
            proptest::prop_assert_eq!(start, text.len());
            proptest::prop_assert_eq!(sum, count_by_tiktoken(&text), "{:?}", text);
            let long = text.repeat(CHUNKED_TEXT / text.len().max(1) + 1);
            proptest::prop_assert_eq!(count(&long), count_by_tiktoken(&long));
        }
    }

    /// A long line of one run of words repeated (the replay's fillers) is cut after words into
    /// chunks of a few kinds, counted as tiktoken-rs counts the whole.
    #[test]
    fn a_long_line_of_repeated_words_is_cut_into_chunks_that_repeat() {
        let text = format!("<thinking>{}\n\nend", " the and for not you are".repeat(2000));
        let bytes = text.as_bytes();
        let mut start = 0;
        let mut kinds = std::collections::BTreeSet::new();
        for end in chunk_ends(bytes, CHUNK_MIN) {
            assert!(end == text.len() || cuts_at(bytes, end) || cuts_at_word(bytes, end), "{end}");
            assert!(end == text.len() || end - start <= LINE_CHUNK_MINS * CHUNK_MIN, "{start}..{end}");
            kinds.insert(&text[start..end]);
            start = end;
        }
        assert!(kinds.len() <= 8, "{} kinds of chunk", kinds.len());
        assert_eq!(count(&text), count_by_tiktoken(&text));
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// A count cut short at a limit says only what the whole count says: `Ok` is the whole
        /// count (at the limit or under it, or passing it only in the last chunk), `Err` a part's
        /// count past the limit, and the whole count is past it too.
        #[test]
        fn a_count_cut_short_passes_the_limit_the_whole_count_passes(parts in proptest::collection::vec(ascii_heavy_text(), 1..8), copies in 1usize..400, limit in 0u32..3000) {
            let text = vec![parts.join("\n"); copies].join("\n");
            let whole = count(&text);
            match count_unless(&text, &|n| n > limit) {
                Ok(n) => proptest::prop_assert_eq!(n, whole),
                Err(part) => {
                    proptest::prop_assert!(text.len() >= CHUNKED_TEXT && part > limit && part <= whole, "{} of {} past {}", part, whole, limit);
                }
            }
            proptest::prop_assert_eq!(count_unless(&text, &|_| false), Ok(whole));
        }
    }

    #[test]
    fn a_long_text_far_past_the_limit_is_counted_only_in_part() {
        // (Lines whose first bytes differ: a cut is picked by the bytes after a line break.)
        let text: String = (0..3000).map(|i| format!("value_{i} = compute({i}, \"{}\");\n", i * 7)).collect();
        let whole = count(&text);
        assert!(whole > 20_000, "{whole}");
        let Err(part) = count_unless(&text, &|n| n > 5_000) else { panic!("counted whole") };
        assert!(part > 5_000 && part < whole / 2, "{part} of {whole}");
        assert_eq!(count_unless(&text, &|n| n > whole), Ok(whole));
    }

    /// Text of bytes of every class the scan tells apart, each at any offset from the start
    /// (so at every position in the eight-byte words [`lower_run`] reads): runs of lowercase
    /// letters of every length around eight, the other classes, the contractions, and
    /// characters that are not ASCII.
    fn every_class_text() -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let atoms = prop::sample::select(vec![
            "a", "z", "q", "ab", "abcdefg", "abcdefgh", "abcdefghi", "xyzxyzxyzxyzxyzx", "A", "Z", "AB", "0", "9", "12", "1234", " ", "    ", "\t",
            "\u{0b}", "\u{0c}", "\n", "\r", "\r\n", "\u{00}", "\u{7f}", "`", "{", "@", "[", "/", "'", "'s", "'LL", "'re", "-", "é", "\u{0301}",
            "\u{00a0}", "ſ", "日", "😀", "\u{ff}",
        ]);
        (0usize..8, prop::collection::vec(atoms, 0..30)).prop_map(|(offset, parts)| "x".repeat(offset) + &parts.concat())
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(3000))]
        /// The class table and the word-at-a-time runs find every piece the bytewise scan
        /// finds, from every character of the text (not only where the split puts a start).
        #[test]
        fn the_class_scan_scans_as_the_bytewise_one(text in every_class_text()) {
            let bytes = text.as_bytes();
            for at in (0..bytes.len()).filter(|&at| text.is_char_boundary(at)) {
                let by_class = scan_ascii_inner(bytes, at).map_or(Scan::NotAscii, Scan::End);
                proptest::prop_assert_eq!(by_class, scan_ascii_bytewise(bytes, at), "at {} of {:?}", at, text);
            }
        }

        #[test]
        fn the_class_scan_scans_any_bytes_as_the_bytewise_one(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 1..40)) {
            for at in 0..bytes.len() {
                let by_class = scan_ascii_inner(&bytes, at).map_or(Scan::NotAscii, Scan::End);
                proptest::prop_assert_eq!(by_class, scan_ascii_bytewise(&bytes, at), "at {} of {:?}", at, bytes);
            }
        }
    }

    /// The eight-byte test of lowercase letters stops where the bytewise run stops, whatever
    /// byte ends the run, at every place in the word, whatever follows it (a byte that is not
    /// ASCII carries into the bytes after it).
    #[test]
    fn a_run_of_lowercase_letters_ends_where_the_bytewise_run_ends() {
        for letters in 0..10 {
            for stop in 0..=255u8 {
                for after in [b'a', b'z', b'`', b'{', b'@', 0x7f, 0x80, 0xe1, 0xff] {
                    let mut bytes = vec![b'q'; letters];
                    bytes.push(stop);
                    bytes.extend([after; 12]);
                    for from in [0, 1.min(letters)] {
                        let (end, stop) = lower_run(&bytes, from);
                        assert_eq!(end, run(&bytes, from, LOWER).0, "{bytes:?}");
                        assert_eq!(stop, bytes.get(end).copied().unwrap_or(0), "{bytes:?}");
                    }
                }
            }
        }
        for b in 0..=255u8 {
            assert_eq!(CLASS[usize::from(b)] == LOWER, b.is_ascii_lowercase(), "{b}");
            assert_eq!(CLASS[usize::from(b)] == WIDE, !b.is_ascii(), "{b}");
        }
    }

    /// A slot of [`Recent`] gives back the piece it was given and its count, for every count a
    /// short piece can have, the longest pieces too (whose last byte holds the length 15).
    #[test]
    fn a_recent_slot_keeps_a_piece_and_its_count() {
        let mut recent = Recent::new();
        for (i, piece) in ["a", "zz", "fifteen-bytes!!", "\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}\u{ff}x"].into_iter().enumerate() {
            let packed = pack(piece.as_bytes()).unwrap();
            let slot = Recent::slot(packed);
            for n in 0..=SHORT_PIECE as u32 {
                recent.set(slot, packed, n);
                assert_eq!(recent.get(slot, packed), Some(n), "{i}");
                assert_eq!(recent.get(slot, packed ^ 1), None);
                assert_eq!(recent.get(slot, packed ^ (1 << 120)), None);
            }
        }
    }

    /// The thread's memo of the short pieces that are not tokens holds at most
    /// [`SHORT_MEMO_CAP`] of them: emptied when full, it is filled again, and counts stay
    /// tiktoken-rs's throughout.
    #[test]
    fn the_short_piece_memo_is_emptied_when_full() {
        let word = |mut i: u32| {
            let mut w = String::from("zq");
            while i > 0 || w.len() < 6 {
                w.push(char::from(b'a' + (i % 26) as u8));
                i /= 26;
            }
            w
        };
        let held = || SPLIT_CACHE.with(|caches| caches.borrow().short_pieces.len());
        let (mut most, mut emptied) = (0, false);
        for i in 0..(2 * SHORT_MEMO_CAP as u32) {
            let text = word(i);
            let n = count(&text);
            if i % 64 == 0 {
                assert_eq!(n, count_by_tiktoken(&text), "{text}");
            }
            emptied |= held() < most;
            most = most.max(held());
        }
        assert!(emptied && most == SHORT_MEMO_CAP, "{most}");
    }

    /// A long piece of a few letters (so that its parts join many times, in every order), or of
    /// other bytes the vocabulary joins.
    fn long_piece() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let alphabet = prop::sample::select(vec![b"etaoinsr".to_vec(), b"ab".to_vec(), b"-=*#".to_vec(), b" ".to_vec(), b"0123456789abcdef".to_vec(), (0..=255).collect()]);
        (alphabet, STACK_MERGE..LONG_PIECE).prop_flat_map(|(alphabet, len)| prop::collection::vec(prop::sample::select(alphabet), len))
    }

    /// A short piece of a few letters (so that its parts join in many orders), or of other
    /// bytes the vocabulary joins.
    fn short_piece() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
        use proptest::prelude::*;
        let alphabet = prop::sample::select(vec![b"etaoinsr".to_vec(), b"ab".to_vec(), b"-=*# ".to_vec(), b"0123456789abcdef".to_vec(), (0..=255).collect()]);
        (alphabet, 2..=SHORT_PIECE).prop_flat_map(|(alphabet, len)| prop::collection::vec(prop::sample::select(alphabet), len))
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4000))]
        /// The merge of a short piece by its packed value leaves as many parts as the merge in
        /// place.
        #[test]
        fn a_short_piece_merges_by_its_value_as_in_place(piece in short_piece()) {
            let len = piece.len();
            let in_place = O200K.merge(&piece, len, &mut [0; SHORT_PIECE + 1][..=len], &mut [Rank::MAX; SHORT_PIECE + 1][..=len]);
            proptest::prop_assert_eq!(O200K.merge_short(pack(&piece).unwrap_or(0)), in_place, "{:?}", piece);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// The heap merge of a long piece leaves as many parts as the scan's merge and as
        /// tiktoken-rs's `byte_pair_split`.
        #[test]
        fn the_heap_merges_a_long_piece_as_the_scan(piece in long_piece()) {
            let len = piece.len();
            let by_scan = O200K.merge(&piece, len, &mut vec![0; len + 1], &mut vec![Rank::MAX; len + 1]);
            proptest::prop_assert_eq!(O200K.merge_long(&piece, len), by_scan);
            if let Ok(text) = std::str::from_utf8(&piece) {
                let encoded = O200k::core().encode_ordinary(text).len() as u32;
                proptest::prop_assert!(count(text) == encoded, "{:?}", text);
            }
        }
    }

    #[test]
    fn the_scan_takes_ascii_pieces_and_leaves_the_others_to_the_dfa() {
        let ends = |text: &str| {
            let mut at = 0;
            std::iter::from_fn(|| {
                (at < text.len()).then(|| {
                    let scan = scan_ascii(text.as_bytes(), at);
                    if let Scan::End(end) = scan {
                        at = end;
                    } else {
                        at = text.len();
                    }
                    scan
                })
            })
            .collect::<Vec<_>>()
        };
        assert_eq!(ends("Hello world's  end\n\n  x"), [Scan::End(5), Scan::End(13), Scan::End(14), Scan::End(18), Scan::End(20), Scan::End(21), Scan::End(23)]);
        assert_eq!(ends("ab é"), [Scan::End(2), Scan::NotAscii]);
        assert_eq!(ends("abé"), [Scan::NotAscii]);
        assert_eq!(ends("it'ſ"), [Scan::NotAscii]);
        assert_eq!(ends("12٣"), [Scan::NotAscii]);
        assert_eq!(ends("123٣"), [Scan::End(3), Scan::NotAscii]);
        // `→` after a line's number, and what follows it.
        assert_eq!(ends("  12→fn x"), [Scan::End(1), Scan::End(2), Scan::End(4), Scan::End(9), Scan::End(11)]);
        assert_eq!(ends("7→}\n8→\t//"), [Scan::End(1), Scan::End(6), Scan::End(7), Scan::End(10), Scan::End(11), Scan::End(13)]);
        assert_eq!(ends("→é"), [Scan::NotAscii]);
    }

    #[test]
    fn counts_equal_tiktoken_on_edge_cases() {
        let cases = [
            "",
            " ",
            "  ",
            "a",
            "a  b",
            "a   b",
            "a \n b",
            "  \n  b",
            "x\t\t\ty",
            "end with spaces   ",
            "\n\n\n",
            "\r\n  \r\n",
            "don't WE'LL they'RE",
            "123456789 12 1",
            "  1",
            "fn main() {\n    println!(\"hi\");\n}\n",
            "👋🏽 héllo wörld — ünïcödé",
            "日本語のテキスト。",
            "\u{0085}\u{00a0} x\u{2003}\u{2003}y",
            "---------------------------------------------------------------------------------------------------------",
            "<|endoftext|> and <|endofprompt|>",
        ];
        for _ in 0..2 {
            for text in cases {
                assert_eq!(count(text), count_by_tiktoken(text), "{text:?}");
            }
        }
    }
}
