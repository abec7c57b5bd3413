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
//!   setup per piece, was about a quarter of a cold audit's instructions.
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
//!   also serves pieces up to 1 KiB, where its worst case is still under a millisecond; tested
//!   properties hold it to tiktoken-rs's count. A text with a longer piece (a long rule of
//!   dashes, a run of spaces) is counted by tiktoken-rs itself, whose encoder is then built
//!   once.
//! - **Short pieces by value.** A piece of at most 15 bytes is looked up as one `u128` (its
//!   bytes and its length), not as a byte string: whether it is a token, and, in a
//!   [`Counter`] (one per run, held by the `TokenCounter`), the count of each short piece that
//!   is not one. A piece's count never changes, so that memo is a pure cache, capped in size.
//! - **Recent pieces first.** Before those tables (200k entries, several megabytes: most
//!   lookups missed the processor's caches), a short piece is looked up in a small
//!   direct-mapped table of the pieces this thread counted lately ([`Recent`], 8,192 slots,
//!   136 KB): a text's common pieces (` the`, `\n   `, `fn`) are found there. A slot holds one
//!   piece and its count, overwritten by the next piece hashed to it; a count never changes, so
//!   what the table holds changes only the speed, never a count.
//! - **Long texts in chunks.** A text of 4 KiB or more is cut, only where the split always
//!   has a boundary ([`cuts_at`]), into chunks the text around each cut picks
//!   ([`chunk_ends`]), and its count is the sum of theirs, each looked up first in a table of
//!   the chunks the process counted ([`CHUNKS`]): the system prompts of the what-ifs of a
//!   session, and a file read again after an edit, are tokenized where they differ.
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
/// At most this many short non-token pieces are memoized per run ([`Counter`]).
const MEMO_CAP: usize = 1 << 20;
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

/// A counting run's state: the counts of the short pieces that are not tokens.
#[derive(Clone, Default)]
pub struct Counter {
    memo: FxHashMap<u128, u32>,
}

impl std::fmt::Debug for Counter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counter").field("memoized_pieces", &self.memo.len()).finish()
    }
}

impl Counter {
    pub fn new() -> Counter {
        Counter::default()
    }

    /// The o200k_base token count of `text`, as [`count`].
    pub fn count(&mut self, text: &str) -> u32 {
        SPLIT_CACHE.with(|caches| O200K.count(text, &mut caches.borrow_mut(), Some(&mut self.memo)))
    }
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
    /// per thread, and the thread's recent short pieces (the piece memo, in contrast, belongs
    /// to a run: [`Counter`]).
    static SPLIT_CACHE: RefCell<ThreadCaches> =
        RefCell::new(ThreadCaches { split: O200K.split.create_cache(), recent: Recent::new() });
}

/// The counts of the chunks of long texts ([`chunk_ends`]) by their xxh3-128, shared by the
/// process's threads (the sessions of one project, on different threads, send the same system
/// prompt and files), emptied when [`CHUNK_MEMO_CAP`] are held. A count never changes, so what
/// it holds changes only the speed.
static CHUNKS: LazyLock<std::sync::Mutex<FxHashMap<u128, u32>>> = LazyLock::new(Default::default);

/// A thread's caches: the split DFA's states and [`Recent`].
struct ThreadCaches {
    split: Cache,
    recent: Recent,
}

/// log2 of [`Recent`]'s slots.
const RECENT_BITS: u32 = 13;

/// The short pieces a thread counted lately, direct-mapped by a hash of the packed piece: a
/// piece's slot holds it and its count until another piece hashed to the same slot replaces
/// it. An empty slot holds 0, which no piece packs to (a piece has at least one byte, and its
/// length is in the packed value). A short piece has at most 15 tokens, so a count is a `u8`.
struct Recent {
    pieces: Box<[u128]>,
    counts: Box<[u8]>,
}

impl Recent {
    fn new() -> Recent {
        Recent { pieces: vec![0; 1 << RECENT_BITS].into_boxed_slice(), counts: vec![0; 1 << RECENT_BITS].into_boxed_slice() }
    }

    fn slot(packed: u128) -> usize {
        let mixed = (packed as u64) ^ ((packed >> 64) as u64).rotate_left(29);
        (mixed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - RECENT_BITS)) as usize
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

/// `bytes[at..end]` packed as [`pack`] packs it, read as one unaligned 16-byte load masked to
/// the piece when 16 bytes from `at` are in `bytes` (no copy through a buffer on the stack,
/// whose store the load after it would wait for).
#[inline]
fn pack_in(bytes: &[u8], at: usize, end: usize) -> Option<u128> {
    let len = end - at;
    if len > SHORT_PIECE {
        return None;
    }
    match bytes.get(at..at + 16) {
        Some(chunk) => {
            let word = u128::from_le_bytes(chunk.try_into().unwrap_or([0; 16]));
            Some((word & ((1u128 << (8 * len)) - 1)) | ((len as u128) << 120))
        }
        None => pack(&bytes[at..end]),
    }
}

/// What the hand-written scan found at a piece's start: the piece's end, or that the piece
/// needs the DFA (its start, or a character the scan had to look at, is not ASCII).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scan {
    End(usize),
    NotAscii,
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

/// The end of `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` from `at`: `at` itself when none follows.
/// `Err` when a byte it had to look at is not ASCII (case folding maps `ſ` to `s`).
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
/// outside ASCII continuing a run), [`Scan::NotAscii`]: the DFA splits that piece.
fn scan_ascii(bytes: &[u8], at: usize) -> Scan {
    scan_ascii_inner(bytes, at).map_or(Scan::NotAscii, Scan::End)
}

fn scan_ascii_inner(bytes: &[u8], at: usize) -> Result<usize, ()> {
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
        // on the stack, so counting one allocates nothing.
        if len < STACK_MERGE {
            let mut starts = [0usize; STACK_MERGE + 1];
            let mut joins = [Rank::MAX; STACK_MERGE + 1];
            self.merge(rest, len, &mut starts[..=len], &mut joins[..=len])
        } else {
            self.merge(rest, len, &mut vec![0; len + 1], &mut vec![Rank::MAX; len + 1])
        }
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
    fn count(&self, text: &str, caches: &mut ThreadCaches, memo: Option<&mut FxHashMap<u128, u32>>) -> u32 {
        match self.count_unless(text, caches, memo, &|_| false) {
            Ok(n) | Err(n) => n,
        }
    }

    /// [`Self::count`] (`Ok`), unless `past` holds for the count of the chunks so far before the
    /// last: then `Err` of that count, the chunks after them not counted. `past` must hold for
    /// every count above one it holds for (a limit passed), so that `Err` says it holds for the
    /// whole text's count, which is at least the part's.
    fn count_unless(&self, text: &str, caches: &mut ThreadCaches, mut memo: Option<&mut FxHashMap<u128, u32>>, past: &dyn Fn(u32) -> bool) -> Result<u32, u32> {
        if text.len() < CHUNKED_TEXT {
            return Ok(self.count_whole(text, caches, memo));
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
                    let n = self.count_whole(chunk, caches, memo.as_deref_mut());
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
            debug_assert_eq!(total, self.count_whole(text, caches, None), "a text's count is the sum of its chunks'");
        }
        Ok(total)
    }

    /// The count of `text` piece by piece.
    fn count_whole(&self, text: &str, caches: &mut ThreadCaches, mut memo: Option<&mut FxHashMap<u128, u32>>) -> u32 {
        let ThreadCaches { split: cache, recent, .. } = caches;
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
            let (start, piece) = (at, &bytes[at..end]);
            at = end;
            if let Some(packed) = pack_in(bytes, start, end) {
                let slot = Recent::slot(packed);
                if recent.pieces[slot] == packed {
                    tokens += u32::from(recent.counts[slot]);
                    continue;
                }
                let n = if self.short_ranks.contains_key(packed) {
                    1
                } else if let Some(&n) = memo.as_ref().and_then(|memo| memo.get(&packed)) {
                    n
                } else {
                    let n = self.merged_parts(&bytes[start..], piece.len());
                    if let Some(memo) = memo.as_mut()
                        && memo.len() < MEMO_CAP
                    {
                        memo.insert(packed, n);
                    }
                    n
                };
                // At most one token per byte: a short piece's count fits a `u8`.
                recent.pieces[slot] = packed;
                recent.counts[slot] = n as u8;
                tokens += n;
            } else if self.long_ranks.contains_key(piece) {
                tokens += 1;
            } else if piece.len() >= LONG_PIECE {
                return Self::core().encode_ordinary(text).len() as u32;
            } else {
                tokens += self.merged_parts(&bytes[start..], piece.len());
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

/// Where a long text is cut into chunks for counting, the last end being the text's length:
/// at a [`cuts_at`] boundary at least `min` bytes into the chunk, where the few bytes that
/// follow the boundary pick it (about one in four), so that the cuts depend on the text
/// around them, not on where the text starts: two texts that differ in one place share the
/// chunks before and, from a few boundaries on, after it.
fn chunk_ends(bytes: &[u8], min: usize) -> impl Iterator<Item = usize> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= bytes.len() {
            return None;
        }
        let mut from = start + min.max(1);
        let end = loop {
            if from >= bytes.len() {
                break bytes.len();
            }
            let Some(found) = memchr::memchr(b'\n', &bytes[from - 1..]) else { break bytes.len() };
            let at = from + found;
            if at < bytes.len() && cuts_at(bytes, at) && picks(&bytes[at..]) {
                break at;
            }
            from = at + 1;
        };
        start = end;
        Some(end)
    })
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
    SPLIT_CACHE.with(|caches| O200K.count(text, &mut caches.borrow_mut(), None))
}

/// [`count`] (`Ok`), unless `past` holds for the count of a leading part of `text` (the chunks a
/// long text is counted in, [`chunk_ends`], so far): then `Err` of that part's count, the rest
/// not counted. `past` must hold for every count above one it holds for (a limit passed):
/// `Err` says it holds for the whole text's count, which is at least the part's.
pub fn count_unless(text: &str, past: &dyn Fn(u32) -> bool) -> Result<u32, u32> {
    SPLIT_CACHE.with(|caches| O200K.count_unless(text, &mut caches.borrow_mut(), None, past))
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
            "\u{0301}", "٣", "—", "\u{00a0}", "\u{2003}", "\u{0085}", "ſ", "日", "😀",
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
        /// Every boundary [`cuts_at`] names is one of the split's, and tiktoken-rs's count of a
        /// text is the sum of its counts of the chunks [`chunk_ends`] cuts it into, at any
        /// chunk size; so is this module's, through the chunk memo too.
        #[test]
        fn a_text_counts_as_the_sum_of_its_chunks(parts in proptest::collection::vec(ascii_heavy_text(), 1..8), min in 1usize..40) {
            let text = parts.join("\n");
            let (ends, _) = pieces(&text);
            for at in 1..text.len() {
                if cuts_at(text.as_bytes(), at) {
                    proptest::prop_assert!(ends.contains(&at), "no boundary at {} in {:?}", at, text);
                }
            }
            let mut start = 0;
            let mut sum = 0;
            for end in chunk_ends(text.as_bytes(), min) {
                proptest::prop_assert!(end > start && (end == text.len() || cuts_at(text.as_bytes(), end)));
                sum += count_by_tiktoken(&text[start..end]);
                start = end;
            }
            proptest::prop_assert_eq!(start, text.len());
            proptest::prop_assert_eq!(sum, count_by_tiktoken(&text), "{:?}", text);
            let long = text.repeat(CHUNKED_TEXT / text.len().max(1) + 1);
            proptest::prop_assert_eq!(count(&long), count_by_tiktoken(&long));
        }
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
        let mut counter = Counter::new();
        for _ in 0..2 {
            for text in cases {
                assert_eq!(count(text), count_by_tiktoken(text), "{text:?}");
                assert_eq!(counter.count(text), count_by_tiktoken(text), "{text:?}");
            }
        }
    }
}
