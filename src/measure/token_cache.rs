//! `bpe` (o200k) counts of texts shared by the counters of one run and kept across runs.
//!
//! A text's o200k count is a function of its bytes alone, so a count made once can serve every
//! later request, replay, session and run that holds the same text. [`SharedCounts`] is the
//! run-wide table the [`super::TokenCounter`]s consult before tokenizing (keyed like their own
//! per-counter table: the xxh3-128 of the text): the counts loaded from the cache file, read
//! only, plus the counts made during the run, behind a lock. [`TokenCache`] is that table's
//! file: read once before the run, rewritten after it when the run added counts.
//!
//! The file (`o200k-counts-v1.bin` in [`default_dir`]) is binary: an 8-byte magic, the entry
//! count (`u64`), the entries sorted by key (16-byte key, 4-byte count, little endian) and an
//! xxh3-128 of everything before it. A file that does not match (another version, a partial
//! copy, bit rot) is ignored as a whole and rewritten. Concurrent runs are safe: each writes a
//! complete file under a temporary name in the same directory and renames it over the old one,
//! so a reader sees one writer's whole file; a count lost to a concurrent writer is made again
//! next time. Using the cache changes no count, only what is tokenized again.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustc_hash::FxHashMap;

const MAGIC: &[u8; 8] = b"ctxo200k";
/// The file's name; the version changes when the key or the tokenizer does.
pub const FILE_NAME: &str = "o200k-counts-v1.bin";
const ENTRY: usize = 20;

/// The cache directory: `$CTXSIM_CACHE_DIR`, else the platform's user cache directory plus
/// `ctxsim` (`$XDG_CACHE_HOME/ctxsim` or `~/.cache/ctxsim` on Linux). `None` when neither is
/// known.
pub fn default_dir() -> Option<PathBuf> {
    match std::env::var_os("CTXSIM_CACHE_DIR") {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => dirs::cache_dir().map(|d| d.join("ctxsim")),
    }
}

/// The run-wide table of `bpe` text counts: the loaded ones and the ones made in this run.
/// Beside it, the raw counts of whole blocks made in this run (not kept in the file): the
/// what-if runs of a session send the same blocks again, each through its own counter.
#[derive(Debug, Default)]
pub struct SharedCounts {
    base: FxHashMap<u128, u32>,
    fresh: Mutex<FxHashMap<u128, u32>>,
    /// A block's raw (`bpe`) count by its content hash, as [`super::TokenCounter`] keys its
    /// own memo.
    blocks: Mutex<FxHashMap<u128, u32>>,
}

impl SharedCounts {
    pub fn new(base: FxHashMap<u128, u32>) -> SharedCounts {
        SharedCounts { base, fresh: Mutex::new(FxHashMap::default()), blocks: Mutex::new(FxHashMap::default()) }
    }

    /// The raw count of the block keyed `key`, if a counter sharing this table made it.
    pub fn block(&self, key: u128) -> Option<u32> {
        self.blocks.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied()
    }

    /// Records a block's raw count.
    pub fn insert_block(&self, key: u128, count: u32) {
        self.blocks.lock().unwrap_or_else(|e| e.into_inner()).insert(key, count);
    }

    /// The count of the text keyed `key`, if any counter of the run or an earlier run made it.
    pub fn get(&self, key: u128) -> Option<u32> {
        if let Some(&n) = self.base.get(&key) {
            return Some(n);
        }
        self.fresh.lock().unwrap_or_else(|e| e.into_inner()).get(&key).copied()
    }

    /// Records a count made in this run.
    pub fn insert(&self, key: u128, count: u32) {
        self.fresh.lock().unwrap_or_else(|e| e.into_inner()).insert(key, count);
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
        self.fresh.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Every count, sorted by key.
    fn entries(&self) -> Vec<(u128, u32)> {
        let fresh = self.fresh.lock().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<(u128, u32)> = self.base.iter().chain(fresh.iter()).map(|(k, v)| (*k, *v)).collect();
        all.sort_unstable_by_key(|(k, _)| *k);
        all.dedup_by_key(|(k, _)| *k);
        all
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
    /// Reads `dir/FILE_NAME` (a missing or invalid file gives an empty table).
    pub fn open(dir: &Path) -> (TokenCache, SharedCounts) {
        let path = dir.join(FILE_NAME);
        let (loaded, base) = match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (Loaded::Missing, FxHashMap::default()),
            Err(e) => (Loaded::Ignored(e.to_string()), FxHashMap::default()),
            Ok(bytes) => match decode(&bytes) {
                Ok(map) => (Loaded::Read(map.len()), map),
                Err(reason) => (Loaded::Ignored(reason), FxHashMap::default()),
            },
        };
        (TokenCache { path, loaded }, SharedCounts::new(base))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes every count of `counts` when the run added any or the file was not valid;
    /// returns whether it wrote.
    pub fn save(&self, counts: &SharedCounts) -> std::io::Result<bool> {
        let stale = matches!(self.loaded, Loaded::Ignored(_));
        if counts.added() == 0 && !stale {
            return Ok(false);
        }
        let dir = self.path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        let mut file = tempfile::NamedTempFile::new_in(dir)?;
        std::io::Write::write_all(&mut file, &encode(&counts.entries()))?;
        file.persist(&self.path).map_err(|e| e.error)?;
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

fn decode(bytes: &[u8]) -> Result<FxHashMap<u128, u32>, String> {
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
    let mut map = FxHashMap::with_capacity_and_hasher(n as usize, Default::default());
    for entry in body[16..].chunks_exact(ENTRY) {
        let key = u128::from_le_bytes(entry[..16].try_into().expect("16 bytes"));
        let count = u32::from_le_bytes(entry[16..].try_into().expect("4 bytes"));
        map.insert(key, count);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_round_trips_and_any_damage_is_detected() {
        let entries = vec![(1u128, 5u32), (u128::MAX, 7), (42, 0)];
        let mut sorted = entries.clone();
        sorted.sort();
        let bytes = encode(&sorted);
        let map = decode(&bytes).expect("valid");
        assert_eq!(map.len(), 3);
        assert_eq!(map[&u128::MAX], 7);
        for cut in [0, 8, 31, bytes.len() - 1] {
            assert!(decode(&bytes[..cut]).is_err(), "truncated at {cut}");
        }
        for at in [0, 9, 20, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(decode(&bad).is_err(), "flipped byte {at}");
        }
    }
}
