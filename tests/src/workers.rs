//! A worker pool as the API shows it (its workers booted for real run on booted machines:
//! `tests/tests/boot_cluster.rs`).

use serde_json::Value;

use crate::cluster::operator;
use crate::dev::Stack;

/// `GET /clusters/{cluster}/node-pools/{pool}` as JSON.
pub fn pool_view(stack: &Stack, cluster: i64, pool: i64) -> Value {
    operator(
        stack,
        "GET",
        &format!("/clusters/{cluster}/node-pools/{pool}"),
    )
    .call()
    .unwrap()
    .into_json()
    .unwrap()
}

/// A pool view's workers: VM id and removal (`null`, `draining`, `drained`).
pub fn pool_workers(view: &Value) -> Vec<(i64, Value)> {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| (n["vm_id"].as_i64().unwrap(), n["removal"].clone()))
        .collect()
}
