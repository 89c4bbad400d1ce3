//! Bundles signed with the repository's test key, and the agent binary with a clean
//! environment (no host configuration, trusted keys from the fixtures).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{SystemTime, UNIX_EPOCH};

use exk8s_common::BundleSigner;
use exk8s_common::names::{BundlePath, FileMode, Nonce};
use exk8s_common::payload::{BundleFile, BundlePayload, Freshness, Identity, PlanStep, Role};

pub const VM_ID: u64 = 101;
pub const NONCE: &str = "agent-test-nonce-0000000";

/// The fixtures' test key (seed public in common/tests/support/fixtures.rs).
pub fn signer() -> BundleSigner {
    BundleSigner::from_seed(&[0x11; 32])
}

pub fn keys_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../common/tests/data/trusted-keys")
}

pub fn now() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
}

fn path(p: &str) -> BundlePath {
    BundlePath::new(p).unwrap()
}

/// The files of a small node bundle; `version` changes every content.
pub fn files(version: &str) -> Vec<BundleFile> {
    let file = |p: &str, mode: FileMode, body: String| BundleFile::new(path(p), mode, body);
    vec![
        file(
            "/etc/exk8s/config/cluster.env",
            FileMode::PUBLIC,
            format!("VERSION={version}\n"),
        ),
        file(
            "/etc/exk8s/pki/etcd-server.pem",
            FileMode::PUBLIC,
            format!("cert {version}\n"),
        ),
        file(
            "/etc/exk8s/pki/etcd-server-key.pem",
            FileMode::SECRET,
            format!("key {version}\n"),
        ),
        file(
            "/etc/exk8s/kubeconfig/admin.kubeconfig",
            FileMode::SECRET,
            format!("kubeconfig {version}\n"),
        ),
        file(
            "/etc/systemd/system/etcd.service",
            FileMode::PUBLIC,
            format!("[Unit]\nDescription={version}\n"),
        ),
        file(
            "/var/lib/kubelet/config.yaml",
            FileMode::PUBLIC,
            format!("v: {version}\n"),
        ),
    ]
}

pub fn payload(vm_id: u64, serial: u64, files: Vec<BundleFile>) -> BundlePayload {
    let now = now();
    BundlePayload {
        identity: Identity {
            bundle_id: "6f1c1a52-3c7e-4d4e-9a55-0b0f6d1e2a02".parse().unwrap(),
            cluster_id: 42,
            cluster_name: "exk8s-7-2a".parse().unwrap(),
            org_id: 7,
            vm_id,
            node_name: "cp-1.cluster-42.internal".parse().unwrap(),
            role: Role::ControlPlane,
            is_initial_control_plane: true,
            kind: exk8s_common::contract::BundleKind::Bootstrap,
            generation: 1,
        },
        freshness: Freshness {
            issued_at: now - 10,
            expires_at: now + 900,
            serial,
            nonce: Nonce::new(NONCE).unwrap(),
        },
        files,
        artifacts: vec![],
        packages: vec![],
        plan: vec![
            PlanStep::DaemonReload {},
            PlanStep::EnableStart {
                unit: "etcd.service".parse().unwrap(),
                watch: vec![
                    path("/etc/systemd/system/etcd.service"),
                    path("/etc/exk8s/pki/etcd-server.pem"),
                ],
            },
        ],
    }
}

pub fn sign(payload: &BundlePayload) -> Vec<u8> {
    signer().sign_bundle(payload).unwrap()
}

/// Writes envelope bytes to a file in `dir`.
pub fn bundle_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

/// The agent binary, with no host configuration and the test key trusted.
pub fn agent(scratch: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_exk8s-agent"));
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("EXK8S_CONFIG", scratch.join("no-agent.toml"))
        .arg("--keys-dir")
        .arg(keys_dir());
    command
}

pub fn code(output: &Output) -> i32 {
    output.status.code().unwrap_or(-1)
}

pub fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Regular files as (relative path, mode, content).
pub type Tree = Vec<(String, u32, Vec<u8>)>;

/// Every regular file under `root`, relative, with mode and content.
pub fn tree(root: &Path) -> Tree {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                let rel = entry
                    .path()
                    .strip_prefix(root)
                    .unwrap()
                    .display()
                    .to_string();
                out.push((
                    rel,
                    meta.permissions().mode() & 0o7777,
                    std::fs::read(entry.path()).unwrap_or_default(),
                ));
            }
        }
    }
    out.sort();
    out
}

/// Where the agent keeps its node key, relative to the root.
pub const NODE_KEY: &str = "var/lib/exk8s/node.key";

/// What a refused first boot leaves: only the node key it made before fetching (and the
/// empty lock file it held).
pub fn only_the_node_key(root: &Path) -> bool {
    let files: Tree = tree(root)
        .into_iter()
        .filter(|(p, _, content)| !(p == "var/lib/exk8s/agent.lock" && content.is_empty()))
        .collect();
    files.len() == 1 && files[0].0 == NODE_KEY && files[0].1 == 0o600
}
