//! Two replicas of the API on one PostgreSQL database, one SIGKILLed while both serve
//! bundles: the survivor answers every request, and no node's serial is issued twice.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use exk8s_tests::procs::free_port;

use crate::app::{Backend, fresh_database};
use crate::crash::{Stack, imds_token, spawn, stack, token, wait_until};

/// How many bundles each replica must have served before A is killed, and B after: the kill
/// lands in the middle of a run however slowly a loaded machine serves.
const SERVED: usize = 3;

/// How long a loaded machine is given to serve them.
const PATIENCE: Duration = Duration::from_secs(120);

impl Stack {
    /// Arguments for another replica of the same API on its own port; returns them and its URL.
    pub fn replica_args(&self) -> (Vec<String>, String) {
        let port = free_port();
        let url = format!("http://127.0.0.1:{port}");
        let mut args = self.serve_args.clone();
        for (i, arg) in self.serve_args.iter().enumerate() {
            match arg.as_str() {
                "--listen" => args[i + 1] = format!("127.0.0.1:{port}"),
                "--public-url" => args[i + 1] = url.clone(),
                _ => {}
            }
        }
        (args, url)
    }
}

/// One fetch's outcome, as a replica answered it.
#[derive(Debug)]
#[allow(
    dead_code,
    reason = "the status is read through Debug, in failure messages"
)]
enum Outcome {
    Bundle { vm: i64, serial: u64 },
    Status(u16),
    Unreachable,
}

/// Bundles served so far, by replica.
#[derive(Default)]
struct Served {
    a: AtomicUsize,
    b: AtomicUsize,
}

/// Two replicas on one PostgreSQL database serve bundles side by side; one is SIGKILLed
/// mid-run (once each has served a few). The survivor answers every request, before and after;
/// every bundle verifies and is bound to its VM and nonce; no node's serial is issued twice (in
/// the bundles nor the audit).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_one_killed_mid_run_the_other_serves_and_no_serial_repeats() {
    let dir = tempfile::tempdir().unwrap();
    let db_url = fresh_database(Backend::Postgres, dir.path()).await;
    let mut stack = stack(dir.path(), &db_url, 600).await;
    for flag in ["--bootstrap-rate-per-vm", "--bootstrap-rate-per-source"] {
        stack
            .serve_args
            .extend([flag.to_owned(), "100000000".to_owned()]);
    }
    let mut doomed = stack.start_api(&dir.path().join("api-a.log")).await;
    let (b_args, b_url) = stack.replica_args();
    let _survivor = spawn(&b_args, &dir.path().join("api-b.log"));
    wait_until("replica B", Duration::from_secs(20), || async {
        stack
            .http
            .get(format!("{b_url}/healthz"))
            .send()
            .await
            .is_ok()
    })
    .await;

    let operator = token(&db_url, "7", "operator");
    let bootstrap = token(&db_url, "7", "bootstrap");
    let founded: Value = stack
        .found(&stack.api_url, &operator, 3)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let db = exk8s_api::db::Db::connect(&db_url).unwrap();
    let mut vms = Vec::new();
    for vm in founded["control_plane_vm_ids"].as_array().unwrap() {
        let vm = vm.as_i64().unwrap();
        vms.push((vm, imds_token(&db, vm).await));
    }
    let keys_text = stack
        .http
        .get(format!("{b_url}/bootstrap/keys"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut ring = exk8s_common::Keyring::new();
    ring.add_pub_text(&keys_text, "/bootstrap/keys").unwrap();

    let shared = Arc::new((vms, ring, bootstrap, stack.api_url.clone(), b_url.clone()));
    let running = Arc::new(AtomicBool::new(true));
    let served = Arc::new(Served::default());
    let mut workers = Vec::new();
    for worker in 0..6usize {
        let (shared, running, served, http) = (
            Arc::clone(&shared),
            Arc::clone(&running),
            Arc::clone(&served),
            stack.http.clone(),
        );
        workers.push(tokio::spawn(async move {
            let (vms, ring, bearer, a_url, b_url) = &*shared;
            let mut outcomes = Vec::new();
            let mut n = 0usize;
            while running.load(Ordering::SeqCst) {
                n += 1;
                let (vm, imds) = &vms[(worker + n) % vms.len()];
                let replica = if n % 2 == 0 { 'a' } else { 'b' };
                let base = if replica == 'a' { a_url } else { b_url };
                let nonce = format!("replica-{worker}-{n:08}");
                let sent = http
                    .get(format!("{base}/bootstrap/control-plane/{vm}"))
                    .header("X-exc-imds-token", imds)
                    .header("X-Exk8s-Nonce", &nonce)
                    .bearer_auth(bearer)
                    .send()
                    .await;
                let outcome = match sent {
                    Err(_) => Outcome::Unreachable,
                    Ok(r) if r.status() != 200 => Outcome::Status(r.status().as_u16()),
                    Ok(r) => {
                        let bundle = exk8s_common::verify(&r.bytes().await.unwrap(), ring)
                            .expect("every bundle verifies");
                        let p = bundle.payload();
                        assert_eq!(p.identity.vm_id, *vm as u64, "a bundle for another VM");
                        assert_eq!(
                            p.freshness.nonce.as_str(),
                            nonce,
                            "another request's bundle"
                        );
                        Outcome::Bundle {
                            vm: *vm,
                            serial: p.freshness.serial,
                        }
                    }
                };
                let at = Instant::now();
                if matches!(outcome, Outcome::Bundle { .. }) {
                    let count = if replica == 'a' { &served.a } else { &served.b };
                    count.fetch_add(1, Ordering::SeqCst);
                }
                outcomes.push((replica, at, outcome));
            }
            outcomes
        }));
    }
    // Both serving, then A dies; then B serves on alone.
    wait_until("both replicas serving", PATIENCE, || async {
        served.a.load(Ordering::SeqCst) >= SERVED && served.b.load(Ordering::SeqCst) >= SERVED
    })
    .await;
    doomed.0.kill().unwrap();
    doomed.0.wait().unwrap();
    let killed_at = Instant::now();
    let b_at_kill = served.b.load(Ordering::SeqCst);
    wait_until("replica B serving after A died", PATIENCE, || async {
        served.b.load(Ordering::SeqCst) >= b_at_kill + SERVED
    })
    .await;
    running.store(false, Ordering::SeqCst);

    let mut outcomes = Vec::new();
    for worker in workers {
        outcomes.extend(worker.await.unwrap());
    }
    let mut serials = std::collections::BTreeSet::new();
    let (mut from_a, mut from_b_after) = (0, 0);
    for (replica, at, outcome) in &outcomes {
        match (replica, outcome) {
            (_, Outcome::Bundle { vm, serial }) => {
                assert!(
                    serials.insert((*vm, *serial)),
                    "serial {serial} issued twice for VM {vm}"
                );
                if *replica == 'a' {
                    from_a += 1;
                } else if *at > killed_at {
                    from_b_after += 1;
                }
            }
            ('b', other) => panic!("the surviving replica failed a request: {other:?}"),
            ('a', Outcome::Unreachable) => {}
            ('a', other) => panic!("replica A answered {other:?} before it died"),
            _ => unreachable!(),
        }
    }
    assert!(
        from_a >= SERVED,
        "replica A served {from_a} before it was killed"
    );
    assert!(
        from_b_after > 0,
        "replica B served nothing after A died ({from_b_after})"
    );

    use sqlx::Row as _;
    let repeated: i64 = sqlx::query(
        "SELECT COUNT(*) AS n FROM (SELECT vm_id, serial FROM bundle_issuances \
         WHERE outcome = 'issued' GROUP BY vm_id, serial HAVING COUNT(*) > 1) AS twice",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap()
    .get("n");
    assert_eq!(repeated, 0, "the audit shows a serial issued twice");
    let survivor_founds = stack.found(&b_url, &operator, 1).send().await.unwrap();
    assert_eq!(survivor_founds.status(), 201);
}
