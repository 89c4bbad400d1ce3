//! `sync` against a fake IMDS and API that checks every day-2 request's signature with the key
//! the first fetch registered: a newer generation applied with only changed files written and
//! the watched units restarted; waiting while the rollout holds the node; refusals; a failed
//! health check putting every previous file back byte for byte; and a crash at every file
//! operation of an update, after which the next sync converges and still restarts what changed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use exk8s_common::contract::BundleKind;
use exk8s_common::names::FileMode;
use exk8s_common::node_auth::{
    NODE_KEY_HEADER, NodePublicKey, SIGNATURE_HEADER, TIMESTAMP_HEADER, request_message,
};
use exk8s_common::payload::{BundleFile, BundlePayload, PlanStep};
use serde_json::Value;

use crate::helpers::{VM_ID, agent, code, files, payload, sign, stderr, tree};
use crate::run::{ACCESS_TOKEN, bundle_for, config, imds_or};
use crate::server::{Reply, Request, Server};

/// What the fake API answers to `GET /nodes/101/bundle`.
#[derive(Clone, Copy)]
enum Answer {
    Update,
    Wait,
    BootstrapKind,
}

#[derive(Default)]
struct Seen {
    key: Option<NodePublicKey>,
    /// Day-2 requests whose signature did not verify.
    bad_signatures: usize,
    reports: Vec<Value>,
    /// Outcome reports (`sync`) still to refuse with 429 before accepting one.
    refuse_outcomes: usize,
}

struct Fake {
    server: Server,
    seen: Arc<Mutex<Seen>>,
}

const MANIFEST: &str = "/etc/kubernetes/manifests/kube-apiserver.yaml";
const MIRROR_POD: &str = "kube-apiserver-cp-1.cluster-42.internal";

fn manifest(version: &str) -> BundleFile {
    BundleFile::new(
        MANIFEST.parse().unwrap(),
        FileMode::SECRET,
        format!("kind: Pod\nmetadata:\n  annotations:\n    exk8s.io/inputs-sha256: {version}\n"),
    )
}

/// The bootstrap bundle the fake serves: the helpers' files plus a static pod manifest.
fn with_static_pod(p: &mut BundlePayload) {
    p.files.push(manifest("a"));
    p.plan.push(PlanStep::InstallStaticPod {
        manifest: MANIFEST.parse().unwrap(),
    });
}

fn update_files() -> Vec<BundleFile> {
    let mut list = files("a");
    list.push(manifest("b"));
    for file in &mut list {
        if file.path.as_str().starts_with("/etc/exk8s/pki/etcd-server") {
            *file = BundleFile::new(
                file.path.clone(),
                file.mode,
                String::from_utf8_lossy(file.content.as_bytes()).replace(" a", " b"),
            );
        }
    }
    list.push(BundleFile::new(
        "/etc/exk8s/pki/etcd-peer.pem".parse().unwrap(),
        FileMode::PUBLIC,
        "peer b\n",
    ));
    list
}

fn update_payload(nonce: &str) -> BundlePayload {
    let mut p = payload(VM_ID, 4, update_files());
    p.identity.kind = BundleKind::Update;
    p.identity.generation = 2;
    p.freshness.nonce = nonce.parse().unwrap();
    let path = |s: &str| s.parse().unwrap();
    p.plan.extend([
        PlanStep::WaitEtcdHealthy {
            endpoint: "https://127.0.0.1:2379".parse().unwrap(),
            ca_file: path("/etc/exk8s/pki/etcd-server.pem"),
            cert_file: path("/etc/exk8s/pki/etcd-server.pem"),
            key_file: path("/etc/exk8s/pki/etcd-server-key.pem"),
            timeout_secs: 60,
        },
        PlanStep::InstallStaticPod {
            manifest: path(MANIFEST),
        },
        PlanStep::WaitStaticPod {
            kubeconfig: path("/etc/exk8s/kubeconfig/admin.kubeconfig"),
            manifest: path(MANIFEST),
            mirror_pod: MIRROR_POD.parse().unwrap(),
            inputs_sha256: exk8s_common::names::Sha256Digest::of(b"b"),
            timeout_secs: 60,
        },
        PlanStep::EnableStart {
            unit: "kubelet.service".parse().unwrap(),
            watch: vec![path("/var/lib/kubelet/config.yaml")],
        },
    ]);
    p
}

fn signed_ok(seen: &Mutex<Seen>, r: &Request) -> bool {
    let mut seen = seen.lock().unwrap();
    let ok = (|| {
        let key = seen.key?;
        let message = request_message(
            &r.method,
            &r.path,
            r.header(TIMESTAMP_HEADER)?.parse().ok()?,
            r.header("X-Exk8s-Nonce")?,
            &r.body,
        );
        key.verify(&message, r.header(SIGNATURE_HEADER)?).ok()
    })()
    .is_some();
    if !ok {
        seen.bad_signatures += 1;
    }
    ok
}

/// The fake API: bootstrap at generation 1 (serial 3), generation 2 wanted (serial 4).
fn fake(answer: Answer) -> Fake {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let state = Arc::clone(&seen);
    let server = Server::start(imds_or(move |r| {
        let day2 = r.path.starts_with("/nodes/");
        if day2 && !signed_ok(&state, r) {
            return Reply::status(401);
        }
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/bootstrap/101") => {
                let key = r
                    .header(NODE_KEY_HEADER)
                    .map(|k| NodePublicKey::parse(k).unwrap());
                state.lock().unwrap().key = key;
                bundle_for(r, with_static_pod)
            }
            ("GET", "/nodes/101/generation") => {
                Reply::ok(r#"{"desired_generation":2,"applied_generation":1,"up_to_date":false}"#)
            }
            ("GET", "/nodes/101/bundle") => {
                let nonce = r.header("X-Exk8s-Nonce").unwrap();
                match answer {
                    Answer::Update => Reply::ok(sign(&update_payload(nonce))),
                    Answer::BootstrapKind => {
                        let mut p = update_payload(nonce);
                        p.identity.kind = BundleKind::Bootstrap;
                        Reply::ok(sign(&p))
                    }
                    Answer::Wait => Reply::Full {
                        status: 409,
                        headers: vec![("Retry-After".into(), "30".into())],
                        body: br#"{"error":"wait","message":"another control-plane node is applying its update"}"#.to_vec(),
                    },
                }
            }
            ("POST", "/nodes/101/status") => {
                let report: Value = serde_json::from_slice(&r.body).unwrap();
                let mut seen = state.lock().unwrap();
                if report["phase"] == "sync" && seen.refuse_outcomes > 0 {
                    seen.refuse_outcomes -= 1;
                    return Reply::Full {
                        status: 429,
                        headers: vec![("Retry-After".into(), "1".into())],
                        body: b"rate limited".to_vec(),
                    };
                }
                seen.reports.push(report);
                Reply::status(204)
            }
            ("POST", "/bootstrap/101/status") => Reply::status(204),
            _ => Reply::status(404),
        }
    }));
    Fake { server, seen }
}

fn agent_cmd(scratch: &Path, fake: &Fake, command: &str, root: &Path) -> std::process::Command {
    let cfg = config(scratch, &fake.server, "request_timeout_secs = 2\n");
    let mut cmd = agent(scratch);
    cmd.env("EXK8S_CONFIG", cfg)
        .arg(command)
        .arg("--root")
        .arg(root);
    cmd
}

/// A root bootstrapped by `run` at generation 1.
fn booted(scratch: &Path, fake: &Fake, name: &str) -> PathBuf {
    let root = scratch.join(name);
    let out = agent_cmd(scratch, fake, "run", &root).output().unwrap();
    assert_eq!(code(&out), 0, "run: {}", stderr(&out));
    root
}

fn actions(root: &Path) -> String {
    std::fs::read_to_string(root.join("var/lib/exk8s/recorded-actions.log")).unwrap_or_default()
}

fn state(root: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(root.join("var/lib/exk8s/state.json")).unwrap()).unwrap()
}

/// The node's files, without the agent's own state directory.
fn node_files(root: &Path) -> crate::helpers::Tree {
    tree(root)
        .into_iter()
        .filter(|(p, ..)| !p.starts_with("var/lib/exk8s/"))
        .collect()
}

fn inode(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).unwrap().ino()
}

fn phases(fake: &Fake) -> Vec<String> {
    fake.seen
        .lock()
        .unwrap()
        .reports
        .iter()
        .map(|r| {
            format!(
                "{}:{}",
                r["phase"].as_str().unwrap(),
                r["state"].as_str().unwrap()
            )
        })
        .collect()
}

#[test]
fn a_newer_generation_is_applied_with_only_changed_files_and_their_units_restarted() {
    let scratch = tempfile::tempdir().unwrap();
    let fake = fake(Answer::Update);
    let root = booted(scratch.path(), &fake, "root");
    let unchanged = root.join("etc/exk8s/config/cluster.env");
    let changed = root.join("etc/exk8s/pki/etcd-server.pem");
    let (unchanged_inode, changed_inode) = (inode(&unchanged), inode(&changed));
    let before = actions(&root);

    let out = agent_cmd(scratch.path(), &fake, "sync", &root)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));

    for file in update_files() {
        let on_disk = root.join(file.path.relative());
        assert_eq!(std::fs::read(&on_disk).unwrap(), file.content.as_bytes());
    }
    assert_eq!(
        inode(&unchanged),
        unchanged_inode,
        "an unchanged file was rewritten"
    );
    assert_ne!(
        inode(&changed),
        changed_inode,
        "a changed file was not replaced"
    );
    let new_actions = &actions(&root)[before.len()..];
    assert_eq!(
        new_actions
            .lines()
            .filter(|l| l.contains("restart") || l.contains("wait for"))
            .collect::<Vec<_>>(),
        [
            "systemctl restart --no-block etcd.service",
            "wait for etcd health at https://127.0.0.1:2379 (up to 60s)",
            &format!(
                "wait for static pod {MIRROR_POD} to run inputs {} (up to 60s)",
                &exk8s_common::names::Sha256Digest::of(b"b").to_hex()[..12]
            ),
        ],
        "etcd and the apiserver's pod read changed files, in that order: {new_actions}"
    );
    // The manifest landed only once etcd was healthy again.
    let log = stderr(&out);
    let etcd_healthy = log.find("wait for etcd health").unwrap();
    let installed = log
        .find(&format!("installing static pod manifest {MANIFEST}"))
        .unwrap();
    assert!(etcd_healthy < installed, "{log}");
    let saved = state(&root);
    assert_eq!(saved["applied_serial"], 4);
    assert_eq!(saved["applied_generation"], 2);
    assert_eq!(saved["pending"], serde_json::json!([]));

    let seen = fake.seen.lock().unwrap();
    assert_eq!(seen.bad_signatures, 0);
    let last = seen.reports.last().unwrap();
    assert_eq!(
        (&last["phase"], &last["state"], &last["generation"]),
        (&"sync".into(), &"succeeded".into(), &2.into())
    );
    drop(seen);
    assert!(phases(&fake).starts_with(&["sync:started".to_owned(), "files:started".to_owned()]));
    // The bootstrap token is not a day-2 credential.
    for request in fake.server.requests.lock().unwrap().iter() {
        if request.path.starts_with("/nodes/") {
            assert_eq!(request.header("Authorization"), None);
            assert!(!String::from_utf8_lossy(&request.body).contains(ACCESS_TOKEN));
        }
    }

    // Applied and current: the next sync asks, and fetches nothing.
    let fetches = fake.server.count("/nodes/101/bundle");
    let fake_current = fake_at(&fake, 2, 2);
    let out = agent_cmd(scratch.path(), &fake_current, "sync", &root)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("nothing to do"), "{}", stderr(&out));
    assert_eq!(fake.server.count("/nodes/101/bundle"), fetches);
    assert_eq!(fake_current.server.count("/nodes/101/bundle"), 0);
    assert!(phases(&fake_current).is_empty(), "nothing to report");

    // The API missed the success report: the next sync says it again, and fetches nothing.
    let missed = fake_at(&fake, 2, 1);
    let out = agent_cmd(scratch.path(), &missed, "sync", &root)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(phases(&missed), ["sync:succeeded"]);
    assert_eq!(missed.seen.lock().unwrap().reports[0]["generation"], 2);
    assert_eq!(missed.server.count("/nodes/101/bundle"), 0);
}

/// A fake wanting `generation` and believing the node applied `api_applied`, for a node whose
/// key `from` registered; it records reports.
fn fake_at(from: &Fake, generation: u64, api_applied: u64) -> Fake {
    let key = from.seen.lock().unwrap().key;
    let seen = Arc::new(Mutex::new(Seen {
        key,
        ..Seen::default()
    }));
    let state = Arc::clone(&seen);
    let server = Server::start(imds_or(move |r| {
        if !signed_ok(&state, r) {
            return Reply::status(401);
        }
        match r.path.as_str() {
            "/nodes/101/generation" => Reply::ok(format!(
                r#"{{"desired_generation":{generation},"applied_generation":{api_applied},"up_to_date":{}}}"#,
                generation == api_applied
            )),
            "/nodes/101/status" => {
                let report = serde_json::from_slice(&r.body).unwrap();
                state.lock().unwrap().reports.push(report);
                Reply::status(204)
            }
            _ => Reply::status(404),
        }
    }));
    Fake { server, seen }
}

#[test]
fn a_held_update_waits_and_a_wrong_kind_is_refused_and_reported() {
    let scratch = tempfile::tempdir().unwrap();
    let held = fake(Answer::Wait);
    let root = booted(scratch.path(), &held, "held");
    let files_before = node_files(&root);
    let out = agent_cmd(scratch.path(), &held, "sync", &root)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("another control-plane node is applying its update"),
        "{}",
        stderr(&out)
    );
    assert_eq!(node_files(&root), files_before);
    assert_eq!(
        held.server.count("/nodes/101/bundle"),
        1,
        "a 409 was retried at once"
    );

    let wrong = fake(Answer::BootstrapKind);
    let root = booted(scratch.path(), &wrong, "wrong");
    let files_before = node_files(&root);
    let out = agent_cmd(scratch.path(), &wrong, "sync", &root)
        .output()
        .unwrap();
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("kind"), "{}", stderr(&out));
    assert_eq!(node_files(&root), files_before);
    assert_eq!(phases(&wrong), ["sync:failed"]);

    // A node that never finished its first boot has nothing to sync and asks nobody.
    let fresh = scratch.path().join("fresh");
    let out = agent_cmd(scratch.path(), &wrong, "sync", &fresh)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not finished bootstrapping"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn a_failed_health_check_puts_every_previous_file_back_and_reports_why() {
    let scratch = tempfile::tempdir().unwrap();
    let fake = fake(Answer::Update);
    let root = booted(scratch.path(), &fake, "root");
    let files_before = node_files(&root);
    let out = agent_cmd(scratch.path(), &fake, "sync", &root)
        .env("EXK8S_AGENT_TEST_FAIL_ACTION", "wait for static pod")
        .output()
        .unwrap();
    assert_eq!(code(&out), 6, "{}", stderr(&out));
    // Byte for byte, modes included; the file the update created is gone.
    assert_eq!(node_files(&root), files_before);
    let saved = state(&root);
    assert_eq!(saved["applied_serial"], 3);
    assert_eq!(saved["applied_generation"], 1);
    // The units were restarted onto the restored files.
    let log = actions(&root);
    assert_eq!(
        log.matches("systemctl restart --no-block etcd.service")
            .count(),
        2,
        "{log}"
    );
    let last = fake.seen.lock().unwrap().reports.last().unwrap().clone();
    assert_eq!(
        (&last["phase"], &last["state"]),
        (&"sync".into(), &"failed".into())
    );
    let message = last["message"].as_str().unwrap();
    assert!(message.contains("failed on purpose"), "{message}");
    assert!(
        message.contains("previous files were put back"),
        "{message}"
    );
    assert_eq!(last["generation"], 2);

    // The next sync tries again and succeeds.
    let out = agent_cmd(scratch.path(), &fake, "sync", &root)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(state(&root)["applied_generation"], 2);
}

#[test]
fn a_crash_at_any_file_operation_of_a_sync_leaves_old_or_new_and_the_next_sync_converges() {
    let scratch = tempfile::tempdir().unwrap();
    let fake = fake(Answer::Update);
    let update = update_payload("agent-test-nonce-0000000");
    let mut crashed = 0;
    for ops in 1.. {
        let root = booted(scratch.path(), &fake, &format!("crash-{ops}"));
        let old: Vec<(String, Option<Vec<u8>>)> = update
            .files
            .iter()
            .map(|f| {
                (
                    f.path.to_string(),
                    std::fs::read(root.join(f.path.relative())).ok(),
                )
            })
            .collect();
        let restarts_before = actions(&root).matches("restart --no-block etcd").count();
        let out = agent_cmd(scratch.path(), &fake, "sync", &root)
            .env("EXK8S_AGENT_TEST_ABORT_AFTER_FILE_OPS", ops.to_string())
            .output()
            .unwrap();
        let finished = out.status.success();
        for (file, (_, before)) in update.files.iter().zip(&old) {
            let now = std::fs::read(root.join(file.path.relative())).ok();
            assert!(
                now.as_deref() == Some(file.content.as_bytes()) || now == *before,
                "after {ops} ops {} is neither old nor new",
                file.path
            );
        }
        if !finished {
            crashed += 1;
            let out = agent_cmd(scratch.path(), &fake, "sync", &root)
                .output()
                .unwrap();
            assert_eq!(
                code(&out),
                0,
                "sync after a crash at op {ops}: {}",
                stderr(&out)
            );
        }
        for file in &update.files {
            assert_eq!(
                std::fs::read(root.join(file.path.relative())).unwrap(),
                file.content.as_bytes(),
                "after {ops} ops"
            );
        }
        // The restart the crashed sync owed happened, even if its files were already new (at
        // least once: a crash after the restart repeats it).
        let restarts = actions(&root).matches("restart --no-block etcd").count();
        assert!(
            restarts > restarts_before,
            "after {ops} ops: {}",
            actions(&root)
        );
        assert_eq!(state(&root)["applied_generation"], 2);
        let leftovers: Vec<_> = tree(&root)
            .into_iter()
            .filter(|(p, ..)| p.contains(".exk8s-"))
            .collect();
        assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
        if finished {
            break;
        }
    }
    // 4 changed files (two certificates, a new one, and the manifest installed at its step):
    // two operations each to stage, one each to rename.
    assert_eq!(
        crashed, 12,
        "expected a crash at each of the 12 file operations"
    );
}

#[test]
fn a_rate_limited_outcome_report_is_retried_until_it_lands() {
    let scratch = tempfile::tempdir().unwrap();
    let fake = fake(Answer::Update);
    let root = booted(scratch.path(), &fake, "root");
    // `sync: started` is refused (progress: dropped), then `sync: succeeded` once (retried).
    fake.seen.lock().unwrap().refuse_outcomes = 2;
    let out = agent_cmd(scratch.path(), &fake, "sync", &root)
        .output()
        .unwrap();
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let seen = phases(&fake);
    assert_eq!(
        seen.last().map(String::as_str),
        Some("sync:succeeded"),
        "{seen:?}"
    );
    assert!(!seen.contains(&"sync:started".to_owned()), "{seen:?}");
    assert!(stderr(&out).contains("retrying"), "{}", stderr(&out));
}
