//! The previous release of exk8s and this one, side by side on one PostgreSQL database, with
//! real binaries: the previous release's `exk8s-api` and `exk8s-agent`, built from its commit of
//! this repository (`scripts/previous-release.sh`), and this workspace's. The previous release
//! serves first, with the simulated cloud, and founds a cluster whose first node its own agent
//! boots. Then this release starts beside it — a rolling deploy: it migrates the schema past
//! what the previous release knows — and another process of the previous release starts after
//! that, against the newer schema. Each API hands bundles to either release's agent (the
//! previous agent says nothing of the formats it reads and is served v2; this one says it reads
//! v2, and its release shows on its node), a rollout asked of the previous release reaches every
//! node through either, the previous agent syncing through this release, and a snapshot asked
//! of this release is seen by the previous one. (Host actions are recorded, as in `e2e.rs`.)

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use exk8s_tests::bins::previous_release;
use exk8s_tests::cluster::{agent_of, found, operator, view};
use exk8s_tests::dev::{Stack, serve_from};
use exk8s_tests::procs::{binary, free_port};
use serde_json::{Value, json};

/// `exk8s-api ARGS` of the binary at `bin`; its stdout.
fn api(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{} {args:?}: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// What every API process of the test shares: the database, the keys, the simulated cloud
/// (served by the first process, which owns it) and the operator token.
struct Shared {
    db_url: String,
    kek: String,
    signing: String,
    token: String,
}

/// `serve` arguments at `port`: `cloud` is the first process's own simulated cloud (`None`) or
/// the URL of that process, whose compute API the others use.
fn serve_args(shared: &Shared, port: u16, cloud: Option<&str>) -> Vec<String> {
    let base = format!("http://127.0.0.1:{port}");
    let mut args: Vec<String> = [
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--database-url",
        &shared.db_url,
        "--kek-file",
        &shared.kek,
        "--signing-key",
        &shared.signing,
        "--public-url",
        &base,
        "--agent-insecure-http",
        "--bootstrap-rate-per-vm",
        "600",
        "--bootstrap-rate-per-source",
        "6000",
    ]
    .map(str::to_owned)
    .to_vec();
    match cloud {
        None => args.extend(
            [
                "--compute",
                "sim",
                "--dns",
                "sim",
                "--imds",
                "sim",
                "--imds-url",
                &format!("{base}/sim/imds"),
                "--sim-cidr",
                "10.219.0.0/24",
            ]
            .map(str::to_owned),
        ),
        Some(owner) => args.extend(
            [
                "--compute-url",
                &format!("{owner}/sim/compute"),
                "--dns",
                "none",
            ]
            .map(str::to_owned),
        ),
    }
    args
}

fn node(view: &Value, vm: i64) -> &Value {
    view["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["vm_id"] == vm)
        .unwrap()
}

/// Runs `command` of the agent at `bin` for `vm` against the API of `stack`, with the
/// instance metadata of `cloud` (the first process's simulated cloud) and its files under
/// `root` (host actions recorded); panics with its log unless it succeeds.
fn agent_ok(
    bin: &Path,
    stack: &Stack,
    cloud: &Stack,
    keys: &Path,
    root: &Path,
    vm: i64,
    command: &str,
) {
    let out = agent_of(bin, stack, cloud, keys, root, vm, command);
    assert!(
        out.status.success(),
        "{} {command} for vm {vm} against {}: {}",
        bin.display(),
        stack.base,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_previous_release_and_this_one_serve_one_database_and_each_others_agents() {
    let (previous_api, previous_agent) = (
        previous_release("exk8s-api"),
        previous_release("exk8s-agent"),
    );
    let (this_api, this_agent): (PathBuf, PathBuf) = (binary("exk8s-api"), binary("exk8s-agent"));
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let db_url = exk8s_tests::postgres::fresh_shared_database("skew");
    let kek = dir.join("kek.key").display().to_string();
    let signing = dir.join("signing.key").display().to_string();
    api(&previous_api, &["keys", "generate-kek", "--out", &kek]);
    api(&previous_api, &["keys", "generate", "--out", &signing]);
    // The previous release migrates the empty database and makes the operator's token.
    let token = api(
        &previous_api,
        &[
            "tokens",
            "create",
            "--database-url",
            &db_url,
            "--org",
            "1",
            "--principal",
            "skew",
            "--scope",
            "operator",
        ],
    )
    .trim()
    .to_owned();
    let shared = Shared {
        db_url,
        kek,
        signing,
        token,
    };

    // The previous release serves, with the simulated cloud, and founds a 3-member cluster.
    let port = free_port();
    let cloud = serve_from(
        &previous_api,
        &format!("http://127.0.0.1:{port}"),
        &shared.token,
        &serve_args(&shared, port, None),
        &dir.join("previous.log"),
    );
    let founded = found(
        &cloud,
        dir,
        &json!({"control_plane_count": 3, "control_plane_image_id": 1,
                "control_plane_instance_type": "dev.small", "subnet_id": 1}),
    );
    let vms = &founded.vms;
    let roots: Vec<PathBuf> = vms
        .iter()
        .map(|vm| dir.join(format!("root-{vm}")))
        .collect();
    // Its own agent boots the first node.
    agent_ok(
        &previous_agent,
        &cloud,
        &cloud,
        &founded.keys,
        &roots[0],
        vms[0],
        "run",
    );

    // This release starts beside it and migrates the schema past what the previous knows; then
    // another process of the previous release starts against that schema.
    let port = free_port();
    let this = serve_from(
        &this_api,
        &format!("http://127.0.0.1:{port}"),
        &shared.token,
        &serve_args(&shared, port, Some(&cloud.base)),
        &dir.join("this.log"),
    );
    let port = free_port();
    let previous = serve_from(
        &previous_api,
        &format!("http://127.0.0.1:{port}"),
        &shared.token,
        &serve_args(&shared, port, Some(&cloud.base)),
        &dir.join("previous-2.log"),
    );
    let said = std::fs::read_to_string(dir.join("previous-2.log")).unwrap();
    assert!(
        said.contains("a newer exk8s-api migrated this database"),
        "{said}"
    );

    // The previous agent boots the second node through this release; this agent the third
    // through the previous release.
    agent_ok(
        &previous_agent,
        &this,
        &cloud,
        &founded.keys,
        &roots[1],
        vms[1],
        "run",
    );
    agent_ok(
        &this_agent,
        &previous,
        &cloud,
        &founded.keys,
        &roots[2],
        vms[2],
        "run",
    );
    let seen = view(&this, founded.cluster);
    assert!(
        seen["nodes"]
            .as_array()
            .unwrap()
            .iter()
            .all(|n| n["phase"] == "complete"),
        "{seen}"
    );
    assert_eq!(seen["ready"], true, "{seen}");
    // The previous agent says nothing of itself; the previous API records nothing.
    for vm in vms {
        assert!(node(&seen, *vm).get("agent_version").is_none(), "{seen}");
    }

    // A rollout asked of the previous release; every node syncs through the other API than the
    // one it booted from, the previous agent through this release.
    let started = operator(
        &previous,
        "POST",
        &format!("/clusters/{}/rollout", founded.cluster),
    )
    .call()
    .unwrap();
    assert_eq!(started.status(), 202);
    agent_ok(
        &previous_agent,
        &this,
        &cloud,
        &founded.keys,
        &roots[0],
        vms[0],
        "sync",
    );
    agent_ok(
        &previous_agent,
        &previous,
        &cloud,
        &founded.keys,
        &roots[1],
        vms[1],
        "sync",
    );
    agent_ok(
        &this_agent,
        &this,
        &cloud,
        &founded.keys,
        &roots[2],
        vms[2],
        "sync",
    );
    let rolled = view(&previous, founded.cluster);
    for vm in vms {
        let n = node(&rolled, *vm);
        assert_eq!(
            (n["applied_generation"].as_i64(), n["up_to_date"].as_bool()),
            (Some(2), Some(true)),
            "{rolled}"
        );
    }
    // This agent named its release to this API.
    assert_eq!(
        node(&view(&this, founded.cluster), vms[2])["agent_version"],
        env!("CARGO_PKG_VERSION")
    );

    // A snapshot asked of this release, seen by the previous one.
    let asked: Value = operator(
        &this,
        "POST",
        &format!("/clusters/{}/snapshots", founded.cluster),
    )
    .call()
    .unwrap()
    .into_json()
    .unwrap();
    let listed: Value = operator(
        &previous,
        "GET",
        &format!("/clusters/{}/snapshots", founded.cluster),
    )
    .call()
    .unwrap()
    .into_json()
    .unwrap();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["id"] == asked["id"] && s["state"] == "requested"),
        "{asked} not in {listed}"
    );
}
