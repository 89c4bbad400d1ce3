//! This member's part of an in-place restore of the cluster's etcd, one step per generation
//! check that names it ([`RestoreTask`]), each acknowledged to the API:
//!
//! - `stop`: the control-plane static-pod manifests move aside (the kubelet stops their pods),
//!   then etcd stops;
//! - `restore`: the snapshot comes from the API (signed, as etcd wrote it) into a 0600 file,
//!   its SHA-256 is checked, `etcdutl snapshot restore` makes a fresh data directory of it as
//!   a new logical cluster (new token, the full initial cluster, the revision bumped and older
//!   ones marked compacted), the old data directory is kept aside and the new one takes its
//!   place; then etcd starts (it waits for the other members to form its quorum);
//! - `start`: once etcd answers healthy, the manifests come back and the apiserver must answer.
//!
//! Each step can be run again after a crash: moves are checked before they are made, and a
//! restore into the data directory is made again from the snapshot.

use std::path::{Path, PathBuf};
use std::time::Duration;

use exk8s_common::contract::{RestoreStep, RestoreTask};
use exk8s_common::names::UnitName;

use crate::apply::etcd_data::DataDir;
use crate::apply::host::{Host, HostAction};
use crate::apply::waits;
use crate::error::AgentError;
use crate::log::log_info;
use crate::node_api::NodeApi;

/// How long etcd and the apiserver may take to answer after a restore.
const COME_BACK: Duration = Duration::from_secs(600);
/// How long fetching the snapshot may take.
const FETCH: Duration = Duration::from_secs(30 * 60);

/// Does `task`'s step through `host` and acknowledges it (done, or why not).
pub fn perform(
    node: &NodeApi<'_>,
    host: &mut dyn Host,
    (root_dir, applied): (&Path, u64),
    health: Option<&crate::state::EtcdHealth>,
    task: &RestoreTask,
    deadline: Duration,
) -> Result<(), AgentError> {
    let step = task.step;
    log_info!("restore {}: {} step started", task.id, step.as_str());
    let done = match step {
        RestoreStep::Stop => stop(host, root_dir, task),
        RestoreStep::Restore => restore(node, host, root_dir, task),
        RestoreStep::Start => start(host, root_dir, health, task),
    };
    match done {
        Ok(()) => {
            node.restore_ack(task.id, step, "", deadline)?;
            log_info!("restore {}: {} step done", task.id, step.as_str());
            if step == RestoreStep::Start {
                // The control plane is back: the node runs its generation healthy again.
                crate::report::Reporter::to(crate::report::Target::Node(node))
                    .with_generation(applied)
                    .outcome(
                        exk8s_common::contract::BootPhase::Sync,
                        crate::report::State::Succeeded,
                        &format!("etcd restored (restore {})", task.id),
                    );
            }
            Ok(())
        }
        Err(e) => {
            let why = crate::error::chain(&e);
            node.restore_ack(task.id, step, &why, deadline)?;
            Err(e)
        }
    }
}

fn etcd_unit() -> Result<UnitName, AgentError> {
    UnitName::new("etcd.service").map_err(|e| AgentError::Config(e.to_string()))
}

fn under(root: &Path, path: &Path) -> PathBuf {
    root.join(path.strip_prefix("/").unwrap_or(path))
}

/// Where restore `id` keeps the snapshot it fetched.
fn aside_dir(root_dir: &Path, id: i64) -> PathBuf {
    crate::state::state_dir(root_dir).join(format!("restore-{id}"))
}

/// Where the static-pod manifests wait while etcd is restored: one place whatever the
/// restore, so a restore that follows a failed one (its manifests still aside) brings them
/// back.
fn manifests_aside(root_dir: &Path) -> PathBuf {
    crate::state::state_dir(root_dir).join("restore-manifests")
}

fn moved(from: &Path, to: &Path) -> Result<(), AgentError> {
    if !from.exists() || to.exists() {
        return Ok(());
    }
    if let Some(dir) = to.parent() {
        std::fs::create_dir_all(dir).map_err(|e| AgentError::State {
            path: dir.to_path_buf(),
            source: e,
        })?;
    }
    std::fs::rename(from, to).map_err(|e| AgentError::State {
        path: from.to_path_buf(),
        source: e,
    })
}

/// (where a manifest runs, where it waits) for each of the task's manifests.
fn manifests(root_dir: &Path, task: &RestoreTask) -> Vec<(PathBuf, PathBuf)> {
    let aside = manifests_aside(root_dir);
    task.manifests
        .iter()
        .filter_map(|m| {
            let path = Path::new(m);
            let name = path.file_name()?;
            Some((under(root_dir, path), aside.join(name)))
        })
        .collect()
}

fn stop(host: &mut dyn Host, root_dir: &Path, task: &RestoreTask) -> Result<(), AgentError> {
    for (running, waiting) in manifests(root_dir, task) {
        moved(&running, &waiting)?;
    }
    host.perform(&HostAction::Stop(&etcd_unit()?))
}

fn restore(
    node: &NodeApi<'_>,
    host: &mut dyn Host,
    root_dir: &Path,
    task: &RestoreTask,
) -> Result<(), AgentError> {
    let file = aside_dir(root_dir, task.id).join("snapshot.db");
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(|e| AgentError::State {
            path: dir.to_path_buf(),
            source: e,
        })?;
    }
    let digest = node.snapshot_content(task.snapshot_id, &file, FETCH)?;
    if digest.to_hex() != task.sha256 {
        let _ = std::fs::remove_file(&file);
        return Err(AgentError::Step {
            step: format!("fetching etcd snapshot {}", task.snapshot_id),
            reason: format!(
                "its SHA-256 is {}, not the {} the API recorded",
                digest.to_hex(),
                task.sha256
            ),
        });
    }
    let relative = file.strip_prefix(root_dir).unwrap_or(&file);
    let restored = host.perform(&HostAction::RestoreEtcd(DataDir {
        etcdutl: task.etcdutl.clone().into(),
        snapshot: Path::new("/").join(relative),
        data_dir: task.data_dir.clone().into(),
        restore_id: task.id,
        name: task.member_name.clone(),
        peer_url: task.peer_url.clone(),
        initial_cluster: task.initial_cluster.clone(),
        token: task.initial_cluster_token.clone(),
        bump_revision: task.bump_revision,
    }));
    let _ = std::fs::remove_file(&file);
    restored?;
    host.perform(&HostAction::Start(&etcd_unit()?))
}

fn start(
    host: &mut dyn Host,
    root_dir: &Path,
    health: Option<&crate::state::EtcdHealth>,
    task: &RestoreTask,
) -> Result<(), AgentError> {
    let health = health.ok_or_else(|| {
        AgentError::Config("this node's state names no etcd health check: it runs no member".into())
    })?;
    host.perform(&HostAction::WaitEtcd(waits::EtcdProbe {
        endpoint: health.endpoint.clone(),
        ca_file: health.ca_file.clone().into(),
        cert_file: health.cert_file.clone().into(),
        key_file: health.key_file.clone().into(),
        timeout: COME_BACK,
    }))?;
    for (running, waiting) in manifests(root_dir, task) {
        moved(&waiting, &running)?;
    }
    host.perform(&HostAction::WaitApiserver(waits::ApiserverProbe {
        kubeconfig: "/etc/exk8s/kubeconfig/admin.kubeconfig".into(),
        timeout: COME_BACK,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(id: i64) -> RestoreTask {
        RestoreTask {
            id,
            step: RestoreStep::Stop,
            snapshot_id: 1,
            sha256: String::new(),
            member_name: "cp-1".into(),
            peer_url: "https://10.0.0.1:2380".into(),
            initial_cluster: "cp-1=https://10.0.0.1:2380".into(),
            initial_cluster_token: "t".into(),
            bump_revision: 1,
            data_dir: "/var/lib/etcd".into(),
            etcdutl: "/usr/local/bin/etcdutl".into(),
            manifests: vec!["/etc/kubernetes/manifests/kube-apiserver.yaml".into()],
        }
    }

    #[test]
    fn manifests_put_aside_by_a_failed_restore_come_back_with_the_next() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        let manifest = root.join("etc/kubernetes/manifests/kube-apiserver.yaml");
        std::fs::create_dir_all(manifest.parent().unwrap()).unwrap();
        std::fs::write(&manifest, "apiserver").unwrap();
        // Restore 1 puts it aside, then fails; restore 2 stops (nothing left to move) and
        // starts: the manifest is back.
        for (running, waiting) in manifests(root, &task(1)) {
            moved(&running, &waiting).unwrap();
        }
        assert!(!manifest.exists());
        for (running, waiting) in manifests(root, &task(2)) {
            moved(&running, &waiting).unwrap();
        }
        for (running, waiting) in manifests(root, &task(2)) {
            moved(&waiting, &running).unwrap();
        }
        assert_eq!(std::fs::read_to_string(&manifest).unwrap(), "apiserver");
    }
}
