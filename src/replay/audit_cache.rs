//! The audit's per-session result cache: a finished session's [`SessionAudit`] kept across runs.
//!
//! Users rerun `ctxsim audit` on the same `~/.claude/projects`, where finished sessions never
//! change; replaying them again gives the same result. Each session's result is kept in the
//! cache directory the token-count cache uses ([`crate::measure::token_cache::default_dir`]),
//! under [`DIR_NAME`], one file per session and per set of options, and reused when its key
//! matches. The key is an xxh3-128 over everything that decides the result:
//! - the running executable's bytes ([`RunKey::new`]): any rebuild, hence any change of the
//!   code, the shipped model table or the shipped calibration (both compiled in), misses;
//! - the options that change a session's result ([`RunKey::new`]'s `options`: the estimator,
//!   the bytes of a `--model-table` file);
//! - the session file's path, project and id (they are printed), its bytes, and every file of
//!   its subagent directory (`<session>/subagents/`: the subagent transcripts and their
//!   `.meta.json`), names and bytes.
//!
//! Options that only shape the output (`--by`, `--format`, `--breakdown`, `--jobs`, `--shard`,
//! `--out`) are not in the key: the result of a session is the same under all of them. Token
//! counts come from texts alone, so the token-count cache is not in it either.
//!
//! An entry is a header line (`ctxsim-audit-result-v1 KEY CHECKSUM`, the checksum an xxh3-128
//! of the payload) and the payload: the serialized result (serde_json, every field, the plot
//! points included), so fields added to [`SessionAudit`] travel without a change here. An entry
//! whose key differs (the session or the binary changed) is a plain miss and is overwritten. An
//! entry that cannot be read, is not an entry, fails its checksum, does not parse or does not
//! serialize back to the same bytes (a field whose reading loses something) is recomputed with
//! a note naming the file. Writes go to a temporary file in the same directory renamed over the
//! entry, so concurrent runs never see a partial entry. Nothing removes entries of sessions
//! that are gone; an entry is at most one per session file and set of options.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::audit::{PlotPoint, SessionAudit};
use super::discover::SessionFile;

/// The cache's directory under the cache directory; the version changes with the entry format.
pub const DIR_NAME: &str = "audit-results-v1";
const MAGIC: &str = "ctxsim-audit-result-v1";

/// Adds `bytes` to `hasher` after their length, so fields cannot run into each other.
fn field(hasher: &mut Xxh3, bytes: &[u8]) {
    hasher.update(&(bytes.len() as u64).to_le_bytes());
    hasher.update(bytes);
}

/// What decides every session's result of one run besides the session's own files.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunKey {
    /// The executable and the options.
    all: u128,
    /// The options alone (names an entry: a rebuild overwrites, other options add one).
    options: u128,
}

impl RunKey {
    /// The running executable's bytes and `options` (each a field: the estimator's name, a
    /// model table file's bytes, ...).
    pub fn new(options: &[&[u8]]) -> std::io::Result<RunKey> {
        let mut opts = Xxh3::new();
        for o in options {
            field(&mut opts, o);
        }
        let options = opts.digest128();
        let mut all = Xxh3::new();
        all.update(&options.to_le_bytes());
        hash_executable(&mut all)?;
        Ok(RunKey { all: all.digest128(), options })
    }
}

/// Streams the running executable into `hasher` (`/proc/self/exe` where there is one: the
/// binary running even if its path was rebuilt meanwhile).
fn hash_executable(hasher: &mut Xxh3) -> std::io::Result<()> {
    let mut file = match std::fs::File::open("/proc/self/exe") {
        Ok(f) => f,
        Err(_) => std::fs::File::open(std::env::current_exe()?)?,
    };
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        hasher.update(&buf[..n]);
    }
}

/// The key of `file`'s result under `run`: its identity, its bytes and its subagent files'.
/// `None` when a file cannot be read (the session is then audited without the cache, and the
/// audit reports the read error).
fn session_key(run: &RunKey, file: &SessionFile) -> Option<u128> {
    let mut h = Xxh3::new();
    h.update(MAGIC.as_bytes());
    h.update(&run.all.to_le_bytes());
    field(&mut h, file.path.to_string_lossy().as_bytes());
    field(&mut h, file.project.as_bytes());
    field(&mut h, file.session_id.as_bytes());
    field(&mut h, &std::fs::read(&file.path).ok()?);
    // Every file beside the subagent transcripts, as the importer finds them
    // (`<dir>/<stem>/subagents/`), sorted by name.
    let stem = file.path.file_stem()?;
    let dir = file.path.with_file_name(stem).join("subagents");
    match std::fs::read_dir(&dir) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => h.update(b"no subagents"),
        Err(_) => return None,
        Ok(entries) => {
            let mut paths: Vec<PathBuf> = entries.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>().ok()?;
            paths.sort();
            for p in paths {
                if p.is_file() {
                    field(&mut h, p.file_name()?.to_string_lossy().as_bytes());
                    field(&mut h, &std::fs::read(&p).ok()?);
                }
            }
        }
    }
    Some(h.digest128())
}

// The engine's name is a `&'static str` in `SessionAudit` (not read back by serde, which would
// borrow it from the entry): it travels beside the audit and is matched to the engine's own name.
#[derive(Serialize)]
struct EntryOut<'a> {
    engine: &'a str,
    audit: &'a SessionAudit,
    plot: &'a [PlotPoint],
}

#[derive(Deserialize)]
struct EntryIn {
    engine: String,
    audit: SessionAudit,
    plot: Vec<PlotPoint>,
}

fn payload(audit: &SessionAudit) -> Vec<u8> {
    serde_json::to_vec(&EntryOut { engine: audit.engine, audit, plot: &audit.plot }).expect("an audit serializes")
}

/// What a lookup found.
#[derive(Debug)]
pub enum Lookup {
    /// The cached result.
    Hit(Box<SessionAudit>),
    /// No usable entry: the key to store the result under (`None`: not cacheable, a file could
    /// not be read) and, when an entry was there but unusable, the note saying so.
    Miss { key: Option<u128>, note: Option<String> },
}

/// The result cache of one run.
#[derive(Debug)]
pub struct AuditCache {
    dir: PathBuf,
    run: RunKey,
}

impl AuditCache {
    /// The cache under `cache_dir` (the token-count cache's directory) for a run keyed `run`.
    pub fn new(cache_dir: &Path, run: RunKey) -> AuditCache {
        AuditCache { dir: cache_dir.join(DIR_NAME), run }
    }

    /// The entry file of `file` (one per session file and set of options).
    pub fn entry_path(&self, file: &SessionFile) -> PathBuf {
        let mut h = Xxh3::new();
        h.update(&self.run.options.to_le_bytes());
        field(&mut h, file.path.to_string_lossy().as_bytes());
        field(&mut h, file.project.as_bytes());
        field(&mut h, file.session_id.as_bytes());
        self.dir.join(format!("{:032x}.json", h.digest128()))
    }

    /// The cached result of `file`, if its entry holds the result under the current key.
    pub fn lookup(&self, file: &SessionFile) -> Lookup {
        let Some(key) = session_key(&self.run, file) else { return Lookup::Miss { key: None, note: None } };
        let path = self.entry_path(file);
        let bytes = match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Lookup::Miss { key: Some(key), note: None },
            Err(e) => return Lookup::Miss { key: Some(key), note: Some(unusable(&path, &format!("could not be read ({e})"))) },
            Ok(b) => b,
        };
        match read_entry(&bytes, key) {
            Ok(Some(audit)) => Lookup::Hit(Box::new(audit)),
            Ok(None) => Lookup::Miss { key: Some(key), note: None },
            Err(reason) => Lookup::Miss { key: Some(key), note: Some(unusable(&path, &reason)) },
        }
    }

    /// Writes `audit` as `file`'s entry under `key` (a temporary file renamed over the entry).
    pub fn store(&self, file: &SessionFile, key: u128, audit: &SessionAudit) -> std::io::Result<()> {
        let payload = payload(audit);
        let mut bytes = format!("{MAGIC} {key:032x} {:032x}\n", xxhash_rust::xxh3::xxh3_128(&payload)).into_bytes();
        bytes.extend_from_slice(&payload);
        std::fs::create_dir_all(&self.dir)?;
        let mut tmp = tempfile::NamedTempFile::new_in(&self.dir)?;
        std::io::Write::write_all(&mut tmp, &bytes)?;
        tmp.persist(self.entry_path(file)).map_err(|e| e.error)?;
        Ok(())
    }
}

fn unusable(path: &Path, reason: &str) -> String {
    format!("note: audit result cache entry {} {reason}; the session was audited again", path.display())
}

/// The result an entry holds under `key`: `Ok(None)` for an entry of another key, `Err` (the
/// reason) for one that is damaged.
fn read_entry(bytes: &[u8], key: u128) -> Result<Option<SessionAudit>, String> {
    let newline = bytes.iter().position(|&b| b == b'\n').ok_or("has no header line")?;
    let (header, payload) = (&bytes[..newline], &bytes[newline + 1..]);
    let header = std::str::from_utf8(header).map_err(|_| "has a header that is not UTF-8".to_owned())?;
    let parts: Vec<&str> = header.split(' ').collect();
    let [magic, stored_key, sum] = parts[..] else { return Err("has a malformed header".into()) };
    if magic != MAGIC {
        return Err(format!("is not an audit result entry (header `{}`)", crate::input::excerpt(magic)));
    }
    let stored_key = u128::from_str_radix(stored_key, 16).map_err(|_| "has a malformed key".to_owned())?;
    let sum = u128::from_str_radix(sum, 16).map_err(|_| "has a malformed checksum".to_owned())?;
    if stored_key != key {
        return Ok(None);
    }
    if xxhash_rust::xxh3::xxh3_128(payload) != sum {
        return Err("fails its checksum".into());
    }
    let entry: EntryIn = serde_json::from_slice(payload).map_err(|e| format!("does not parse ({e})"))?;
    let mut audit = entry.audit;
    audit.plot = entry.plot;
    audit.engine = crate::replay::audit::Engine::named(&entry.engine).ok_or_else(|| format!("names an unknown engine `{}`", crate::input::excerpt(&entry.engine)))?.name();
    if self::payload(&audit) != payload {
        return Err("does not read back as written".into());
    }
    Ok(Some(audit))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_floats_survive_and_damage_is_named() {
        // 17-digit values that serde_json's default parser may read one ulp off.
        let mut audit: SessionAudit = serde_json::from_str(r#"{"engine":"agent","audit":{"project":"p","session_id":"s","path":"x","first":null,"last":null,"versions":[],"models":[],"calls":1,"billed":{"tokens":{"input":1,"output":2,"cache_write_5m":3,"cache_write_1h":4,"cache_read":5},"cost_usd":0.1,"calls":1,"by_model":{},"unpriced":{}},"breaks":{},"lost":{"breaks":0,"tokens":0,"cost_usd":0.0},"ttl_written":{"ephemeral_5m_input_tokens":0,"ephemeral_1h_input_tokens":0},"ttl":"5m","compactions":[],"whatifs":[],"best_whatif":null,"days":{},"warnings":[]},"plot":[]}"#)
            .map(|e: EntryIn| SessionAudit { engine: "agent", ..e.audit })
            .unwrap();
        let mut x = 0.1f64;
        for k in 0..2000 {
            x = x * 1.000_000_7 + 1e-9 * k as f64;
            audit.billed.cost_usd = x;
            audit.lost.cost_usd = x / 3.0;
            let p = payload(&audit);
            let mut bytes = format!("{MAGIC} {:032x} {:032x}\n", 7u128, xxhash_rust::xxh3::xxh3_128(&p)).into_bytes();
            bytes.extend_from_slice(&p);
            let back = read_entry(&bytes, 7).unwrap().unwrap();
            assert_eq!(back.billed.cost_usd.to_bits(), x.to_bits());
            assert_eq!(back, audit);
            assert_eq!(read_entry(&bytes, 8).unwrap(), None, "another key is a miss");
            let mut bad = bytes.clone();
            let last = bad.len() - 2;
            bad[last] ^= 1;
            assert_eq!(read_entry(&bad, 7).unwrap_err(), "fails its checksum");
        }
        assert!(read_entry(b"garbage", 7).unwrap_err().contains("header"));
    }
}
