//! The virtual filesystem the agent reads and writes. Paths are absolute POSIX strings; all
//! listings are sorted; mtimes come from the virtual clock; writes are journaled so the agent can
//! ask "which files changed since t" (the way Claude Code notices files edited behind its back).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use globset::GlobBuilder;

use super::clock::Clock;
use super::error::WorldError;

/// One file: its text and the virtual time it was last written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Shared: a copy of the tree (a run's checkpoint) copies no file's text.
    pub contents: crate::api::SharedText,
    /// Virtual ms relative to the clock's start; negative for files older than the session.
    pub mtime_ms: i64,
}

/// One entry of a directory listing or a walk.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct DirEntry {
    /// Absolute path.
    pub path: String,
    /// Last path component.
    pub name: String,
    pub is_dir: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum ChangeKind {
    /// Created or overwritten (including edits).
    Write,
    Remove,
}

/// One journaled change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub path: String,
    pub time_ms: u64,
    pub kind: ChangeKind,
}

/// What [`VirtualFs::load_from_dir`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    pub files_loaded: usize,
    /// Virtual paths of files skipped because they are not UTF-8 text (sorted).
    pub skipped_binary: Vec<String>,
}

/// An in-memory tree of text files.
///
/// Directories are implicit (every ancestor of a file exists) or explicit (created by
/// [`VirtualFs::create_dir`]); `/` always exists.
#[derive(Debug, Clone, Default)]
pub struct VirtualFs {
    files: BTreeMap<String, FileEntry>,
    dirs: BTreeSet<String>,
    journal: Vec<Change>,
    /// Every file path whose entry was set or removed (seeds too, unlike the journal), in the
    /// order it happened, and which tree it counts: [`VirtualFs::files_changed_since`].
    changes: ChangeLog,
    /// How many times the explicit directories changed (made or removed): what `changes`
    /// does not show ([`TreeMark`]).
    dir_changes: usize,
    /// Values derived from the tree ([`VirtualFs::derived`]), dropped by every change.
    derived: Derived,
    /// Values derived from what a computation read of the tree, with what it read
    /// ([`VirtualFs::derived_by_reads`]): kept through changes and copies, and taken again
    /// where the tree still reads the same.
    by_reads: Derived,
}

/// The reads of a tree a computation made, and what they gave: [`VirtualFs::derived_by_reads`].
#[derive(Debug, Default)]
struct ReadLog {
    files: Vec<(String, Option<String>)>,
    walks: Vec<(String, Option<Vec<DirEntry>>)>,
    listings: Vec<(String, Option<Vec<DirEntry>>)>,
    /// Where a tree stood when it last answered every read alike ([`ReadLog::holds_in`]); a
    /// log is shared by the copies of a tree, each of which may set it (a mark names its tree).
    held_at: std::sync::Mutex<Option<TreeMark>>,
}

impl ReadLog {
    /// Whether `fs` answers every read as the tree the log was made on did. Where `fs` is the
    /// tree it last held in, changed since only in files none of the reads reaches, it does
    /// without reading again (the agent checks its skills at every step, and a step changes
    /// a file or two elsewhere).
    fn holds_in(&self, fs: &VirtualFs) -> bool {
        let mut held_at = self.held_at.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let untouched = held_at.and_then(|mark| fs.files_changed_since_tree(mark)).is_some_and(|changed| changed.iter().all(|path| !self.reaches(path)));
        let holds = if untouched {
            debug_assert!(self.answers_alike(fs), "reads no change reached answer otherwise");
            true
        } else {
            self.answers_alike(fs)
        };
        *held_at = holds.then(|| fs.tree_mark());
        holds
    }

    /// Every read answered now as it was.
    fn answers_alike(&self, fs: &VirtualFs) -> bool {
        self.files.iter().all(|(path, found)| fs.read(path).ok() == found.as_deref())
            && self.walks.iter().all(|(dir, found)| fs.walk(dir).ok().as_ref() == found.as_ref())
            && self.listings.iter().all(|(dir, found)| fs.list_dir(dir).ok().as_ref() == found.as_ref())
    }

    /// A change of the file at `changed` (a normal path) may answer one of the reads otherwise:
    /// it is a file read, or a directory listed or walked or anything under one.
    fn reaches(&self, changed: &str) -> bool {
        // The paths are logged normalized ([`logged_path`]); one that does not normalize
        // reaches nothing (it answers an error whatever the tree holds), or is taken to.
        let under = |dir: &str| dir == "/" || changed.strip_prefix(dir).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
        self.files.iter().any(|(path, _)| path == changed) || self.walks.iter().chain(&self.listings).any(|(dir, _)| under(dir))
    }
}

/// A path read as a [`ReadLog`] keeps it: normalized (it reads the same, and a change's path
/// compares with it as it is), or as given where it does not normalize.
fn logged_path(path: &str) -> String {
    normalized(path).map(Cow::into_owned).unwrap_or_else(|_| path.to_owned())
}

/// Where a tree's changes stand, its explicit directories' included ([`ReadLog::holds_in`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TreeMark {
    files: ChangeMark,
    dirs: usize,
}

/// An answer of [`VirtualFs::is_dir`] kept with where the tree stood ([`VirtualFs::is_dir_kept`]).
#[derive(Debug, Clone)]
pub struct DirAnswer {
    /// The path asked about, normalized.
    normalized: String,
    mark: TreeMark,
    is_dir: bool,
}

/// Answers about a tree by a key, each borne on only by the files and explicit directories
/// whose path holds `fragment`: kept while no such file is set or removed and no explicit
/// directory is made or removed ([`VirtualFs::answers_kept`]). A copy starts empty: a copied
/// tree takes another mark, which would drop them at their first use anyway.
#[derive(Debug)]
pub struct FragmentAnswers<T> {
    fragment: &'static str,
    /// Where the tree stood when the answers were last brought up to date.
    mark: Option<TreeMark>,
    answers: rustc_hash::FxHashMap<String, T>,
}

impl<T> FragmentAnswers<T> {
    pub fn new(fragment: &'static str) -> Self {
        FragmentAnswers { fragment, mark: None, answers: rustc_hash::FxHashMap::default() }
    }
}

impl<T> Clone for FragmentAnswers<T> {
    fn clone(&self) -> Self {
        FragmentAnswers::new(self.fragment)
    }
}

/// A tree as a computation of [`VirtualFs::derived_by_reads`] reads it: every read is noted
/// with what it gave (none when made by [`Reads::untracked`]).
pub struct Reads<'a> {
    fs: &'a VirtualFs,
    log: Option<std::cell::RefCell<ReadLog>>,
}

impl<'a> Reads<'a> {
    /// `fs` read without noting anything.
    pub fn untracked(fs: &'a VirtualFs) -> Self {
        Reads { fs, log: None }
    }

    pub fn read(&self, path: &str) -> Result<&'a str, WorldError> {
        let found = self.fs.read(path);
        if let Some(log) = &self.log {
            log.borrow_mut().files.push((logged_path(path), found.as_ref().ok().map(|text| (*text).to_owned())));
        }
        found
    }

    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, WorldError> {
        let found = self.fs.list_dir(path);
        if let Some(log) = &self.log {
            log.borrow_mut().listings.push((logged_path(path), found.as_ref().ok().cloned()));
        }
        found
    }

    pub fn walk(&self, path: &str) -> Result<Vec<DirEntry>, WorldError> {
        let found = self.fs.walk(path);
        if let Some(log) = &self.log {
            log.borrow_mut().walks.push((logged_path(path), found.as_ref().ok().cloned()));
        }
        found
    }
}

/// Values computed from a [`VirtualFs`]'s tree, by the name their caller gives them: the agent
/// reads the same directories again at every step (its skills, parsed from `SKILL.md` files),
/// and between two changes of the tree it reads the same. Every method that changes the tree
/// (`&mut self`) empties it first, so a value is only ever read back from the tree it was
/// computed from; a copy of the fs copies it (the values are shared, an `Arc`). Behind a mutex
/// because the agent reads the fs through `&`; nothing here is output, so its order is
/// immaterial.
#[derive(Default)]
struct Derived(std::sync::Mutex<BTreeMap<String, std::sync::Arc<dyn std::any::Any + Send + Sync>>>);

impl Derived {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, std::sync::Arc<dyn std::any::Any + Send + Sync>>> {
        // (A panic while it was held left the map as it was: nothing is computed under the lock.)
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn clear(&mut self) {
        self.0.get_mut().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
    }
}

impl Clone for Derived {
    fn clone(&self) -> Self {
        Derived(std::sync::Mutex::new(self.map().clone()))
    }
}

impl std::fmt::Debug for Derived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Derived({} values)", self.map().len())
    }
}

/// A mark of how far a tree's changes went ([`VirtualFs::change_mark`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeMark {
    lineage: u64,
    count: usize,
}

/// The file paths a tree set or removed, in order, under a number naming the tree: a new fs and
/// every copy of one take a new number (two copies may then change apart), so a [`ChangeMark`]
/// only ever counts the changes of the tree it was taken from. The number is never output.
///
/// A copy holds none of the paths: no mark of its tree counts a change made before the copy,
/// so its list starts empty, after the `before` changes it copied (a run's checkpoints copy
/// the fs; the list grows with every write of the run). Debug builds keep every path as well
/// and compare.
struct ChangeLog {
    lineage: u64,
    before: usize,
    paths: Vec<String>,
    #[cfg(debug_assertions)]
    all: Vec<String>,
}

impl ChangeLog {
    fn push(&mut self, path: String) {
        #[cfg(debug_assertions)]
        self.all.push(path.clone());
        self.paths.push(path);
    }

    /// How many changes the tree went through.
    fn count(&self) -> usize {
        self.before + self.paths.len()
    }

    /// The paths from change `count` on, for a count this tree's mark gave (never before the
    /// copy it began as); `None` for any other.
    fn since(&self, count: usize) -> Option<&[String]> {
        let paths = count.checked_sub(self.before).and_then(|k| self.paths.get(k..));
        #[cfg(debug_assertions)]
        debug_assert!(paths.is_none_or(|paths| self.all.get(count..) == Some(paths)), "the changes since a mark differ from the whole list's");
        paths
    }
}

impl Default for ChangeLog {
    fn default() -> Self {
        ChangeLog {
            lineage: crate::shared::fresh_stamp(),
            before: 0,
            paths: Vec::new(),
            #[cfg(debug_assertions)]
            all: Vec::new(),
        }
    }
}

impl Clone for ChangeLog {
    fn clone(&self) -> Self {
        ChangeLog {
            lineage: crate::shared::fresh_stamp(),
            before: self.count(),
            paths: Vec::new(),
            #[cfg(debug_assertions)]
            all: self.all.clone(),
        }
    }
}

impl std::fmt::Debug for ChangeLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ChangeLog({} changes)", self.count())
    }
}

impl VirtualFs {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a file as part of the initial state: sets its mtime but is not journaled, so the
    /// starting tree never shows up as "changed".
    pub fn seed(&mut self, path: &str, contents: impl Into<String>, clock: &Clock) -> Result<(), WorldError> {
        self.derived.clear();
        let path = self.writable_path(path)?;
        self.changes.push(path.clone());
        self.files.insert(path, FileEntry { contents: contents.into().into(), mtime_ms: clock.now_ms() as i64 });
        Ok(())
    }

    /// [`Self::seed`] with a given modification time (a scenario's `world.files[].mtime`).
    pub fn seed_at(&mut self, path: &str, contents: impl Into<String>, mtime_ms: i64) -> Result<(), WorldError> {
        self.derived.clear();
        let path = self.writable_path(path)?;
        self.changes.push(path.clone());
        self.files.insert(path, FileEntry { contents: contents.into().into(), mtime_ms });
        Ok(())
    }

    pub fn read(&self, path: &str) -> Result<&str, WorldError> {
        self.entry(path).map(|e| e.contents.as_str())
    }

    /// The file with its mtime.
    pub fn entry(&self, path: &str) -> Result<&FileEntry, WorldError> {
        let path = normalized(path)?;
        match self.files.get(path.as_ref()) {
            Some(entry) => Ok(entry),
            None if self.is_dir(&path) => Err(WorldError::IsADirectory { path: path.into_owned() }),
            None => Err(WorldError::NotFound { path: path.into_owned() }),
        }
    }

    /// Creates or overwrites a file, stamping it with the clock's time and journaling the write.
    pub fn write(&mut self, path: &str, contents: impl Into<crate::api::SharedText>, clock: &Clock) -> Result<(), WorldError> {
        self.derived.clear();
        let path = self.writable_path(path)?;
        let time_ms = clock.now_ms();
        self.files.insert(path.clone(), FileEntry { contents: contents.into(), mtime_ms: time_ms as i64 });
        self.changes.push(path.clone());
        self.journal.push(Change { path, time_ms, kind: ChangeKind::Write });
        Ok(())
    }

    /// Replaces `old` by `new` the way the Edit tool does: `old` must occur exactly once unless
    /// `replace_all`. Returns the number of replacements.
    pub fn edit(&mut self, path: &str, old: &str, new: &str, replace_all: bool, clock: &Clock) -> Result<usize, WorldError> {
        let path = normalize_path(path)?;
        let contents = self.read(&path)?;
        let count = if old.is_empty() { 0 } else { contents.matches(old).count() };
        match count {
            0 => return Err(WorldError::EditNoMatch { path }),
            1 => {}
            _ if replace_all => {}
            _ => return Err(WorldError::EditAmbiguous { path, count }),
        }
        let updated = contents.replace(old, new);
        self.write(&path, updated, clock)?;
        Ok(count)
    }

    /// Removes a file, or a directory with everything under it. Each removed file is journaled.
    pub fn remove(&mut self, path: &str, clock: &Clock) -> Result<(), WorldError> {
        self.derived.clear();
        let path = normalize_path(path)?;
        let time_ms = clock.now_ms();
        if self.files.remove(&path).is_some() {
            self.changes.push(path.clone());
            self.journal.push(Change { path, time_ms, kind: ChangeKind::Remove });
            return Ok(());
        }
        if !self.is_dir(&path) || path == "/" {
            return Err(WorldError::NotFound { path });
        }
        let prefix = dir_prefix(&path);
        let doomed: Vec<String> = self.files.range(prefix.clone()..).map(|(p, _)| p).take_while(|p| p.starts_with(&prefix)).cloned().collect();
        for file in doomed {
            self.files.remove(&file);
            self.changes.push(file.clone());
            self.journal.push(Change { path: file, time_ms, kind: ChangeKind::Remove });
        }
        self.dirs.retain(|d| d != &path && !d.starts_with(&prefix));
        self.dir_changes += 1;
        Ok(())
    }

    /// Creates a directory (and its ancestors) explicitly, so it exists while empty.
    pub fn create_dir(&mut self, path: &str) -> Result<(), WorldError> {
        self.derived.clear();
        let path = normalize_path(path)?;
        if self.files.contains_key(&path) || ancestors(&path).any(|a| self.files.contains_key(a)) {
            return Err(WorldError::NotADirectory { path });
        }
        self.dirs.insert(path);
        self.dir_changes += 1;
        Ok(())
    }

    /// The value `compute` gives for this tree, kept under `key` until the tree changes: a
    /// value read back is one `compute` gave for the tree as it is. `key` must name everything
    /// `compute` reads besides the fs (its arguments), and one key always one type.
    pub fn derived<T: Clone + Send + Sync + 'static>(&self, key: &str, compute: impl FnOnce(&Self) -> T) -> T {
        if let Some(value) = self.derived.map().get(key).and_then(|v| v.downcast_ref::<T>()) {
            return value.clone();
        }
        let value = compute(self);
        self.derived.map().insert(key.to_owned(), std::sync::Arc::new(value.clone()));
        value
    }

    /// [`VirtualFs::derived`] for a value computed only from what `compute` reads through its
    /// [`Reads`]: besides being kept until the tree changes, the value is kept with what was read
    /// (through changes and copies of the tree), and a tree that answers every one of those
    /// reads the same takes it again without computing. `compute` must read the tree only
    /// through its `Reads`; `key` as for [`VirtualFs::derived`].
    pub fn derived_by_reads<T: Clone + std::fmt::Debug + Send + Sync + 'static>(&self, key: &str, compute: impl FnOnce(&Reads<'_>) -> T) -> T {
        if let Some(value) = self.derived.map().get(key).and_then(|v| v.downcast_ref::<T>()) {
            return value.clone();
        }
        // (The lock is not held while the reads are checked.)
        let kept = self.by_reads.map().get(key).cloned();
        if let Some((log, value)) = kept.as_ref().and_then(|kept| kept.downcast_ref::<(ReadLog, T)>())
            && log.holds_in(self)
        {
            debug_assert_eq!(format!("{:?}", compute(&Reads::untracked(self))), format!("{value:?}"), "{key}: a value taken again by its reads differs from computing it");
            self.derived.map().insert(key.to_owned(), std::sync::Arc::new(value.clone()));
            return value.clone();
        }
        let reads = Reads { fs: self, log: Some(std::cell::RefCell::new(ReadLog { held_at: std::sync::Mutex::new(Some(self.tree_mark())), ..ReadLog::default() })) };
        let value = compute(&reads);
        let log = reads.log.map(std::cell::RefCell::into_inner).unwrap_or_default();
        self.derived.map().insert(key.to_owned(), std::sync::Arc::new(value.clone()));
        self.by_reads.map().insert(key.to_owned(), std::sync::Arc::new((log, value.clone())));
        value
    }

    pub fn exists(&self, path: &str) -> bool {
        normalized(path).is_ok_and(|p| self.files.contains_key(p.as_ref()) || self.is_dir(&p))
    }

    pub fn is_file(&self, path: &str) -> bool {
        normalized(path).is_ok_and(|p| self.files.contains_key(p.as_ref()))
    }

    pub fn is_dir(&self, path: &str) -> bool {
        let Ok(path) = normalized(path) else { return false };
        if path == "/" || self.dirs.contains(path.as_ref()) {
            return true;
        }
        let prefix = dir_prefix(&path);
        let has_child = |keys: &mut dyn Iterator<Item = &String>| keys.next().is_some_and(|k| k.starts_with(&prefix));
        let from = (std::ops::Bound::Included(prefix.as_str()), std::ops::Bound::Unbounded);
        has_child(&mut self.files.range::<str, _>(from).map(|(k, _)| k)) || has_child(&mut self.dirs.range::<str, _>(from))
    }

    /// [`Self::is_dir`] of a path, read from `kept` where it answered on this tree and since
    /// then no explicit directory was made or removed and no file at or under the path was set
    /// or removed; `kept` then holds the answer as of now. `path` is made only where `kept`
    /// does not answer: a caller whose path changed drops `kept` first. For a question asked
    /// at every request (is the working directory a git repository?) of a tree that a request
    /// changes a file or two of.
    pub fn is_dir_kept(&self, kept: &mut Option<DirAnswer>, path: impl FnOnce() -> String) -> bool {
        if let Some(answer) = kept.as_mut()
            && self.files_changed_since_tree(answer.mark).is_some_and(|changed| changed.iter().all(|p| !p.starts_with(answer.normalized.as_str())))
        {
            debug_assert_eq!(answer.is_dir, self.is_dir(&answer.normalized), "a kept is_dir answer differs from asking the tree");
            answer.mark = self.tree_mark();
            return answer.is_dir;
        }
        let path = path();
        let is_dir = self.is_dir(&path);
        *kept = normalized(&path).ok().map(|normal| DirAnswer { normalized: normal.into_owned(), mark: self.tree_mark(), is_dir });
        is_dir
    }

    /// The answers `kept` holds, true of this tree as it is: emptied first unless they were
    /// brought up to date on this tree and since then no file whose path holds their fragment
    /// was set or removed and no explicit directory was made or removed. For a question asked
    /// at every touch of a file (the `.claude/skills` directories above it) of a tree that the
    /// agent changes elsewhere.
    pub fn answers_kept<'k, T>(&self, kept: &'k mut FragmentAnswers<T>) -> &'k mut rustc_hash::FxHashMap<String, T> {
        let fragment = kept.fragment;
        let holds = kept.mark.and_then(|mark| self.files_changed_since_tree(mark)).is_some_and(|changed| changed.iter().all(|path| !path.contains(fragment)));
        if !holds {
            kept.answers.clear();
        }
        kept.mark = Some(self.tree_mark());
        &mut kept.answers
    }

    /// The immediate children of a directory, sorted by name.
    pub fn list_dir(&self, path: &str) -> Result<Vec<DirEntry>, WorldError> {
        let path = normalize_path(path)?;
        if self.files.contains_key(&path) {
            return Err(WorldError::NotADirectory { path });
        }
        if !self.is_dir(&path) {
            return Err(WorldError::NotFound { path });
        }
        let prefix = dir_prefix(&path);
        // name -> is_dir; a BTreeMap gives the sorted order and merges files and dirs.
        let mut children: BTreeMap<&str, bool> = BTreeMap::new();
        let from = (std::ops::Bound::Included(prefix.as_str()), std::ops::Bound::Unbounded);
        let file_keys = self.files.range::<str, _>(from).map(|(k, _)| k);
        let dir_keys = self.dirs.range::<str, _>(from);
        for (key, explicit_dir) in file_keys.map(|k| (k, false)).take_while(|(k, _)| k.starts_with(&prefix)).chain(
            dir_keys.map(|k| (k, true)).take_while(|(k, _)| k.starts_with(&prefix)),
        ) {
            let rest = &key[prefix.len()..];
            match rest.split_once('/') {
                Some((name, _)) => {
                    children.insert(name, true);
                }
                None => {
                    let entry = children.entry(rest).or_insert(explicit_dir);
                    *entry |= explicit_dir;
                }
            }
        }
        Ok(children
            .into_iter()
            .map(|(name, is_dir)| DirEntry { path: format!("{prefix}{name}"), name: name.to_owned(), is_dir })
            .collect())
    }

    /// Every file and directory under `path`, depth-first, children sorted by name (so
    /// `/a/b/c` comes before `/a/b.txt`). `path` itself is not included.
    pub fn walk(&self, path: &str) -> Result<Vec<DirEntry>, WorldError> {
        let mut out = Vec::new();
        for entry in self.list_dir(path)? {
            let is_dir = entry.is_dir;
            let child = entry.path.clone();
            out.push(entry);
            if is_dir {
                out.extend(self.walk(&child)?);
            }
        }
        Ok(out)
    }

    /// Files matching a glob pattern, sorted by path. A relative pattern (`**/*.rs`) is matched
    /// against paths relative to `base`; an absolute one against absolute paths. `*` and `?` do
    /// not cross `/`; `**` does.
    pub fn glob(&self, pattern: &str, base: &str) -> Result<Vec<String>, WorldError> {
        let base = normalize_path(base)?;
        let matcher = GlobBuilder::new(pattern)
            .literal_separator(true)
            .build()
            .map_err(|e| WorldError::BadGlob { pattern: pattern.to_owned(), message: e.kind().to_string() })?
            .compile_matcher();
        let absolute = pattern.starts_with('/');
        let prefix = dir_prefix(&base);
        Ok(self
            .files
            .range(prefix.clone()..)
            .map(|(p, _)| p)
            .take_while(|p| p.starts_with(&prefix))
            .filter(|p| if absolute { matcher.is_match(p.as_str()) } else { matcher.is_match(&p[prefix.len()..]) })
            .cloned()
            .collect())
    }

    /// All files, sorted by path.
    pub fn files(&self) -> impl Iterator<Item = (&str, &FileEntry)> {
        self.files.iter().map(|(p, e)| (p.as_str(), e))
    }

    pub fn file_count(&self) -> usize {
        self.files.len()
    }

    /// The whole journal, in time order.
    pub fn journal(&self) -> &[Change] {
        &self.journal
    }

    /// Where this tree's changes stand now, for [`Self::files_changed_since`].
    pub fn change_mark(&self) -> ChangeMark {
        ChangeMark { lineage: self.changes.lineage, count: self.changes.count() }
    }

    /// The files set or removed (seeds included) since `mark` was taken from this tree, in
    /// the order it happened and repeated as often; `None` when `mark` comes from another tree
    /// (another fs or a copy of this one), whose changes this one does not know.
    pub fn files_changed_since(&self, mark: ChangeMark) -> Option<&[String]> {
        (mark.lineage == self.changes.lineage).then(|| self.changes.since(mark.count)).flatten()
    }

    /// Where this tree's changes stand now, its explicit directories' included.
    fn tree_mark(&self) -> TreeMark {
        TreeMark { files: self.change_mark(), dirs: self.dir_changes }
    }

    /// [`Self::files_changed_since`] a [`TreeMark`]; `None` also when an explicit directory
    /// was made or removed since.
    fn files_changed_since_tree(&self, mark: TreeMark) -> Option<&[String]> {
        (mark.dirs == self.dir_changes).then(|| self.files_changed_since(mark.files)).flatten()
    }

    /// Changes made strictly after virtual time `time_ms`, in the order they happened.
    pub fn changes_since(&self, time_ms: u64) -> &[Change] {
        // The journal is in clock order because the clock is monotonic.
        let start = self.journal.partition_point(|c| c.time_ms <= time_ms);
        &self.journal[start..]
    }

    /// Paths changed strictly after `time_ms`, sorted and deduplicated.
    pub fn paths_changed_since(&self, time_ms: u64) -> Vec<String> {
        let set: BTreeSet<&str> = self.changes_since(time_ms).iter().map(|c| c.path.as_str()).collect();
        set.into_iter().map(str::to_owned).collect()
    }

    /// Loads a real directory tree into the virtual fs under `mount_at`, as initial state
    /// (not journaled, mtime = clock now; real mtimes are ignored because they differ between
    /// checkouts). Skips `.git`, symlinks and non-UTF-8 files. The only function in the World
    /// that touches the real filesystem.
    pub fn load_from_dir(&mut self, real_path: &Path, mount_at: &str, clock: &Clock) -> Result<LoadReport, WorldError> {
        self.derived.clear();
        let mount_at = normalize_path(mount_at)?;
        let mut report = LoadReport::default();
        let walker = walkdir::WalkDir::new(real_path)
            .follow_links(false)
            .sort_by_file_name()
            .into_iter()
            .filter_entry(|e| e.depth() == 0 || e.file_name() != ".git");
        for entry in walker {
            let entry = entry.map_err(|e| WorldError::Io {
                path: e.path().unwrap_or(real_path).to_path_buf(),
                source: e.into_io_error().unwrap_or_else(|| std::io::Error::other("filesystem loop")),
            })?;
            if !entry.file_type().is_file() {
                continue;
            }
            let relative = entry.path().strip_prefix(real_path).expect("walkdir yields paths under its root");
            let components: Vec<String> = relative.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
            let virtual_path = normalize_path(&format!("{}/{}", mount_at, components.join("/")))?;
            let bytes = std::fs::read(entry.path()).map_err(|source| WorldError::Io { path: entry.path().to_path_buf(), source })?;
            match String::from_utf8(bytes) {
                Ok(text) => {
                    self.seed(&virtual_path, text, clock)?;
                    report.files_loaded += 1;
                }
                Err(_) => report.skipped_binary.push(virtual_path),
            }
        }
        Ok(report)
    }

    /// Normalizes `path` and checks it can hold a file: not a directory, no file among its
    /// ancestors.
    fn writable_path(&self, path: &str) -> Result<String, WorldError> {
        let path = normalize_path(path)?;
        if path == "/" || self.is_dir(&path) {
            return Err(WorldError::IsADirectory { path });
        }
        if ancestors(&path).any(|a| self.files.contains_key(a)) {
            return Err(WorldError::NotADirectory { path });
        }
        Ok(path)
    }
}

/// Normalizes an absolute POSIX path: collapses `//`, resolves `.` and `..` (never above `/`),
/// drops a trailing `/`. Relative paths are an error.
pub fn normalize_path(path: &str) -> Result<String, WorldError> {
    normalized(path).map(Cow::into_owned)
}

/// [`normalize_path`], borrowing a path that is already normal (the lookups of the tree, whose
/// paths mostly are).
fn normalized(path: &str) -> Result<Cow<'_, str>, WorldError> {
    if is_normal_path(path) {
        return Ok(Cow::Borrowed(path));
    }
    if !path.starts_with('/') {
        return Err(WorldError::NotAbsolute { path: path.to_owned() });
    }
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            other => parts.push(other),
        }
    }
    Ok(Cow::Owned(format!("/{}", parts.join("/"))))
}

/// Whether [`normalize_path`] gives `path` back as it is: `/`, or `/` and components none of
/// which is empty, `.` or `..` (no `//`, `/./`, `/../`, trailing `/`).
pub fn is_normal_path(path: &str) -> bool {
    // (A byte scan: the lookups of the tree ask this of every path they are given.)
    let Some(mut rest) = path.as_bytes().strip_prefix(b"/") else { return false };
    if rest.is_empty() {
        return true;
    }
    loop {
        let end = memchr::memchr(b'/', rest).unwrap_or(rest.len());
        if matches!(&rest[..end], b"" | b"." | b"..") {
            return false;
        }
        if end == rest.len() {
            return true;
        }
        rest = &rest[end + 1..];
    }
}

/// `/a/b` -> `/a/b/`; `/` stays `/`. Range scans over this prefix find exactly the descendants.
fn dir_prefix(path: &str) -> String {
    let mut prefix = String::with_capacity(path.len() + 1);
    prefix.push_str(path);
    if path != "/" {
        prefix.push('/');
    }
    prefix
}

/// Proper ancestors of a normalized path, excluding `/`: `/a/b/c` -> `/a/b`, `/a`.
fn ancestors(path: &str) -> impl Iterator<Item = &str> {
    let mut current = path;
    std::iter::from_fn(move || {
        let cut = current.rfind('/')?;
        if cut == 0 {
            return None;
        }
        current = &current[..cut];
        Some(current)
    })
}
