//! The files the agent has read, with the mtime it saw (Claude Code's read-file state), and
//! which of them changed since: a file written behind the agent's back is announced with the
//! next request (`edited_text_file`). A check looks only at the files read or changed since the
//! last check (the fs's change log, [`VirtualFs::files_changed_since`]), not at every file ever
//! read, and finds what a look at every one of them would find.

use std::collections::{BTreeMap, BTreeSet};

use crate::world::{ChangeMark, FileEntry, VirtualFs, is_normal_path};

#[derive(Debug, Clone, Default)]
pub struct ReadState {
    /// Path as the agent named it -> the mtime it saw.
    seen: BTreeMap<String, i64>,
    /// Paths set since the last check: looked at in the next one whatever the fs says.
    unchecked: BTreeSet<String>,
    /// Paths that are not normal (the fs's change log names normal paths): looked at in every
    /// check.
    irregular: BTreeSet<String>,
    /// Where the fs stood at the last check; `None`: the next check looks at every path.
    mark: Option<ChangeMark>,
}

impl ReadState {
    /// The state rebuilt from paths and the mtimes they were read at (a resume).
    pub fn from_seen(seen: BTreeMap<String, i64>) -> Self {
        let irregular = seen.keys().filter(|p| !is_normal_path(p)).cloned().collect();
        ReadState { seen, unchecked: BTreeSet::new(), irregular, mark: None }
    }

    /// Notes that the agent saw `path` at `mtime_ms`.
    pub fn insert(&mut self, path: String, mtime_ms: i64) {
        if is_normal_path(&path) {
            self.unchecked.insert(path.clone());
        } else {
            self.irregular.insert(path.clone());
        }
        self.seen.insert(path, mtime_ms);
    }

    pub fn clear(&mut self) {
        *self = ReadState::default();
    }

    pub fn contains(&self, path: &str) -> bool {
        self.seen.contains_key(path)
    }

    /// Every path read, sorted, with the mtime seen.
    pub fn iter(&self) -> impl Iterator<Item = (&String, &i64)> {
        self.seen.iter()
    }

    /// The files read whose mtime in `fs` is now later than the one seen, sorted by path, each
    /// with its entry; each is noted as seen at its new mtime.
    pub fn take_changed<'fs>(&mut self, fs: &'fs VirtualFs) -> Vec<(String, &'fs FileEntry)> {
        // Since the last check, a file can only have moved past its seen mtime if the fs
        // changed it or the agent set what it saw: the rest stays as that check left it.
        let candidates: BTreeSet<String> = match self.mark.and_then(|mark| fs.files_changed_since(mark)) {
            Some(changed) => {
                let mut candidates = std::mem::take(&mut self.unchecked);
                candidates.extend(self.irregular.iter().cloned());
                candidates.extend(changed.iter().filter(|p| self.seen.contains_key(p.as_str())).cloned());
                candidates
            }
            None => {
                self.unchecked.clear();
                self.seen.keys().cloned().collect()
            }
        };
        self.mark = Some(fs.change_mark());
        let mut out = Vec::new();
        for path in candidates {
            let Ok(entry) = fs.entry(&path) else { continue };
            let seen = self.seen.get_mut(&path).expect("a candidate is a path read");
            if entry.mtime_ms > *seen {
                *seen = entry.mtime_ms;
                out.push((path, entry));
            }
        }
        out
    }
}
