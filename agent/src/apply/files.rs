//! Writing bundle files: plan (create / update / unchanged, by sha256 and mode), stage every
//! changed file as a temp file in its target directory (write_all, fchmod, fchown, fsync), and
//! only when all are staged rename each into place and fsync each directory. A crash at any
//! point leaves every target either old or new; a re-run converges (SECURITY.md 16–17).
//!
//! Paths are re-checked against the allow-list, and no symlink is followed on the way to a
//! target: every existing ancestor below the root is `lstat`ed, and temp files are opened with
//! `O_NOFOLLOW | O_EXCL`.

use std::collections::BTreeSet;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use exk8s_common::names::{BundlePath, Sha256Digest};
use exk8s_common::payload::BundleFile;

use crate::error::AgentError;
use crate::log::log_warn;

/// What applying does to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Create,
    Update,
    Unchanged,
}

#[derive(Debug)]
pub struct FileAction<'a> {
    pub file: &'a BundleFile,
    pub target: PathBuf,
    pub change: Change,
}

/// Test hook: abort the process after this many file operations, to prove crash safety.
/// Read from `EXK8S_AGENT_TEST_ABORT_AFTER_FILE_OPS`; unset in production.
static OPS: AtomicU64 = AtomicU64::new(0);

fn file_op() {
    let done = OPS.fetch_add(1, Ordering::SeqCst) + 1;
    if let Some(limit) = std::env::var("EXK8S_AGENT_TEST_ABORT_AFTER_FILE_OPS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
    {
        if done >= limit {
            std::process::abort();
        }
    }
}

/// Directories holding keys are private.
fn dir_mode(dir: &Path) -> u32 {
    let private = ["etc/exk8s/pki", "etc/exk8s/kubeconfig", "var/lib/exk8s"];
    if private.iter().any(|p| dir.ends_with(p)) {
        0o700
    } else {
        0o755
    }
}

/// Ensures every directory from `root` down to `dir` exists and none is a symlink.
fn ensure_dirs(root: &Path, relative_dir: &Path, dry_run: bool) -> Result<(), AgentError> {
    let mut current = root.to_path_buf();
    for component in relative_dir.components() {
        current.push(component);
        match std::fs::symlink_metadata(&current) {
            Ok(meta) if meta.file_type().is_symlink() => {
                return Err(AgentError::UnsafePath {
                    path: current,
                    reason: "a symlink on the way to a target",
                });
            }
            Ok(meta) if !meta.is_dir() => {
                return Err(AgentError::UnsafePath {
                    path: current,
                    reason: "not a directory",
                });
            }
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if dry_run {
                    return Ok(());
                }
                std::fs::create_dir(&current).map_err(|source| AgentError::Write {
                    path: current.clone(),
                    source,
                })?;
                std::fs::set_permissions(
                    &current,
                    std::fs::Permissions::from_mode(dir_mode(&current)),
                )
                .map_err(|source| AgentError::Write {
                    path: current.clone(),
                    source,
                })?;
            }
            Err(source) => {
                return Err(AgentError::Write {
                    path: current,
                    source,
                });
            }
        }
    }
    Ok(())
}

/// Where `path` lands under `root`, with the path re-validated.
pub fn target_of(root: &Path, path: &BundlePath) -> Result<PathBuf, AgentError> {
    let checked =
        BundlePath::new(path.as_str()).map_err(|e| AgentError::RefusedOnDisk(e.to_string()))?;
    Ok(root.join(checked.relative()))
}

/// Decides, without writing, what applying `files` under `root` changes.
pub fn plan<'a>(root: &Path, files: &'a [BundleFile]) -> Result<Vec<FileAction<'a>>, AgentError> {
    files
        .iter()
        .map(|file| {
            let target = target_of(root, &file.path)?;
            let relative_parent = Path::new(file.path.parent().trim_start_matches('/'));
            ensure_dirs(root, relative_parent, true)?;
            let change = match std::fs::symlink_metadata(&target) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    return Err(AgentError::UnsafePath {
                        path: target,
                        reason: "the target is a symlink",
                    });
                }
                Ok(meta) if !meta.is_file() => {
                    return Err(AgentError::UnsafePath {
                        path: target,
                        reason: "the target is not a regular file",
                    });
                }
                Ok(meta) => {
                    let same_mode = meta.mode() & 0o7777 == file.mode.bits();
                    let content = std::fs::read(&target).map_err(|source| AgentError::Write {
                        path: target.clone(),
                        source,
                    })?;
                    if same_mode && Sha256Digest::of(&content) == file.sha256 {
                        Change::Unchanged
                    } else {
                        Change::Update
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Change::Create,
                Err(source) => {
                    return Err(AgentError::Write {
                        path: target,
                        source,
                    });
                }
            };
            Ok(FileAction {
                file,
                target,
                change,
            })
        })
        .collect()
}

/// Resolves an owner or group name. Bundles use `root`; other names are looked up in the
/// root's `/etc/passwd` or `/etc/group`.
fn id_of(root: &Path, name: &str, database: &str) -> Result<u32, AgentError> {
    if name == "root" {
        return Ok(0);
    }
    let path = root.join("etc").join(database);
    let text = std::fs::read_to_string(&path).map_err(|source| AgentError::Write {
        path: path.clone(),
        source,
    })?;
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(':');
            let entry = fields.next()?;
            let id = fields.nth(1)?.parse().ok()?;
            (entry == name).then_some(id)
        })
        .next()
        .ok_or_else(|| AgentError::RefusedOnDisk(format!("unknown {database} entry `{name}`")))
}

/// Stages every changed file, then renames them all into place. `strict_owner` makes a failed
/// chown an error (a real node); otherwise it is reported once (an unprivileged `--root`).
pub fn apply(
    root: &Path,
    actions: &[FileAction<'_>],
    strict_owner: bool,
) -> Result<(), AgentError> {
    let changed: Vec<&FileAction<'_>> = actions
        .iter()
        .filter(|a| a.change != Change::Unchanged)
        .collect();
    std::fs::create_dir_all(root).map_err(|source| AgentError::Write {
        path: root.to_owned(),
        source,
    })?;
    let mut staged: Vec<(PathBuf, &Path)> = Vec::with_capacity(changed.len());
    let mut owner_warned = false;
    let stage_all = (|| {
        for action in &changed {
            let relative_parent = Path::new(action.file.path.parent().trim_start_matches('/'));
            ensure_dirs(root, relative_parent, false)?;
            let content = Content {
                bytes: action.file.content.as_bytes(),
                mode: action.file.mode.bits(),
                uid: id_of(root, action.file.owner.as_str(), "passwd")?,
                gid: id_of(root, action.file.group.as_str(), "group")?,
            };
            let tmp = stage(&action.target, &content, strict_owner, &mut owner_warned)?;
            staged.push((tmp, &action.target));
        }
        Ok::<(), AgentError>(())
    })();
    if let Err(e) = stage_all {
        for (tmp, _) in &staged {
            let _ = std::fs::remove_file(tmp);
        }
        return Err(e);
    }
    commit(&staged)
}

/// Renames every staged temp file over its target, then fsyncs each directory.
pub(super) fn commit(staged: &[(PathBuf, &Path)]) -> Result<(), AgentError> {
    let mut dirs = BTreeSet::new();
    for (tmp, target) in staged {
        std::fs::rename(tmp, target).map_err(|source| AgentError::Write {
            path: target.to_path_buf(),
            source,
        })?;
        file_op();
        if let Some(dir) = target.parent() {
            dirs.insert(dir.to_path_buf());
        }
    }
    for dir in dirs {
        std::fs::File::open(&dir)
            .and_then(|d| d.sync_all())
            .map_err(|source| AgentError::Write { path: dir, source })?;
    }
    Ok(())
}

/// Removes temp files a crashed run left beside `name` (they are never renamed into place).
fn remove_stale_temps(dir: &Path, name: &str) {
    let prefix = format!(".{name}.exk8s-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.starts_with(&prefix))
            && entry.file_type().is_ok_and(|t| t.is_file());
        if stale {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

/// What one staged file holds: its bytes, mode and owner.
pub(super) struct Content<'a> {
    pub bytes: &'a [u8],
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Writes `content` to a fresh temp file beside `target` (never renamed here).
pub(super) fn stage(
    target: &Path,
    content: &Content<'_>,
    strict_owner: bool,
    owner_warned: &mut bool,
) -> Result<PathBuf, AgentError> {
    let dir = target.parent().unwrap_or(Path::new("/"));
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    remove_stale_temps(dir, &name);
    let tmp = dir.join(format!(".{name}.exk8s-{}", std::process::id()));
    let write_err = |source| AgentError::Write {
        path: tmp.clone(),
        source,
    };
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&tmp)
        .map_err(write_err)?;
    file_op();
    file.write_all(content.bytes).map_err(write_err)?;
    file.set_permissions(std::fs::Permissions::from_mode(content.mode))
        .map_err(write_err)?;
    if let Err(e) = std::os::unix::fs::fchown(&file, Some(content.uid), Some(content.gid)) {
        if strict_owner {
            let _ = std::fs::remove_file(&tmp);
            return Err(write_err(e));
        }
        if !*owner_warned {
            log_warn!(
                "not privileged to set file owners under this root ({e}); modes are still exact"
            );
            *owner_warned = true;
        }
    }
    file.sync_all().map_err(write_err)?;
    file_op();
    Ok(tmp)
}
