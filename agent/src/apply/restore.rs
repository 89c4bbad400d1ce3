//! Putting an update back: before an update's files land, the files it replaces are read into
//! memory (content, mode, owner) and the ones it creates are noted. If the update then fails
//! its health checks, [`Snapshot::restore`] writes the old files back byte for byte — staged
//! and renamed like any bundle file, so a crash while restoring also leaves each file old or
//! new — and removes the created ones. Held contents may be private keys: zeroized on drop,
//! never in `Debug`.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use zeroize::Zeroizing;

use crate::error::AgentError;

use super::files::{self, Change, Content, FileAction};

struct Saved {
    bytes: Zeroizing<Vec<u8>>,
    mode: u32,
    uid: u32,
    gid: u32,
}

struct Previous {
    target: PathBuf,
    /// `None`: the update created the file.
    before: Option<Saved>,
}

/// The state of every file an update changes, from before it changed them.
#[derive(Default)]
pub struct Snapshot {
    entries: Vec<Previous>,
}

impl std::fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.entries.iter().map(|e| &e.target))
            .finish()
    }
}

fn read_error(path: &Path, source: std::io::Error) -> AgentError {
    AgentError::Write {
        path: path.to_owned(),
        source,
    }
}

impl Snapshot {
    /// Reads what `actions` will replace.
    pub fn take(actions: &[FileAction<'_>]) -> Result<Self, AgentError> {
        let mut entries = Vec::new();
        for action in actions {
            let before = match action.change {
                Change::Unchanged => continue,
                Change::Create => None,
                Change::Update => {
                    let meta = std::fs::symlink_metadata(&action.target)
                        .map_err(|e| read_error(&action.target, e))?;
                    let bytes =
                        std::fs::read(&action.target).map_err(|e| read_error(&action.target, e))?;
                    Some(Saved {
                        bytes: Zeroizing::new(bytes),
                        mode: meta.mode() & 0o7777,
                        uid: meta.uid(),
                        gid: meta.gid(),
                    })
                }
            };
            entries.push(Previous {
                target: action.target.clone(),
                before,
            });
        }
        Ok(Self { entries })
    }

    /// Writes every saved file back and removes every created one.
    pub fn restore(&self, strict_owner: bool) -> Result<(), AgentError> {
        let mut staged: Vec<(PathBuf, &Path)> = Vec::new();
        let mut owner_warned = false;
        let stage_all = (|| {
            for entry in &self.entries {
                if let Some(saved) = &entry.before {
                    let content = Content {
                        bytes: &saved.bytes,
                        mode: saved.mode,
                        uid: saved.uid,
                        gid: saved.gid,
                    };
                    let tmp =
                        files::stage(&entry.target, &content, strict_owner, &mut owner_warned)?;
                    staged.push((tmp, &entry.target));
                }
            }
            Ok::<(), AgentError>(())
        })();
        if let Err(e) = stage_all {
            for (tmp, _) in &staged {
                let _ = std::fs::remove_file(tmp);
            }
            return Err(e);
        }
        files::commit(&staged)?;
        let mut dirs = BTreeSet::new();
        for entry in self.entries.iter().filter(|e| e.before.is_none()) {
            match std::fs::remove_file(&entry.target) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(read_error(&entry.target, e)),
            }
            if let Some(dir) = entry.target.parent() {
                dirs.insert(dir.to_path_buf());
            }
        }
        for dir in dirs {
            std::fs::File::open(&dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| read_error(&dir, e))?;
        }
        Ok(())
    }
}
