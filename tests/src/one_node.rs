//! One control-plane node founded through the API and running for real: `exk8s-agent run` in
//! its root, its etcd and static pods started from what the bundle rendered, inside a network
//! namespace where the control-plane name resolves to it, and its apiserver ready. The shared
//! start of every test that needs one live apiserver (restore, snapshots, the service-account
//! key, the control plane itself).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::cluster::{Founded, agent_ok, found, install_recorded_artifacts};
use crate::control_plane::{Node, kubectl_until};
use crate::dev::Stack;
use crate::netns::Lan;

/// How long a booted node's apiserver may take to answer `/readyz`.
pub const READY: Duration = Duration::from_secs(120);

/// A booted one-node cluster.
pub struct OneNode {
    pub founded: Founded,
    pub vm: i64,
    /// The node's root: what the agent wrote, where its processes read.
    pub root: PathBuf,
    pub ip: String,
    pub dns_name: String,
    /// One namespace (index 0) with the node's address.
    pub lan: Lan,
    pub node: Node,
    /// The static pods the first sync started, in order.
    pub static_pods: Vec<&'static str>,
    /// The break-glass kubeconfig (`system:masters`), as the first node's plan uses it.
    pub super_admin: PathBuf,
}

impl OneNode {
    /// Waits until the apiserver answers `/readyz` with `ok` ([`READY`]).
    pub fn ready(&mut self) {
        let ready = kubectl_until(
            &self.lan,
            &mut [&mut self.node],
            0,
            &self.super_admin,
            &["get", "--raw", "/readyz"],
            READY,
        );
        assert_eq!(ready, "ok");
    }
}

/// Founds a one-node cluster on `stack` (the request's defaults, `extra`'s fields over them),
/// boots it with the real agent into `dir/vm-<id>` and waits until its apiserver is ready.
pub fn boot_one(stack: &Stack, dir: &Path, extra: &Value) -> OneNode {
    let mut request = json!({"control_plane_count": 1, "control_plane_image_id": 1,
                             "control_plane_instance_type": "dev.small", "subnet_id": 1});
    for (field, value) in extra.as_object().expect("extra fields are an object") {
        request[field] = value.clone();
    }
    let founded = found(stack, dir, &request);
    let vm = founded.vms[0];
    let root = dir.join(format!("vm-{vm}"));
    agent_ok(stack, &founded, &root, vm, "run");
    install_recorded_artifacts(&root);
    let ip = founded.ip_of[&vm].clone();
    let dns_name = founded.created["control_plane_dns_name"]
        .as_str()
        .expect("the founding answer names the control plane")
        .to_owned();
    let lan = Lan::new(&[&ip], 24, &format!("{ip} {dns_name}\n"));
    let mut node = Node::new(&root, 0);
    node.start_etcd(&lan);
    let static_pods = node.sync_static_pods(&lan);
    let super_admin = root.join("etc/exk8s/kubeconfig/super-admin.kubeconfig");
    let mut booted = OneNode {
        founded,
        vm,
        root,
        ip,
        dns_name,
        lan,
        node,
        static_pods,
        super_admin,
    };
    booted.ready();
    booted
}
