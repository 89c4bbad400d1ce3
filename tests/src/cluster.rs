//! A cluster founded over HTTP on a running stack, and its VMs driven by the real agent: the
//! founding answer, the API's published bundle-signing keys written where the agent trusts
//! them, each node's private address, and `exk8s-agent run`/`sync` against the stack's
//! simulated instance metadata with host actions recorded under a root.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::dev::{Stack, http};
use crate::procs::binary;

/// A founded cluster as the tests see it.
pub struct Founded {
    pub cluster: i64,
    pub vms: Vec<i64>,
    /// VM id → private IPv4.
    pub ip_of: BTreeMap<i64, String>,
    /// The directory of trusted bundle-signing keys for the agents.
    pub keys: PathBuf,
    /// The `POST /clusters` answer (operator kubeconfig included).
    pub created: Value,
}

/// The API's published bundle-signing keys, in `dir/keys` for the agents to trust.
pub fn trusted_keys(stack: &Stack, dir: &Path) -> PathBuf {
    let keys = dir.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let published = http()
        .get(&format!("{}/bootstrap/keys", stack.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    std::fs::write(keys.join("api.pub"), published).unwrap();
    keys
}

/// An operator request with the stack's token.
pub fn operator(stack: &Stack, method: &str, path: &str) -> ureq::Request {
    http()
        .request(method, &format!("{}{path}", stack.base))
        .set("Authorization", &format!("Bearer {}", stack.token))
}

/// The operator kubeconfig `GET /clusters/{id}/kubeconfig` hands out now.
pub fn operator_kubeconfig(stack: &Stack, cluster: i64) -> String {
    operator(stack, "GET", &format!("/clusters/{cluster}/kubeconfig"))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

/// `GET /clusters/{id}` as JSON.
pub fn view(stack: &Stack, cluster: i64) -> Value {
    operator(stack, "GET", &format!("/clusters/{cluster}"))
        .call()
        .unwrap()
        .into_json()
        .unwrap()
}

/// Founds a cluster with `body`; publishes the API's keys under `dir/keys`.
pub fn found(stack: &Stack, dir: &Path, body: &Value) -> Founded {
    let created: Value = operator(stack, "POST", "/clusters")
        .set("Prefer", "wait=600")
        .send_json(body)
        .unwrap()
        .into_json()
        .unwrap();
    let cluster = created["cluster_id"].as_i64().unwrap();
    let vms: Vec<i64> = created["control_plane_vm_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let keys = trusted_keys(stack, dir);
    let ip_of = view(stack, cluster)["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["vm_id"].as_i64().unwrap(),
                n["private_ipv4"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    Founded {
        cluster,
        vms,
        ip_of,
        keys,
        created,
    }
}

/// `exk8s-agent <command> --root ROOT` for `vm`; `fail` names a recorded action that fails
/// once (a failed health check).
pub fn agent(
    stack: &Stack,
    keys: &Path,
    root: &Path,
    vm: i64,
    command: &str,
    fail: Option<&str>,
) -> Output {
    let mut agent = Command::new(binary("exk8s-agent"));
    agent_arguments(&mut agent, stack, keys, root, vm, command)
        .env("EXK8S_AGENT_TEST_FAIL_ACTION", fail.unwrap_or_default())
        .output()
        .unwrap()
}

/// `command`'s arguments for VM `vm` of `stack` (trusting `keys`, its files under `root`),
/// with no config file.
fn agent_arguments<'c>(
    agent: &'c mut Command,
    stack: &Stack,
    keys: &Path,
    root: &Path,
    vm: i64,
    command: &str,
) -> &'c mut Command {
    agent_arguments_with(agent, stack, stack, keys, root, vm, command)
}

/// [`agent_arguments`] with the instance metadata of `imds`'s stack (the one whose simulated
/// cloud made the VM) and the API of `stack`.
fn agent_arguments_with<'c>(
    agent: &'c mut Command,
    stack: &Stack,
    imds: &Stack,
    keys: &Path,
    root: &Path,
    vm: i64,
    command: &str,
) -> &'c mut Command {
    agent
        .env("EXK8S_CONFIG", root.with_extension("no-config.toml"))
        .arg("--keys-dir")
        .arg(keys)
        .args([command, "--root"])
        .arg(root)
        .args([
            "--api-url",
            &stack.base,
            "--imds-url",
            &format!("{}/sim/imds/{vm}", imds.base),
            "--insecure-http",
        ])
}

/// `command` of the exk8s-agent at `bin` (another release's) for `vm` against the API of
/// `stack`, asking the instance metadata of `imds`; host actions recorded under `root`.
pub fn agent_of(
    bin: &Path,
    stack: &Stack,
    imds: &Stack,
    keys: &Path,
    root: &Path,
    vm: i64,
    command: &str,
) -> Output {
    agent_arguments_with(&mut Command::new(bin), stack, imds, keys, root, vm, command)
        .output()
        .unwrap()
}

/// Runs `command` for `vm` and panics with its log unless it succeeds.
pub fn agent_ok(stack: &Stack, founded: &Founded, root: &Path, vm: i64, command: &str) {
    let out = agent(stack, &founded.keys, root, vm, command, None);
    assert!(
        out.status.success(),
        "exk8s-agent {command} for vm {vm}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Each of `founded`'s control-plane VMs booted by `exk8s-agent run` into
/// `dir/<prefix>-<vm>`, in VM order; their roots.
pub fn run_each(stack: &Stack, founded: &Founded, dir: &Path, prefix: &str) -> Vec<PathBuf> {
    founded
        .vms
        .iter()
        .map(|vm| {
            let root = dir.join(format!("{prefix}-{vm}"));
            agent_ok(stack, founded, &root, *vm, "run");
            root
        })
        .collect()
}
