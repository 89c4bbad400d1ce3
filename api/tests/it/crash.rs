//! A crash mid-founding: the real `exk8s-api` binary, the compute SIMULATOR as its own process,
//! SIGKILL between VM creation and `founded`, then a restart whose reconciler deletes what the
//! dead process created — on SQLite and PostgreSQL.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use exk8s_tests::procs::{Proc, free_port};

use crate::app::{Backend, both_backends, fresh_database, valid_body};

const BIN: &str = env!("CARGO_BIN_EXE_exk8s-api");

pub fn api(args: &[&str]) -> std::process::Output {
    Command::new(BIN).args(args).output().unwrap()
}

pub fn spawn(args: &[String], log: &Path) -> Proc {
    let log = std::fs::File::create(log).unwrap();
    Proc(
        Command::new(BIN)
            .args(args)
            .env("EXK8S_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Generates a KEK and a signing key with the CLI; returns their paths.
pub fn keys(dir: &Path) -> (String, String) {
    let kek = dir.join("kek").display().to_string();
    let signing = dir.join("signing.key").display().to_string();
    assert!(
        api(&["keys", "generate-kek", "--out", &kek])
            .status
            .success()
    );
    assert!(
        api(&["keys", "generate", "--out", &signing])
            .status
            .success()
    );
    (kek, signing)
}

pub fn token(db_url: &str, org: &str, scope: &str) -> String {
    let out = api(&[
        "tokens",
        "create",
        "--database-url",
        db_url,
        "--org",
        org,
        "--principal",
        "crash-test",
        "--scope",
        scope,
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

async fn killed_mid_founding_then_the_reconciler_cleans_up(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let db_url = fresh_database(backend, dir.path()).await;
    let (kek, signing) = keys(dir.path());
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();

    let sim_port = free_port();
    let sim_url = format!("http://127.0.0.1:{sim_port}");
    let _sim = spawn(
        &[
            "sim".into(),
            "--listen".into(),
            format!("127.0.0.1:{sim_port}"),
        ],
        &dir.path().join("sim.log"),
    );
    wait_until("the simulator", Duration::from_secs(20), || async {
        http.get(format!("{sim_url}/v1/vms")).send().await.is_ok()
    })
    .await;
    // VMs never get an address: founding waits after creating all of them.
    let faults = http
        .put(format!("{sim_url}/sim/faults"))
        .json(&json!({"address_after_polls": 1_000_000}))
        .send()
        .await
        .unwrap();
    assert_eq!(faults.status(), 204);

    let api_port = free_port();
    let api_url = format!("http://127.0.0.1:{api_port}");
    let serve_args: Vec<String> = [
        "serve",
        "--listen",
        &format!("127.0.0.1:{api_port}"),
        "--database-url",
        &db_url,
        "--kek-file",
        &kek,
        "--signing-key",
        &signing,
        "--compute-url",
        &sim_url,
        "--dns",
        "none",
        "--public-url",
        &api_url,
        "--address-timeout-secs",
        "600",
        "--provisioning-deadline-secs",
        "2",
        "--reconcile-interval-secs",
        "1",
        "--drain-secs",
        "0",
    ]
    .map(str::to_owned)
    .to_vec();
    let mut first = spawn(&serve_args, &dir.path().join("api-1.log"));
    wait_until("the API", Duration::from_secs(20), || async {
        http.get(format!("{api_url}/healthz")).send().await.is_ok()
    })
    .await;
    let operator = token(&db_url, "7", "operator");

    let founding = {
        let request = http
            .post(format!("{api_url}/clusters"))
            .bearer_auth(&operator)
            .json(&valid_body(3))
            .timeout(Duration::from_secs(60));
        tokio::spawn(async move { request.send().await })
    };
    let vms = || async {
        let list: Value = http
            .get(format!("{sim_url}/v1/vms"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        list.as_array().unwrap().len()
    };
    wait_until("three VMs", Duration::from_secs(30), || async {
        vms().await == 3
    })
    .await;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    assert!(
        founding.await.unwrap().is_err(),
        "the killed server still answered"
    );
    assert_eq!(vms().await, 3, "the VMs outlive the dead API");

    let _second = spawn(&serve_args, &dir.path().join("api-2.log"));
    wait_until(
        "the reconciler to delete every VM and group",
        Duration::from_secs(30),
        || async {
            let groups: Value = http
                .get(format!("{sim_url}/v1/security-groups"))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            vms().await == 0 && groups.as_array().unwrap().is_empty()
        },
    )
    .await;
    let clusters: Value = http
        .get(format!("{api_url}/clusters"))
        .bearer_auth(&operator)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(clusters[0]["phase"], "failed", "{clusters}");
    assert_eq!(clusters[0]["error_reason"], "abandoned", "{clusters}");
}

both_backends!(killed_mid_founding_then_the_reconciler_cleans_up);
