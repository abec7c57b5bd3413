//! `bpe` (o200k) counts of texts shared by the counters of one run and kept across runs.
//!
//! A text's o200k count is a function of its bytes alone, so a count made once can serve every
//! later request, replay, session and run that holds the same text. [`SharedCounts`] is the
//! run-wide table the [`super::TokenCounter`]s consult before tokenizing (keyed like their own
//! per-counter table: the xxh3-128 of the text): the counts loaded from the cache file, read
//! only, plus the counts made during the run, behind a lock. [`TokenCache`] is that table's
//! file: read once before the run, written whenever the run has made [`Limits::fresh`] counts
//! and after it when it made any.
//!
//! Every table here is bounded ([`Limits`]), so a run over thousands of sessions holds no more
//! than a run over a few: counts made are written out and dropped when the limit is reached,
//! the whole-block counts are emptied, and the file keeps at most [`Limits::file`] counts (the
//! ones the last run made and used first).
//!
//! The file (`o200k-counts-v1.bin` in [`default_dir`]) is binary: an 8-byte magic, the entry
//! count (`u64`), the entries sorted by key (16-byte key, 4-byte count, little endian) and an
//! xxh3-128 of everything before it. A file that does not match (another version, a partial
//! copy, bit rot) is ignored as a whole and rewritten. Concurrent runs are safe: each writes a
//! complete file under a temporary name in the same directory and renames it over the old one,
//! so a reader sees one writer's whole file; each writer merges the counts it made into the
//! file it finds, and a count lost to a concurrent writer is made again next time. Using the
//! cache changes no count, only what is tokenized again.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use rustc_hash::FxHashMap;

const MAGIC: &[u8; 8] = b"ctxo200k";
/// The file's name; the version changes when the key or the tokenizer does.
pub const FILE_NAME: &str = "o200k-counts-v1.bin";
const ENTRY: usize = 20;

/// How large the tables may grow, so that a run's memory does not grow with the number of
/// sessions it audits (issue 15, deliverable 4): every table here holds counts that can be made
/// again, so a full one is emptied or written out, never grown. Only speed depends on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Counts made in this run held in memory before they are written to the file (or, with no
    /// file, forgotten): 2^18 entries, about 12 MB of table.
    pub fresh: usize,
    /// Whole-block counts held before the table is emptied: 2^18 entries.
    pub blocks: usize,
    /// Counts the file keeps (and a run loads): 2^21 entries, 42 MB of file, the texts of some
    /// thousands of sessions. Beyond it, the counts neither made nor used by the run that
    /// writes are left out.
    pub file: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { fresh: 1 << 18, blocks: 1 << 18, file: 1 << 21 }
    }
}

/// The cache directory: `$CTXSIM_CACHE_DIR`, else the platform's user cache directory plus
/// `ctxsim` (`$XDG_CACHE_HOME/ctxsim` or `~/.cache/ctxsim` on Linux). `None` when neither is
/// known.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os("CTXSIM_CACHE_DIR") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => dirs::cache_dir().map(|d| d.join("ctxsim")),
    }
}

/// The counts loaded from the file, sorted by key (20 bytes each), with one bit per count set
/// when the run used it.
#[derive(Debug, Default)]
struct Base {
    keys: Vec<u128>,
    counts: Vec<u32>,
    used: Vec<AtomicU64>,
}

impl Base {
    fn new(keys: Vec<u128>, counts: Vec<u32>) -> Base {
        let used = (0..keys.len().div_ceil(64)).map(|_| AtomicU64::new(0)).collect();
        Base { keys, counts, used }
    }

    fn len(&self) -> usize {
        self.keys.len()
    }

    fn get(&self, key: u128) -> Option<u32> {
        let at = find(&self.keys, key)?;
        self.used[at / 64].fetch_or(1 << (at % 64), Ordering::Relaxed);
        Some(self.counts[at])
    }

    fn was_used(&self, at: usize) -> bool {
        self.used[at / 64].load(Ordering::Relaxed) & (1 << (at % 64)) != 0
    }
}

/// The index of `key` in `keys` (sorted, the xxh3-128 of texts, so spread evenly): a guess from
/// the key's value, then an exponential search from it.
fn find(keys: &[u128], key: u128) -> Option<usize> {
    let n = keys.len();
    if n == 0 {
        return None;
    }
    let guess = ((((key >> 64) * n as u128) >> 64) as usize).min(n - 1);
    let (lo, hi) = if keys[guess] < key {
        // Every key up to `guess + bound / 2` is below `key`.
        let mut bound = 1;
        while guess + bound < n && keys[guess + bound] < key {
            bound *= 2;
        }
        (guess + bound / 2 + 1, (guess + bound + 1).min(n))
    } else {
        // Every key from `guess - bound / 2` on is at or above `key`.
        let mut bound = 1;
        while bound <= guess && keys[guess - bound] > key {
            bound *= 2;
        }
        (guess.saturating_sub(bound), guess - bound / 2 + 1)
    };
    keys[lo..hi].binary_search(&key).ok().map(|i| lo + i)
}

/// The run-wide table of `bpe` text counts: the loaded ones and the ones made in this run.
/// Beside it, the raw counts of whole blocks made in this run (not kept in the file): the
/// what-if runs of a session send the same blocks again, each through its own counter.
/// Bounded by [`Limits`]: with a file ([`TokenCache::open`]), the counts made are written to it
/// whenever [`Limits::fresh`] of them are held, and then dropped from memory.
#[derive(Debug, Default)]
pub struct SharedCounts {
    base: Base,
    fresh: Mutex<FxHashMap<u128, u32>>,
    /// A block's raw (`bpe`) count by its content hash, as [`super::TokenCounter`] keys its
    /// own memo.
    blocks: Mutex<FxHashMap<u128, u32>>,
    limits: Limits,
    /// The file the counts made are written to, and the first error writing it.
    spill: Option<Spill>,
    /// Counts made in this run, also those already written out.
    added: AtomicUsize,
}

#[derive(Debug)]
struct Spill {
    path: PathBuf,
    /// Held while the file is rewritten, so two writers of one run do not interleave.
    writing: Mutex<Option<String>>,
    /// Whether this run wrote the file already.
    wrote: std::sync::atomic::AtomicBool,
}

impl SharedCounts {
    /// A table with no file and other [`Limits`] (for tests of the bounds).
    pub fn with_limits(limits: Limits) -> SharedCounts {
        SharedCounts { limits, ..SharedCounts::default() }
    }

    /// The raw count of the block keyed `key`, if a counter sharing this table made it.
    pub fn block(&self, key: u128) -> Option<u32> {
        self.blocks.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied()
    }

    /// Records a block's raw count; a full table is emptied first.
    pub fn insert_block(&self, key: u128, count: u32) {
        let mut blocks = self.blocks.lock().unwrap_or_else(|e| e.into_inner());
        if blocks.len() >= self.limits.blocks {
            blocks.clear();
        }
        blocks.insert(key, count);
    }

    /// The count of the text keyed `key`, if any counter of the run or an earlier run made it.
    pub fn get(&self, key: u128) -> Option<u32> {
        if let Some(n) = self.base.get(key) {
            return Some(n);
        }
        self.fresh.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied()
    }

    /// Records a count made in this run. When [`Limits::fresh`] counts are held already, those
    /// are written to the file (if any) and dropped from memory first.
    pub fn insert(&self, key: u128, count: u32) {
        let full = {
            let mut fresh = self.fresh.lock().unwrap_or_else(|e| e.into_inner());
            let full = (fresh.len() >= self.limits.fresh && !fresh.contains_key(&key)).then(|| std::mem::take(&mut *fresh));
            if fresh.insert(key, count).is_none() {
                self.added.fetch_add(1, Ordering::Relaxed);
            }
            full
        };
        if let Some(full) = full {
            if let Some(spill) = &self.spill {
                let mut error = spill.writing.lock().unwrap_or_else(|e| e.into_inner());
                match self.write(&spill.path, full) {
                    Ok(()) => spill.wrote.store(true, Ordering::Relaxed),
                    Err(e) => {
                        error.get_or_insert_with(|| e.to_string());
                    }
                }
            }
        }
    }

    /// `bpe(text)` (keyed `key`, its xxh3-128) from this table, else tokenized and recorded.
    pub fn bpe(&self, key: u128, text: &str) -> u32 {
        if let Some(n) = self.get(key) {
            return n;
        }
        let n = super::tokens::bpe(text);
        self.insert(key, n);
        n
    }

    /// Counts loaded from the file.
    pub fn loaded(&self) -> usize {
        self.base.len()
    }

    /// Counts made in this run.
    pub fn added(&self) -> usize {
        self.added.load(Ordering::Relaxed)
    }

    /// Counts held in memory: the loaded ones, the ones made and not yet written out, and the
    /// whole-block counts.
    pub fn held(&self) -> usize {
        self.base.len() + self.fresh.lock().unwrap_or_else(|e| e.into_inner()).len() + self.blocks.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Rewrites `path` with `made` and the counts already there, at most [`Limits::file`] of
    /// them: those made first, then those in the file this run did not load (written by it
    /// earlier, or by another run), then the loaded ones it used, then the others by key.
    fn write(&self, path: &Path, made: FxHashMap<u128, u32>) -> std::io::Result<()> {
        let on_disk = match std::fs::read(path) {
            Ok(bytes) => decode(&bytes).unwrap_or_default(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e),
        };
        let limit = self.limits.file;
        // Rank 0 is kept first; within a rank, by key.
        let mut ranked: Vec<(u8, u128, u32)> = made.into_iter().map(|(k, n)| (0, k, n)).collect();
        for (key, n) in on_disk {
            let rank = match find(&self.base.keys, key) {
                None => 1,
                Some(at) if self.base.was_used(at) => 2,
                Some(_) => 3,
            };
            ranked.push((rank, key, n));
        }
        ranked.sort_unstable_by_key(|&(rank, key, _)| (key, rank));
        ranked.dedup_by_key(|&mut (_, key, _)| key);
        if ranked.len() > limit {
            ranked.sort_unstable_by_key(|&(rank, key, _)| (rank, key));
            ranked.truncate(limit);
        }
        let mut entries: Vec<(u128, u32)> = ranked.into_iter().map(|(_, k, n)| (k, n)).collect();
        entries.sort_unstable_by_key(|&(k, _)| k);
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut file = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut file, &encode(&entries))?;
        file.persist(path).map_err(|e| e.error)?;
        Ok(())
    }
}

/// `bpe(text)`, from `shared` when the run has a table ([`super::TokenCounter::shared`]): for
/// texts counted outside any counter (the label of a filler text, [`crate::replay::session`]),
/// so that with counts from an earlier run a text counted then needs no tokenizer built.
pub fn bpe_shared(shared: Option<&SharedCounts>, text: &str) -> u32 {
    match shared {
        Some(counts) => counts.bpe(xxhash_rust::xxh3::xxh3_128(text.as_bytes()), text),
        None => super::tokens::bpe(text),
    }
}

/// How a cache file was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Loaded {
    /// No file yet.
    Missing,
    /// Read with this many counts.
    Read(usize),
    /// Present but not a valid cache file (the reason): ignored, rewritten after the run.
    Ignored(String),
}

/// The cache file of [`SharedCounts`].
#[derive(Debug)]
pub struct TokenCache {
    path: PathBuf,
    pub loaded: Loaded,
}

impl TokenCache {
    /// Reads `dir/FILE_NAME` (a missing or invalid file gives an empty table); the table
    /// writes the counts it makes back to it.
    pub fn open(dir: &Path) -> (TokenCache, SharedCounts) {
        TokenCache::open_with(dir, Limits::default())
    }

    /// [`TokenCache::open`] under other [`Limits`] (a file with more counts than
    /// [`Limits::file`] loads the first ones by key).
    pub fn open_with(dir: &Path, limits: Limits) -> (TokenCache, SharedCounts) {
        let path = dir.join(FILE_NAME);
        let (loaded, mut entries) = match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Loaded::Missing, Vec::new()),
            Err(e) => (Loaded::Ignored(e.to_string()), Vec::new()),
            Ok(bytes) => match decode(&bytes) {
                Ok(entries) => (Loaded::Read(entries.len()), entries),
                Err(reason) => (Loaded::Ignored(reason), Vec::new()),
            },
        };
        entries.truncate(limits.file);
        let (keys, counts) = entries.into_iter().unzip();
        let spill = Spill { path: path.clone(), writing: Mutex::new(None), wrote: Default::default() };
        let counts = SharedCounts { base: Base::new(keys, counts), limits, spill: Some(spill), ..SharedCounts::default() };
        (TokenCache { path, loaded }, counts)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the counts `counts` holds that are not yet in the file, when there are any or
    /// the file was not valid; returns whether the file was written during or after the run.
    /// An error writing it during the run (when [`Limits::fresh`] counts were held) is
    /// returned here.
    pub fn save(&self, counts: &SharedCounts) -> std::io::Result<bool> {
        let Some(spill) = &counts.spill else { return Ok(false) };
        let mut error = spill.writing.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(e) = error.take() {
            return Err(std::io::Error::other(e));
        }
        let made = std::mem::take(&mut *counts.fresh.lock().unwrap_or_else(|e| e.into_inner()));
        let stale = matches!(self.loaded, Loaded::Ignored(_)) && !spill.wrote.load(Ordering::Relaxed);
        if made.is_empty() && !stale {
            return Ok(spill.wrote.load(Ordering::Relaxed));
        }
        counts.write(&self.path, made)?;
        Ok(true)
    }
}

fn encode(entries: &[(u128, u32)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + entries.len() * ENTRY + 16);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for (key, count) in entries {
        out.extend_from_slice(&key.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
    }
    let sum = xxhash_rust::xxh3::xxh3_128(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// The entries of a cache file, sorted by key (a file out of order or with a key twice is
/// not one this module wrote, and is refused).
fn decode(bytes: &[u8]) -> Result<Vec<(u128, u32)>, String> {
    if bytes.len() < 32 || &bytes[..8] != MAGIC {
        return Err("not a ctxsim token-count cache (magic)".into());
    }
    let (body, sum) = bytes.split_at(bytes.len() - 16);
    let n = u64::from_le_bytes(body[8..16].try_into().expect("8 bytes"));
    if n.checked_mul(ENTRY as u64).and_then(|b| b.checked_add(16)) != Some(body.len() as u64) {
        return Err(format!("length {} does not hold the {n} counts it announces", bytes.len()));
    }
    if xxhash_rust::xxh3::xxh3_128(body).to_le_bytes() != sum {
        return Err("checksum mismatch".into());
    }
    let mut entries = Vec::with_capacity(n as usize);
    for entry in body[16..].chunks_exact(ENTRY) {
        let key = u128::from_le_bytes(entry[..16].try_into().expect("16 bytes"));
        let count = u32::from_le_bytes(entry[16..].try_into().expect("4 bytes"));
        if entries.last().is_some_and(|&(last, _)| last >= key) {
            return Err("counts out of key order".into());
        }
        entries.push((key, count));
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_file_round_trips_and_any_damage_is_detected() {
        let entries = vec![(1u128, 5u32), (u128::MAX, 7), (42, 0)];
        let mut sorted = entries.clone();
        sorted.sort();
        let bytes = encode(&sorted);
        let read = decode(&bytes).expect("valid");
        assert_eq!(read, sorted);
        for cut in [0, 8, 31, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        for at in [0, 9, 20, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(decode(&bad).is_err(), "flipped byte {at}");
        }
        // Out of key order: refused, though its checksum is right.
        assert!(decode(&encode(&[(42, 0), (1, 5)])).unwrap_err().contains("order"));
    }

    proptest! {
        /// The guessed search finds what a binary search finds, for keys spread evenly or not.
        #[test]
        fn find_agrees_with_a_binary_search(mut keys in proptest::collection::vec(any::<u128>(), 0..300), low in proptest::collection::vec(0u128..64, 0..40), probes in proptest::collection::vec(any::<u128>(), 0..20), shift in 0u32..128) {
            keys.extend(low);
            let keys: Vec<u128> = keys.into_iter().map(|k| k >> shift).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
            for probe in probes.iter().map(|p| p >> shift).chain(keys.iter().copied()).chain([0, u128::MAX]) {
                prop_assert_eq!(find(&keys, probe), keys.binary_search(&probe).ok(), "probe {}", probe);
            }
        }
    }

    /// With no file, the tables never hold more than their limits, and every count they give
    /// is the one recorded.
    #[test]
    fn the_tables_stay_within_their_limits() {
        let limits = Limits { fresh: 5, blocks: 3, file: 10 };
        let counts = SharedCounts::with_limits(limits);
        for key in 0..100u128 {
            counts.insert(key, key as u32 * 3);
            counts.insert_block(key, key as u32 * 7);
            assert!(counts.held() <= limits.fresh + limits.blocks, "{} held", counts.held());
            assert_eq!(counts.get(key), Some(key as u32 * 3));
            assert_eq!(counts.block(key), Some(key as u32 * 7));
        }
        for key in 0..100u128 {
            assert!(counts.get(key).is_none_or(|n| n == key as u32 * 3));
            assert!(counts.block(key).is_none_or(|n| n == key as u32 * 7));
        }
        assert_eq!(counts.added(), 100);
    }

    /// With a file, held counts are written out whenever the limit is reached, so none made is
    /// lost while the file has room; past its limit the file keeps the counts made and used by
    /// the last run first.
    #[test]
    fn counts_spill_to_the_file_and_the_file_keeps_what_the_last_run_made_and_used() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits { fresh: 4, blocks: 4, file: 30 };
        let key = |i: u64| ((i as u128).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)) | 1;
        // First run: 20 counts, written out in pieces of 4 during the run.
        let (cache, counts) = TokenCache::open_with(dir.path(), limits);
        assert_eq!(cache.loaded, Loaded::Missing);
        for i in 0..20 {
            counts.insert(key(i), i as u32);
            assert!(counts.held() <= limits.fresh);
        }
        assert!(cache.save(&counts).unwrap());
        let (cache, counts) = TokenCache::open_with(dir.path(), limits);
        assert_eq!(cache.loaded, Loaded::Read(20));
        for i in 0..20 {
            assert_eq!(counts.get(key(i)), Some(i as u32));
        }
        // Nothing new: not rewritten.
        assert!(!cache.save(&counts).unwrap());
        // Second run: uses counts 0..5, makes 20..40; the file keeps 30: the 20 made, the 5
        // used, then 5 of the others.
        let (cache, counts) = TokenCache::open_with(dir.path(), limits);
        for i in 0..5 {
            assert_eq!(counts.get(key(i)), Some(i as u32));
        }
        for i in 20..40 {
            counts.insert(key(i), i as u32);
        }
        assert!(cache.save(&counts).unwrap());
        let (cache, counts) = TokenCache::open_with(dir.path(), limits);
        assert_eq!(cache.loaded, Loaded::Read(30));
        for i in (0..5).chain(20..40) {
            assert_eq!(counts.get(key(i)), Some(i as u32), "count {i} kept");
        }
        let others = (5..20).filter(|&i| counts.get(key(i)).is_some()).count();
        assert_eq!(others, 5);
    }
}
