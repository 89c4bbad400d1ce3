//! Releases side by side, Kubernetes' under `/opt/exk8s/kubernetes/<version>/` and etcd's under
//! `/opt/exk8s/etcd/<version>/` (each a [`Shelf`]): a bundle installs its release's binaries
//! beside the one running, and its units name them, so a failed update is undone by putting the
//! old units back — the old binaries never left. Once an update is applied the releases of each
//! shelf it does not use are removed, but for the one the node ran before it (a rollback must
//! find it).

use std::collections::BTreeSet;
use std::path::Path;

use exk8s_common::payload::BundlePayload;

/// A directory of releases side by side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shelf {
    Kubernetes,
    Etcd,
}

/// Every shelf.
pub const SHELVES: [Shelf; 2] = [Shelf::Kubernetes, Shelf::Etcd];

impl Shelf {
    /// Where its releases live, under the root.
    pub fn dir(self) -> &'static str {
        match self {
            Self::Kubernetes => "opt/exk8s/kubernetes",
            Self::Etcd => "opt/exk8s/etcd",
        }
    }
}

impl std::fmt::Display for Shelf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kubernetes => "Kubernetes",
            Self::Etcd => "etcd",
        })
    }
}

/// The releases of `shelf` that `bundle`'s artifacts are installed into.
pub fn of_bundle(bundle: &BundlePayload, shelf: Shelf) -> BTreeSet<String> {
    bundle
        .artifacts
        .iter()
        .filter_map(|a| {
            let rest = a
                .dest
                .relative()
                .strip_prefix(shelf.dir())?
                .strip_prefix('/')?;
            rest.split_once('/').map(|(release, _)| release.to_owned())
        })
        .collect()
}

/// The releases to keep after applying a bundle that runs `running`, given those kept before
/// (`before`, the current ones last): `running`, after the last release before that it does not
/// run. A bundle that names no release keeps what was kept.
pub fn used(before: &[String], running: &BTreeSet<String>) -> Vec<String> {
    if running.is_empty() {
        return before.to_vec();
    }
    let previous = before.iter().rev().find(|r| !running.contains(*r));
    previous.into_iter().chain(running).cloned().collect()
}

/// Removes every release directory of `shelf` under `root` that `keep` does not name; the ones
/// removed.
pub fn prune(root: &Path, shelf: Shelf, keep: &BTreeSet<String>) -> std::io::Result<Vec<String>> {
    let dir = root.join(shelf.dir());
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut removed = Vec::new();
    for entry in entries {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if keep.contains(&name) || !entry.file_type()?.is_dir() {
            continue;
        }
        std::fs::remove_dir_all(entry.path())?;
        removed.push(name);
    }
    removed.sort();
    Ok(removed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn set(releases: &[&str]) -> BTreeSet<String> {
        releases.iter().map(|r| (*r).to_owned()).collect()
    }

    #[test]
    fn the_running_release_and_the_one_before_it_are_kept() {
        let first = used(&[], &set(&["v1.35.3"]));
        assert_eq!(first, ["v1.35.3"]);
        let upgraded = used(&first, &set(&["v1.36.3"]));
        assert_eq!(upgraded, ["v1.35.3", "v1.36.3"]);
        // A renewal at the same release keeps the one before for a rollback.
        assert_eq!(used(&upgraded, &set(&["v1.36.3"])), ["v1.35.3", "v1.36.3"]);
        // Rolled back: the newer one is the one before now.
        assert_eq!(used(&upgraded, &set(&["v1.35.3"])), ["v1.36.3", "v1.35.3"]);
        assert_eq!(
            used(&upgraded, &set(&["v1.37.2"])),
            ["v1.36.3", "v1.37.2"],
            "the oldest goes"
        );
        assert_eq!(used(&upgraded, &BTreeSet::new()), upgraded);
    }

    #[test]
    fn only_the_releases_kept_survive() {
        let root = tempfile::tempdir().unwrap();
        let releases = root.path().join(Shelf::Kubernetes.dir());
        for release in ["v1.34.6", "v1.35.3", "v1.36.3"] {
            let dir = releases.join(release);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("kubelet"), b"binary").unwrap();
        }
        let etcd = root.path().join(Shelf::Etcd.dir()).join("v3.6.10");
        std::fs::create_dir_all(&etcd).unwrap();
        std::fs::write(releases.join("notes"), b"not a release").unwrap();
        let keep: BTreeSet<String> = ["v1.35.3", "v1.36.3"].map(String::from).into();
        assert_eq!(
            prune(root.path(), Shelf::Kubernetes, &keep).unwrap(),
            ["v1.34.6"]
        );
        assert!(releases.join("v1.35.3/kubelet").is_file());
        assert!(releases.join("v1.36.3/kubelet").is_file());
        assert!(releases.join("notes").is_file());
        assert!(etcd.is_dir(), "another shelf is not touched");
        let etcd_keep: BTreeSet<String> = ["v3.6.14".to_owned()].into();
        assert_eq!(
            prune(root.path(), Shelf::Etcd, &etcd_keep).unwrap(),
            ["v3.6.10"]
        );
        assert!(
            prune(&root.path().join("nothing"), Shelf::Kubernetes, &keep)
                .unwrap()
                .is_empty()
        );
    }
}
