//! The agent's own directory, `<root>/var/lib/exk8s`, reached by directory handle: every
//! component from the root down is opened with `O_NOFOLLOW | O_DIRECTORY` relative to its
//! parent's handle, and every file inside is opened relative to the directory's handle with
//! `O_NOFOLLOW`. A symlink anywhere on the way — planted to make the agent write its state, its
//! done-marker or its action log somewhere else — is refused, not followed, and nothing checked
//! can be swapped between the check and the write (SECURITY.md 16, as for bundle files).

use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::error::AgentError;

/// Where the agent keeps its state, relative to the root.
pub const STATE_DIR: &str = "var/lib/exk8s";

/// An open handle on `<root>/var/lib/exk8s`.
#[derive(Debug)]
pub struct StateDir {
    fd: OwnedFd,
    path: PathBuf,
}

fn unsafe_path(path: PathBuf) -> AgentError {
    AgentError::UnsafePath {
        path,
        reason: "a symlink or non-directory in the agent's state directory path",
    }
}

fn io_error(path: PathBuf, errno: Errno) -> AgentError {
    AgentError::State {
        path,
        source: std::io::Error::from(errno),
    }
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

impl StateDir {
    /// Opens the state directory under `root`, creating missing components (mode 0700 for
    /// the last, 0755 above it) when `create` is set. `Ok(None)`: it does not exist and
    /// `create` is not set.
    pub fn open(root: &Path, create: bool) -> Result<Option<Self>, AgentError> {
        // The root itself is the caller's choice (`/`, or `--root DIR`): it may be reached
        // through a symlink; nothing below it may.
        let open_root = || rustix::fs::open(root, dir_flags() & !OFlags::NOFOLLOW, Mode::empty());
        let mut fd = match open_root() {
            Ok(fd) => fd,
            Err(Errno::NOENT) if create => {
                std::fs::create_dir_all(root).map_err(|source| AgentError::State {
                    path: root.to_owned(),
                    source,
                })?;
                open_root().map_err(|e| io_error(root.to_owned(), e))?
            }
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(io_error(root.to_owned(), e)),
        };
        let mut path = root.to_owned();
        let components: Vec<&str> = STATE_DIR.split('/').collect();
        for (i, name) in components.iter().enumerate() {
            path.push(name);
            let last = i + 1 == components.len();
            fd = match rustix::fs::openat(&fd, *name, dir_flags(), Mode::empty()) {
                Ok(next) => next,
                Err(Errno::NOENT) if create => {
                    let mode = if last { 0o700 } else { 0o755 };
                    match rustix::fs::mkdirat(&fd, *name, Mode::from_raw_mode(mode)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(io_error(path, e)),
                    }
                    rustix::fs::openat(&fd, *name, dir_flags(), Mode::empty()).map_err(|e| {
                        if matches!(e, Errno::LOOP | Errno::NOTDIR) {
                            unsafe_path(path.clone())
                        } else {
                            io_error(path.clone(), e)
                        }
                    })?
                }
                Err(Errno::NOENT) => return Ok(None),
                Err(Errno::LOOP | Errno::NOTDIR) => return Err(unsafe_path(path)),
                Err(e) => return Err(io_error(path, e)),
            };
        }
        Ok(Some(Self { fd, path }))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file_error(&self, name: &str, source: std::io::Error) -> AgentError {
        AgentError::State {
            path: self.path.join(name),
            source,
        }
    }

    fn open_file(&self, name: &str, flags: OFlags, mode: u32) -> Result<std::fs::File, AgentError> {
        rustix::fs::openat(
            &self.fd,
            name,
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map(std::fs::File::from)
        .map_err(|e| match e {
            Errno::LOOP => unsafe_path(self.path.join(name)),
            other => self.file_error(name, other.into()),
        })
    }

    /// A file's content, or `None` when it does not exist. A symlink is refused.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>, AgentError> {
        let mut file = match self.open_file(name, OFlags::RDONLY, 0) {
            Ok(file) => file,
            Err(AgentError::State { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                return Ok(None);
            }
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)
            .map_err(|e| self.file_error(name, e))?;
        Ok(Some(bytes))
    }

    /// Whether `name` exists as a regular file (a symlink does not count).
    pub fn has_file(&self, name: &str) -> bool {
        rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| rustix::fs::FileType::from_raw_mode(st.st_mode).is_file())
    }

    /// Replaces `name` atomically: a temp file made here (never an existing one), written,
    /// given `mode`, fsynced, renamed over `name`, and the directory fsynced.
    pub fn write_atomic(&self, name: &str, bytes: &[u8], mode: u32) -> Result<(), AgentError> {
        let tmp = format!(".{name}.tmp-{}", std::process::id());
        let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), rustix::fs::AtFlags::empty());
        let mut file =
            self.open_file(&tmp, OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL, mode)?;
        let written = file
            .write_all(bytes)
            .and_then(|()| rustix::fs::fchmod(&file, Mode::from_raw_mode(mode)).map_err(Into::into))
            .and_then(|()| file.sync_all());
        written.map_err(|e| self.file_error(&tmp, e))?;
        rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name)
            .map_err(|e| self.file_error(name, e.into()))?;
        rustix::fs::fsync(&self.fd).map_err(|e| self.file_error(".", e.into()))
    }

    /// Takes the node's agent lock (`agent.lock`, 0600), waiting while another `run` or `sync`
    /// holds it; released when the returned file is dropped or the process ends, even by a
    /// crash. Two agents never apply to one machine at once.
    pub fn lock(&self) -> Result<std::fs::File, AgentError> {
        const LOCK: &str = "agent.lock";
        let file = self.open_file(LOCK, OFlags::RDWR | OFlags::CREATE, 0o600)?;
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| self.file_error(LOCK, e.into()))?;
        Ok(file)
    }

    /// Removes `name`; nothing when it does not exist.
    pub fn remove(&self, name: &str) -> Result<(), AgentError> {
        match rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(self.file_error(name, e.into())),
        }
    }

    /// Appends one line to `name` (created 0600).
    pub fn append_line(&self, name: &str, line: &str) -> Result<(), AgentError> {
        let mut file = self.open_file(
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::APPEND,
            0o600,
        )?;
        writeln!(file, "{line}").map_err(|e| self.file_error(name, e))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use std::os::unix::fs::{PermissionsExt as _, symlink};

    use super::*;

    #[test]
    fn creates_private_and_round_trips() {
        let root = tempfile::tempdir().unwrap();
        assert!(StateDir::open(root.path(), false).unwrap().is_none());
        let dir = StateDir::open(root.path(), true).unwrap().unwrap();
        dir.write_atomic("state.json", b"{}", 0o600).unwrap();
        assert_eq!(dir.read("state.json").unwrap().unwrap(), b"{}");
        assert!(dir.read("missing").unwrap().is_none());
        assert!(dir.has_file("state.json"));
        let on_disk = root.path().join(STATE_DIR);
        assert_eq!(
            std::fs::metadata(&on_disk).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(
            std::fs::metadata(on_disk.join("state.json"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o600
        );
    }

    #[test]
    fn a_symlink_in_any_component_or_as_the_file_is_refused() {
        for planted in ["var", "var/lib", "var/lib/exk8s"] {
            let root = tempfile::tempdir().unwrap();
            let elsewhere = tempfile::tempdir().unwrap();
            let link = root.path().join(planted);
            std::fs::create_dir_all(link.parent().unwrap()).unwrap();
            symlink(elsewhere.path(), &link).unwrap();
            let error = StateDir::open(root.path(), true).unwrap_err();
            assert!(
                matches!(error, AgentError::UnsafePath { .. }),
                "{planted}: {error}"
            );
            assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 0);
        }
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let dir = StateDir::open(root.path(), true).unwrap().unwrap();
        symlink(
            elsewhere.path().join("log"),
            dir.path().join("recorded-actions.log"),
        )
        .unwrap();
        assert!(dir.append_line("recorded-actions.log", "x").is_err());
        assert!(!elsewhere.path().join("log").exists());
        symlink(elsewhere.path().join("s"), dir.path().join("state.json")).unwrap();
        assert!(dir.read("state.json").is_err());
        assert!(!dir.has_file("state.json"));
    }
}
