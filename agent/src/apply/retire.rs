//! A static pod replaced in two steps instead of one. Given a manifest with a new `metadata.uid`,
//! the kubelet stops the running pod and may start the new one only after the old one has
//! finished terminating; the new pod asks again after the kubelet's fixed ten-second backoff
//! (with up to half again of jitter), so a replacement written over the running manifest takes
//! 10–15 s longer than the old pod needs to stop. Retiring first — the manifest taken away, then
//! waiting until the kubelet has removed the old pod's directory (`/var/lib/kubelet/pods/<uid>`,
//! which it does only once the pod is finished) — lets the replacement start as soon as it is
//! written. Retiring is only ever a shortcut: past [`PATIENCE`] (a kubelet not running, say) the
//! replacement is written anyway and the kubelet sorts it out as before.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::log::{log_info, log_warn};

/// The longest a replacement waits for the pod it replaces to be cleaned up.
const PATIENCE: Duration = Duration::from_secs(60);

/// The kubelet's directory of pods under `root` (its default `--root-dir`).
fn pod_dir(root: &Path, uid: &str) -> PathBuf {
    root.join("var/lib/kubelet/pods").join(uid)
}

/// The `metadata.uid` of the manifest at `path` (under `root`), if it names one: the running
/// pod's, since exk8s pins every static pod's uid to its manifest's digest.
pub(super) fn running_uid(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string(path).ok()?;
    let manifest: yaml_serde::Value = yaml_serde::from_str(&text).ok()?;
    let uid = manifest.get("metadata")?.get("uid")?.as_str()?;
    // A uid names a directory below the kubelet's: nothing else is taken.
    (!uid.is_empty() && uid.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
        .then(|| uid.to_owned())
}

/// Takes the manifest at `path` away and waits until the kubelet has cleaned up pod `uid`.
pub(super) fn retire(root: &Path, path: &Path, uid: &str) -> Result<(), String> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("removing {}: {e}", path.display())),
    }
    let (dir, start) = (pod_dir(root, uid), Instant::now());
    while dir.exists() {
        if start.elapsed() >= PATIENCE {
            log_warn!(
                "pod {uid} is still not cleaned up after {}s; writing its replacement anyway",
                PATIENCE.as_secs()
            );
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    log_info!(
        "pod {uid} stopped and cleaned up in {:.1}s",
        start.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{pod_dir, retire, running_uid};

    #[test]
    fn the_running_uid_is_read_from_the_manifest() {
        let dir = tempfile::tempdir().unwrap();
        let manifest = dir.path().join("kube-apiserver.yaml");
        for (text, uid) in [
            (
                "apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n  uid: \"3f2a-09\"\n",
                Some("3f2a-09"),
            ),
            ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: a\n", None),
            ("metadata:\n  uid: ../../etc\n", None),
            ("metadata: [", None),
        ] {
            std::fs::write(&manifest, text).unwrap();
            assert_eq!(running_uid(&manifest).as_deref(), uid, "{text}");
        }
        assert_eq!(running_uid(&dir.path().join("missing.yaml")), None);
    }

    #[test]
    fn retiring_takes_the_manifest_away_and_waits_for_the_kubelet() {
        let root = tempfile::tempdir().unwrap();
        let manifest = root.path().join("kube-apiserver.yaml");
        std::fs::write(&manifest, "old").unwrap();
        let pod = pod_dir(root.path(), "abc");
        std::fs::create_dir_all(&pod).unwrap();
        // The kubelet, once the manifest is gone, stops the pod (a while) and cleans it up.
        let kubelet = {
            let (manifest, pod) = (manifest.clone(), pod.clone());
            std::thread::spawn(move || {
                while manifest.exists() {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                std::thread::sleep(std::time::Duration::from_millis(300));
                std::fs::remove_dir_all(pod).unwrap();
            })
        };
        retire(root.path(), &manifest, "abc").unwrap();
        assert!(
            !pod.exists(),
            "returned before the kubelet cleaned the pod up"
        );
        assert!(!manifest.exists());
        kubelet.join().unwrap();
    }
}
