//! Writing the CLI's private files (its config, kubeconfigs, the credential cache): readable by
//! the user only, replaced whole or not at all, safe when many processes write at once. kubectl
//! runs the credential plugin once per invocation and scripts run many kubectl processes at
//! once, so every write goes through a temporary file of its own in the target's directory
//! (`tempfile`, mode 0600 from creation), then an atomic rename over the target.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// Writes `bytes` to `file` atomically with mode 0600; its directory, when missing, is made
/// 0700. A reader sees the old content or the new, never a mix; a failed write leaves the old.
pub(crate) fn write(file: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match file.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    if !dir.exists() {
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    let name = file.file_name().map_or_else(
        || std::ffi::OsString::from("exk8s"),
        std::ffi::OsStr::to_os_string,
    );
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".");
    // NamedTempFile is created 0600 with a unique name (O_EXCL), and removed if dropped.
    let mut temp = tempfile::Builder::new()
        .prefix(&prefix)
        .suffix(".tmp")
        .tempfile_in(dir)?;
    temp.write_all(bytes)?;
    temp.as_file().sync_all()?;
    temp.persist(file).map_err(|e| e.error)?;
    // The rename is durable once the directory is.
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn concurrent_writers_leave_one_whole_file_and_no_temporary() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("new").join("cache.json");
        std::thread::scope(|scope| {
            for i in 0..32u8 {
                let file = &file;
                scope.spawn(move || {
                    let body = vec![b'a' + (i % 26); 64 * 1024];
                    write(file, &body).unwrap();
                });
            }
        });
        let written = std::fs::read(&file).unwrap();
        assert_eq!(written.len(), 64 * 1024);
        assert!(
            written.iter().all(|b| *b == written[0]),
            "one writer's whole content"
        );
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        let left: Vec<_> = std::fs::read_dir(file.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            left,
            vec![std::ffi::OsString::from("cache.json")],
            "no temporary left"
        );
    }
}
