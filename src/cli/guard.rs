//! No command writes over one of its own inputs: every output path is compared with the
//! command's input files by identity (device and inode, so links and `./a/../a` count), before
//! anything is written.

use std::path::{Path, PathBuf};

use anyhow::bail;

/// Whether `a` and `b` are the same existing file.
pub fn same_file(a: &Path, b: &Path) -> bool {
    file_id(a).is_some_and(|id| file_id(b) == Some(id))
}

/// The files a command reads (directories expanded, recursively).
#[derive(Debug, Default)]
pub struct Inputs {
    files: Vec<(FileId, PathBuf)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

fn file_id(path: &Path) -> Option<FileId> {
    let meta = std::fs::metadata(path).ok()?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        Some(FileId { dev: meta.dev(), ino: meta.ino() })
    }
    #[cfg(not(unix))]
    {
        let _ = meta;
        None
    }
}

impl Inputs {
    /// The inputs `paths` name; a directory stands for every regular file under it. A path that
    /// does not exist (a preset name given where a file may go) is skipped.
    pub fn of<P: AsRef<Path>>(paths: impl IntoIterator<Item = P>) -> Inputs {
        let mut inputs = Inputs::default();
        for path in paths {
            inputs.add(path.as_ref());
        }
        inputs
    }

    pub fn add_all<P: AsRef<Path>>(&mut self, paths: impl IntoIterator<Item = P>) {
        for path in paths {
            self.add(path.as_ref());
        }
    }

    pub fn add(&mut self, path: &Path) {
        if path.is_dir() {
            for entry in walkdir::WalkDir::new(path).follow_links(false).into_iter().filter_map(Result::ok) {
                if entry.file_type().is_file()
                    && let Some(id) = file_id(entry.path())
                {
                    self.files.push((id, entry.path().to_path_buf()));
                }
            }
        } else if std::fs::metadata(path).is_ok_and(|m| m.is_file())
            && let Some(id) = file_id(path)
        {
            self.files.push((id, path.to_path_buf()));
        }
    }

    /// The input `path` is, if it is one.
    fn input_at(&self, path: &Path) -> Option<&Path> {
        let id = file_id(path)?;
        self.files.iter().find(|(f, _)| *f == id).map(|(_, p)| p.as_path())
    }

    /// Refuses an output file (`flag` names the option) that is one of the inputs.
    pub fn refuse_file(&self, flag: &str, output: &Path) -> anyhow::Result<()> {
        if let Some(input) = self.input_at(output) {
            bail!("{flag} {}: this is the input {}; a command never writes over its own input (give another path)", output.display(), input.display());
        }
        Ok(())
    }

    /// Refuses a directory output whose new generation (`fresh`, about to be swapped in at
    /// `target`) would replace an input: an input file at the same relative path.
    pub fn refuse_generation(&self, flag: &str, fresh: &Path, target: &Path) -> anyhow::Result<()> {
        for entry in walkdir::WalkDir::new(fresh).into_iter().filter_map(Result::ok) {
            let Ok(relative) = entry.path().strip_prefix(fresh) else { continue };
            if relative.as_os_str().is_empty() || !entry.file_type().is_file() {
                continue;
            }
            let existing = target.join(relative);
            if let Some(input) = self.input_at(&existing) {
                bail!(
                    "{flag} {}: writing {} would replace the input {}; a command never writes over its own input (give another directory)",
                    target.display(),
                    relative.display(),
                    input.display()
                );
            }
        }
        Ok(())
    }
}

/// A directory output written as a new generation ([`crate::report::output::OutputDir`]),
/// refusing to replace any of `inputs`.
pub struct GuardedDir<'a> {
    flag: &'static str,
    given: PathBuf,
    dir: crate::report::output::OutputDir,
    inputs: &'a Inputs,
}

impl<'a> GuardedDir<'a> {
    pub fn begin(flag: &'static str, given: &Path, inputs: &'a Inputs) -> anyhow::Result<GuardedDir<'a>> {
        let dir = crate::report::output::OutputDir::begin(given).map_err(|e| anyhow::anyhow!("{flag} {}: {e}", given.display()))?;
        Ok(GuardedDir { flag, given: given.to_path_buf(), dir, inputs })
    }

    /// Where this generation's files go.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Checks the inputs and swaps the generation in.
    pub fn commit(self) -> anyhow::Result<()> {
        self.inputs.refuse_generation(self.flag, self.dir.path(), self.dir.target())?;
        let given = self.given.clone();
        self.dir.commit().map_err(|e| anyhow::anyhow!("{} {}: failed to put the new output in place: {e}", self.flag, given.display()))
    }
}
