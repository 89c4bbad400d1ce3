//! Load while faulty: `exk8s-loadgen` against a real `exk8s-api serve` on PostgreSQL whose
//! simulated compute adds latency to every call and whose database link runs through a
//! latency-injecting proxy. No fetch may pass its client timeout, and no bundle may be wrong;
//! with a bootstrap deadline shorter than the slowed issuance, the refusals must be clean 503s
//! with `Retry-After`. The agents' signed day-2 polls succeed through the same slow link.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "test code")]

use std::process::Command;

use exk8s_tests::postgres::fresh_shared_database;
use exk8s_tests::procs::binary;
use serde_json::Value;

/// Runs the load generator; returns its JSON report's rows after founding's (the fetches',
/// then any polls').
fn load(label: &str, extra: &[&str]) -> Vec<Value> {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("report.json");
    let db_url = fresh_shared_database(label);
    let api = binary("exk8s-api");
    let out = Command::new(binary("exk8s-loadgen"))
        .args(["--api-bin", api.to_str().unwrap()])
        .args(["--database-url", &db_url])
        .args(["--clusters", "ecdsa-p256=2", "--nodes", "3"])
        .args(["--fetches", "ecdsa-p256=240", "--concurrency", "24"])
        .args(["--sim-latency-ms", "20"])
        .args(["--json", report.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "exk8s-loadgen failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    eprintln!("{label}:\n{stdout}");
    let summaries: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let founding = &summaries[0];
    assert_eq!(founding["errors"], 0, "founding under latency: {founding}");
    assert_eq!(founding["count"], 2, "{founding}");
    summaries.as_array().unwrap()[1..].to_vec()
}

#[test]
fn slow_compute_and_database_every_fetch_and_poll_succeeds() {
    let rows = load(
        "faulty_load_slow",
        &[
            "--db-latency-ms",
            "2",
            "--timeout-secs",
            "20",
            // The API's own deadline just inside the client's: this test slows the compute
            // API and the database, and on a host also booting clusters (CI runs it beside
            // them) the default 10 s deadline once refused 3 of 240 fetches (clean 503s, p99
            // at the deadline) before any client gave up.
            "--api-arg=--bootstrap-deadline-ms=19000",
            "--polls",
            "120",
        ],
    );
    let [fetches, polls] = &rows[..] else {
        panic!("a fetch and a poll row: {rows:?}");
    };
    assert_eq!(fetches["count"], 240, "{fetches}");
    assert_eq!(fetches["errors"], 0, "{fetches}");
    // Every VM's agent registered its key and asked for its generation, signed.
    assert_eq!(polls["what"], "poll ecdsa-p256 c=24", "{polls}");
    assert_eq!(polls["count"], 120, "{polls}");
    assert_eq!(polls["errors"], 0, "{polls}");
}

#[test]
fn database_slower_than_the_deadline_refuses_cleanly_and_never_hangs() {
    // Each issuance takes about ten database round trips; at 2 × 25 ms each it cannot finish
    // inside a 250 ms deadline, so the API must refuse rather than make agents wait.
    let rows = load(
        "faulty_load_deadline",
        &[
            "--db-latency-ms",
            "25",
            "--timeout-secs",
            "10",
            "--api-arg=--bootstrap-deadline-ms=250",
            "--allow-clean-errors",
        ],
    );
    let fetches = &rows[0];
    assert_eq!(fetches["count"], 240, "{fetches}");
    assert_eq!(fetches["hung"], 0, "{fetches}");
    assert_eq!(fetches["bad"], 0, "{fetches}");
    assert!(
        fetches["clean_errors"].as_u64().unwrap() > 0,
        "the deadline never fired: {fetches}"
    );
}
