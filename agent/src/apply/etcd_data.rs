//! etcd's data directory made anew from a snapshot (`etcdutl snapshot restore`), the step of
//! an in-place restore ([`crate::etcd_restore`]) that touches etcd's files: into a fresh
//! directory beside it, then the old one kept aside (once) and the new one in its place, so a
//! step run again after a crash ends the same way.

use std::path::{Path, PathBuf};

/// `etcdutl snapshot restore` of a fetched snapshot into `data_dir`.
#[derive(Debug, Clone)]
pub struct DataDir {
    pub etcdutl: PathBuf,
    pub snapshot: PathBuf,
    pub data_dir: PathBuf,
    pub restore_id: i64,
    pub name: String,
    pub peer_url: String,
    pub initial_cluster: String,
    pub token: String,
    pub bump_revision: u64,
}

impl std::fmt::Display for DataDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "etcdutl snapshot restore {} into {} as {} of {} (revision +{}, older marked compacted)",
            self.snapshot.display(),
            self.data_dir.display(),
            self.name,
            self.initial_cluster,
            self.bump_revision
        )
    }
}

fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

/// Restores `d` under `root`: into a fresh directory beside the data directory, then the old
/// one aside (kept, once) and the new one in its place.
pub fn restore_data_dir(root: &Path, d: &DataDir) -> Result<(), String> {
    let data = under(root, &d.data_dir);
    let fresh = with_suffix(&data, &format!(".restore-{}", d.restore_id));
    let aside = with_suffix(&data, &format!(".before-restore-{}", d.restore_id));
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    if fresh.exists() {
        std::fs::remove_dir_all(&fresh).map_err(|e| io("removing", &fresh, e))?;
    }
    let snapshot = under(root, &d.snapshot);
    let output = std::process::Command::new(under(root, &d.etcdutl))
        .arg("snapshot")
        .arg("restore")
        .arg(&snapshot)
        .arg("--data-dir")
        .arg(&fresh)
        .arg(format!("--name={}", d.name))
        .arg(format!("--initial-cluster={}", d.initial_cluster))
        .arg(format!("--initial-cluster-token={}", d.token))
        .arg(format!("--initial-advertise-peer-urls={}", d.peer_url))
        .arg(format!("--bump-revision={}", d.bump_revision))
        .arg("--mark-compacted")
        .output()
        .map_err(|e| format!("running {}: {e}", d.etcdutl.display()))?;
    if !output.status.success() {
        return Err(format!(
            "etcdutl snapshot restore failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    // The data directory from before the restore is kept once, for an operator to look into.
    if aside.exists() {
        if data.exists() {
            std::fs::remove_dir_all(&data).map_err(|e| io("removing", &data, e))?;
        }
    } else if data.exists() {
        std::fs::rename(&data, &aside).map_err(|e| io("moving aside", &data, e))?;
    }
    std::fs::rename(&fresh, &data).map_err(|e| io("moving into place", &fresh, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    /// A stand-in `etcdutl` under `root`: makes the `--data-dir` it is given (or fails).
    fn etcdutl(root: &Path, fails: bool) -> DataDir {
        let bin = root.join("usr/local/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let script = if fails {
            "#!/bin/sh\necho 'snapshot file has wrong checksum' >&2\nexit 1\n".to_owned()
        } else {
            "#!/bin/sh\nwhile [ $# -gt 0 ]; do\n  if [ \"$1\" = --data-dir ]; then mkdir -p \"$2/member\" && echo restored > \"$2/member/marker\"; fi\n  shift\ndone\n".to_owned()
        };
        std::fs::write(bin.join("etcdutl"), script).unwrap();
        std::fs::set_permissions(bin.join("etcdutl"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
        DataDir {
            etcdutl: "/usr/local/bin/etcdutl".into(),
            snapshot: "/var/lib/exk8s/restore-7/snapshot.db".into(),
            data_dir: "/var/lib/etcd".into(),
            restore_id: 7,
            name: "cp-1".into(),
            peer_url: "https://10.0.0.1:2380".into(),
            initial_cluster: "cp-1=https://10.0.0.1:2380".into(),
            token: "t".into(),
            bump_revision: 1_000_000,
        }
    }

    #[test]
    fn the_old_data_is_kept_aside_once_and_a_replay_ends_the_same() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let data = root.join("var/lib/etcd");
        std::fs::create_dir_all(data.join("member")).unwrap();
        std::fs::write(data.join("member/old"), "before").unwrap();
        let restore = etcdutl(root, false);
        restore_data_dir(root, &restore).unwrap();
        let aside = root.join("var/lib/etcd.before-restore-7");
        assert_eq!(
            std::fs::read_to_string(aside.join("member/old")).unwrap(),
            "before"
        );
        assert!(data.join("member/marker").exists());
        assert!(!root.join("var/lib/etcd.restore-7").exists());
        // Run again (a crash before the step was acknowledged): the same end, the old data
        // still aside.
        restore_data_dir(root, &restore).unwrap();
        assert_eq!(
            std::fs::read_to_string(aside.join("member/old")).unwrap(),
            "before"
        );
        assert!(data.join("member/marker").exists());
        assert!(!data.join("member/old").exists());
    }

    #[test]
    fn a_failed_restore_leaves_the_data_directory_alone() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let data = root.join("var/lib/etcd");
        std::fs::create_dir_all(data.join("member")).unwrap();
        std::fs::write(data.join("member/old"), "before").unwrap();
        let restore = etcdutl(root, true);
        let error = restore_data_dir(root, &restore).unwrap_err();
        assert!(error.contains("wrong checksum"), "{error}");
        assert_eq!(
            std::fs::read_to_string(data.join("member/old")).unwrap(),
            "before"
        );
        assert!(!root.join("var/lib/etcd.before-restore-7").exists());
    }
}
