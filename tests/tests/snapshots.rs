//! An etcd snapshot, for real, kept in a local directory and in a bucket of a real
//! S3-compatible server (`s3s-fs`, a process of its own on loopback, SigV4 and multipart
//! uploads): a cluster founded on the dev stack, its node's etcd 3.6 and kube-apiserver run from
//! its bundle in a namespace of its own, a ConfigMap and a Secret written through the apiserver.
//! `exk8s snapshots create` (`POST /clusters/{id}/snapshots`) asks the member; its agent, synced
//! in its namespace (performing its etcd steps for real), streams the snapshot from its etcd and
//! uploads it. The API records it stored, and the store holds only ciphertext; what
//! `exk8s snapshots download` (`GET …/content`) writes is byte for byte what etcd wrote (its
//! digest is the recorded one), `etcdutl snapshot status` reads it (a revision no lower than the
//! one recorded), `etcdutl snapshot restore` makes a data directory of it, and an etcd started
//! from that directory serves the ConfigMap and the Secret — still encrypted, as the apiserver
//! wrote it. `exk8s snapshots delete` asks for `--yes`, then removes the object; `exk8s
//! snapshots schedule` shows and sets the schedule.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::time::Duration;

use exk8s_tests::bins::{ETCD_VERSION, etcd};
use exk8s_tests::cluster::agent_inside;
use exk8s_tests::control_plane::kubectl;
use exk8s_tests::dev::start_dev_with_env;
use exk8s_tests::one_node::{OneNode, boot_one};
use exk8s_tests::procs::{Proc, wait_until};
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};
use std::os::unix::fs::PermissionsExt as _;

/// Where the stack keeps its snapshots.
enum Store {
    /// The default: `snapshots` in the dev stack's data directory.
    Local,
    /// A bucket of a real S3-compatible server (`s3s-fs`) run by the test on loopback.
    S3,
}

/// A running `s3s-fs` over `root`, its bucket made, and the environment the API reads.
fn s3_server(root: &std::path::Path) -> (Proc, Vec<(&'static str, String)>) {
    let port = exk8s_tests::procs::free_port();
    std::fs::create_dir_all(root.join(BUCKET)).unwrap();
    let log = std::fs::File::create(root.with_extension("log")).unwrap();
    let server = Proc(
        std::process::Command::new(exk8s_tests::bins::s3_server())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--access-key",
                "exk8s-test",
                "--secret-key",
                "exk8s-test-secret",
            ])
            .arg(root)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    wait_until("the S3 server", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let env = vec![
        ("AWS_ACCESS_KEY_ID", "exk8s-test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "exk8s-test-secret".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ENDPOINT", format!("http://127.0.0.1:{port}")),
        ("AWS_ALLOW_HTTP", "true".to_owned()),
    ];
    (server, env)
}

const BUCKET: &str = "exk8s-snapshots";

#[test]
fn a_members_snapshot_in_a_local_directory() {
    snapshot_flow(Store::Local, "10.224.0.0/24");
}

#[test]
fn a_members_snapshot_in_an_s3_bucket() {
    snapshot_flow(Store::S3, "10.225.0.0/24");
}

fn snapshot_flow(store: Store, sim_cidr: &str) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (server, env, objects) = match store {
        Store::Local => (None, Vec::new(), dir.join("dev/snapshots")),
        Store::S3 => {
            let (server, env) = s3_server(&dir.join("s3"));
            (Some(server), env, dir.join(format!("s3/{BUCKET}/prod")))
        }
    };
    let s3_url = format!("s3://{BUCKET}/prod");
    let extra: Vec<&str> = match store {
        Store::Local => Vec::new(),
        Store::S3 => vec!["--snapshot-store", &s3_url],
    };
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let stack = start_dev_with_env(
        &dir.join("dev"),
        sim_cidr,
        &dir.join("api.log"),
        &extra,
        &env,
    );
    let OneNode {
        founded,
        vm,
        root,
        lan,
        mut node,
        super_admin,
        ..
    } = boot_one(&stack, dir, &json!({}));
    for args in [
        &[
            "create",
            "configmap",
            "before-snapshot",
            "--from-literal=kept=yes",
        ][..],
        &[
            "create",
            "secret",
            "generic",
            "kept",
            "--from-literal=password=hunter2",
        ][..],
    ] {
        let (ok, _, err) = kubectl(&lan, 0, &super_admin, args);
        assert!(ok, "{err}");
    }

    let cluster = founded.cluster;
    let exk8s = |args: &[&str]| stack.exk8s(dir, args);
    let name = cluster.to_string();
    let shown = exk8s(&["-o", "json", "snapshots", "schedule", &name]);
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(shown, json!({"every_hours": 12, "retain": 14}));
    let set = exk8s(&[
        "-o",
        "json",
        "snapshots",
        "schedule",
        &name,
        "--every-hours",
        "0",
        "--retain",
        "3",
    ]);
    let set: Value = serde_json::from_slice(&set.stdout).unwrap();
    assert_eq!(
        set,
        json!({"every_hours": 0, "retain": 3}),
        "only when asked"
    );
    let asked = exk8s(&["-o", "json", "snapshots", "create", &name]);
    assert!(
        asked.status.success(),
        "{}",
        String::from_utf8_lossy(&asked.stderr)
    );
    let asked: Value = serde_json::from_slice(&asked.stdout).unwrap();
    let id = asked[0]["id"].as_i64().unwrap();
    assert_eq!(asked[0]["state"], "requested");
    let (mut agent, _api) = agent_inside(
        &lan,
        0,
        &stack,
        &founded,
        &root,
        vm,
        "sync",
        Duration::from_secs(60),
    );
    let synced = agent.output().unwrap();
    let log = String::from_utf8_lossy(&synced.stderr);
    assert!(synced.status.success(), "{log}");
    assert!(
        log.contains(&format!("etcd snapshot {id} taken and uploaded")),
        "{log}"
    );
    let listed = exk8s(&["-o", "json", "snapshots", "list", &name]);
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    let stored = listed[0].clone();
    assert_eq!(stored["id"], id);
    assert_eq!(stored["state"], "stored", "{stored}");
    assert_eq!(
        format!("v{}", stored["etcd_version"].as_str().unwrap()),
        ETCD_VERSION
    );
    // The agent's file is gone; the store holds only the sealed object.
    let leftovers: Vec<_> = std::fs::read_dir(root.join("var/lib/exk8s"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snapshot-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
    let object = std::fs::read_dir(objects.join(format!("clusters/{cluster}/snapshots")))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{id}-")))
        })
        .expect("the snapshot's object");
    let sealed = std::fs::read(&object).unwrap();
    assert!(!sealed.windows(14).any(|w| w == b"before-snapshot"));

    // What comes back is what etcd wrote (the CLI checks its digest against the recorded one).
    let file = dir.join("snapshot.db");
    let downloaded = exk8s(&[
        "snapshots",
        "download",
        &name,
        &id.to_string(),
        "-f",
        file.to_str().unwrap(),
    ]);
    assert!(
        downloaded.status.success(),
        "{}",
        String::from_utf8_lossy(&downloaded.stderr)
    );
    let content = std::fs::read(&file).unwrap();
    assert_eq!(content.len() as u64, stored["size_bytes"].as_u64().unwrap());
    assert_eq!(
        hex(&Sha256::digest(&content)),
        stored["sha256"].as_str().unwrap()
    );
    assert_eq!(
        std::fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let status = std::process::Command::new(etcd("etcdutl"))
        .args(["snapshot", "status", "-w", "json"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        status.status.success(),
        "{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let status: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert!(
        status["revision"].as_i64().unwrap() >= stored["revision"].as_i64().unwrap(),
        "{status} {stored}"
    );
    assert!(status["totalKey"].as_i64().unwrap() > 0, "{status}");

    // It restores, and the restored member serves what was written.
    let data = dir.join("restored");
    let restored = std::process::Command::new(etcd("etcdutl"))
        .args(["snapshot", "restore"])
        .arg(&file)
        .arg("--data-dir")
        .arg(&data)
        .args([
            "--name=restored",
            "--initial-cluster=restored=http://127.0.0.1:23800",
            "--initial-advertise-peer-urls=http://127.0.0.1:23800",
        ])
        .output()
        .unwrap();
    assert!(
        restored.status.success(),
        "{}",
        String::from_utf8_lossy(&restored.stderr)
    );
    let log = std::fs::File::create(dir.join("restored-etcd.log")).unwrap();
    let member = Proc(
        lan.command(0, etcd("etcd"))
            .arg("--data-dir")
            .arg(&data)
            .args([
                "--name=restored",
                "--listen-client-urls=http://127.0.0.1:23790",
                "--advertise-client-urls=http://127.0.0.1:23790",
                "--listen-peer-urls=http://127.0.0.1:23800",
                "--initial-advertise-peer-urls=http://127.0.0.1:23800",
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    let get = |key: &str| {
        let out = lan
            .command(0, etcd("etcdctl"))
            .args([
                "--endpoints=http://127.0.0.1:23790",
                "get",
                key,
                "--print-value-only",
            ])
            .output()
            .unwrap();
        out.stdout
    };
    wait_until("the restored member", Duration::from_secs(30), || {
        !get("/registry/configmaps/default/before-snapshot").is_empty()
    });
    let secret = get("/registry/secrets/default/kept");
    assert!(
        secret.starts_with(b"k8s:enc:"),
        "the Secret is as the apiserver stored it: encrypted"
    );
    member.terminate(Duration::from_secs(10));

    // Deleting asks for confirmation, then removes the object too.
    let unconfirmed = exk8s(&["snapshots", "delete", &name, &id.to_string()]);
    assert_eq!(unconfirmed.status.code(), Some(2));
    assert!(object.exists());
    let deleted = exk8s(&["snapshots", "delete", &name, &id.to_string(), "--yes"]);
    assert!(
        deleted.status.success(),
        "{}",
        String::from_utf8_lossy(&deleted.stderr)
    );
    assert!(!object.exists());
    node.assert_running();
    if let Some(server) = server {
        server.terminate(Duration::from_secs(5));
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
