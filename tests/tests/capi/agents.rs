//! The agents of the exk8s cluster under Cluster API: one pass of the real agent over each of
//! its VMs, as their boot unit and sync timer run it on a machine.

use std::path::Path;

use exk8s_tests::cluster::{agent, trusted_keys, view as cluster_view};
use exk8s_tests::dev::Stack;
use serde_json::Value;

use super::workers;

/// One pass of the real agent over every VM of exk8s cluster `id` (host actions recorded under
/// `dir/vm-<id>`): `run` on a VM that has not booted, `sync` on the others — what their boot
/// unit and sync timer do on a machine.
pub(crate) fn agents_pass(stack: &Stack, dir: &Path, id: i64) {
    let keys = trusted_keys(stack, dir);
    let view: Value = cluster_view(stack, id);
    for node in view["nodes"].as_array().unwrap() {
        let vm = node["vm_id"].as_i64().unwrap();
        let root = dir.join(format!("vm-{vm}"));
        let booted = root.join("var/lib/exk8s/bootstrap.done").exists();
        let command = if booted { "sync" } else { "run" };
        let out = agent(stack, &keys, &root, vm, command, None);
        // A worker being replaced or deleted may go between the view and its agent's call, and
        // its VM goes before its record: a failed call for a worker being removed is no
        // failure. The pool is read first: a record deleted after that read is missing from
        // the cluster's view read after it.
        let gone = || {
            let removing = workers::pool(stack, id).is_some_and(|p| {
                p["nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|n| n["vm_id"] == vm && !n["removal"].is_null())
            });
            let listed = || {
                let now: Value = cluster_view(stack, id);
                now["nodes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|n| n["vm_id"] == vm)
            };
            removing || !listed()
        };
        assert!(
            out.status.success() || gone(),
            "exk8s-agent {command} for vm {vm}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
