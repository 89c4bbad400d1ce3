//! A crash mid-founding: the real `exk8s-api` binary, the compute SIMULATOR as its own process,
//! SIGKILL between VM creation and `founded` (after the 202, founding in the background), then
//! a restart whose reconciler deletes what the dead process created — on SQLite and PostgreSQL.

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

pub async fn wait_until<F, Fut>(what: &str, timeout: Duration, check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_until_every(what, timeout, Duration::from_millis(100), check).await;
}

/// [`wait_until`], checking every `every`: for a moment a test must not miss.
pub async fn wait_until_every<F, Fut>(what: &str, timeout: Duration, every: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(every).await;
    }
}

/// A fresh instance-metadata token of `vm` (org 7), written where the metadata service writes
/// them (`imds_tokens`), valid for ten minutes.
pub async fn imds_token(db: &exk8s_api::db::Db, vm: i64) -> String {
    let imds = exk8s_api::tokens::generate("exk8s_imds")
        .unwrap()
        .to_string();
    let now = exk8s_api::db::now();
    exk8s_api::db::tokens::insert_imds_token(
        &db.pool,
        &exk8s_api::tokens::hash(&imds),
        vm,
        7,
        now,
        now + 600,
    )
    .await
    .unwrap();
    imds
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

/// The compute SIMULATOR as its own process (it outlives killed APIs), and the arguments of an
/// API serving `db_url` against it.
pub struct Stack {
    pub _sim: Proc,
    pub sim_url: String,
    pub api_url: String,
    pub serve_args: Vec<String>,
    pub http: reqwest::Client,
}

pub async fn stack(dir: &Path, db_url: &str, deadline_secs: u64) -> Stack {
    let (kek, signing) = keys(dir);
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let sim_port = free_port();
    let sim_url = format!("http://127.0.0.1:{sim_port}");
    let sim = spawn(
        &[
            "sim".into(),
            "--listen".into(),
            format!("127.0.0.1:{sim_port}"),
        ],
        &dir.join("sim.log"),
    );
    wait_until("the simulator", Duration::from_secs(20), || async {
        http.get(format!("{sim_url}/v1/vms")).send().await.is_ok()
    })
    .await;
    let api_port = free_port();
    let api_url = format!("http://127.0.0.1:{api_port}");
    let serve_args: Vec<String> = [
        "serve",
        "--listen",
        &format!("127.0.0.1:{api_port}"),
        "--database-url",
        db_url,
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
        &deadline_secs.to_string(),
        "--reconcile-interval-secs",
        "1",
        "--drain-secs",
        "0",
    ]
    .map(str::to_owned)
    .to_vec();
    Stack {
        _sim: sim,
        sim_url,
        api_url,
        serve_args,
        http,
    }
}

impl Stack {
    pub async fn set_faults(&self, faults: Value) {
        let response = self
            .http
            .put(format!("{}/sim/faults", self.sim_url))
            .json(&faults)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 204);
    }

    pub async fn sim_list(&self, what: &str) -> Vec<Value> {
        self.http
            .get(format!("{}/v1/{what}", self.sim_url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    /// Starts an API and waits until it answers.
    pub async fn start_api(&self, log: &Path) -> Proc {
        let api = spawn(&self.serve_args, log);
        wait_until("the API", Duration::from_secs(20), || async {
            self.http
                .get(format!("{}/healthz", self.api_url))
                .send()
                .await
                .is_ok()
        })
        .await;
        api
    }

    /// `POST /clusters` for a `count`-node cluster to the API at `base`, not yet sent.
    pub fn found(&self, base: &str, operator: &str, count: i64) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{base}/clusters"))
            .header(crate::app::WAIT.0, crate::app::WAIT.1)
            .bearer_auth(operator)
            .json(&valid_body(count))
            .timeout(Duration::from_secs(60))
    }

    pub async fn clusters(&self, operator: &str) -> Vec<Value> {
        self.http
            .get(format!("{}/clusters", self.api_url))
            .bearer_auth(operator)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

async fn killed_mid_founding_then_the_reconciler_cleans_up(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let db_url = fresh_database(backend, dir.path()).await;
    let stack = stack(dir.path(), &db_url, 2).await;
    // VMs never get an address: founding waits after creating all of them.
    stack
        .set_faults(json!({"address_after_polls": 1_000_000}))
        .await;
    let mut first = stack.start_api(&dir.path().join("api-1.log")).await;
    let operator = token(&db_url, "7", "operator");

    // Founding answers 202 at once and goes on in the background; the API dies after it.
    let accepted = stack
        .http
        .post(format!("{}/clusters", stack.api_url))
        .bearer_auth(&operator)
        .json(&valid_body(3))
        .send()
        .await
        .unwrap();
    assert_eq!(accepted.status(), 202);
    let accepted: Value = accepted.json().await.unwrap();
    assert_eq!(accepted["phase"], "provisioning", "{accepted}");
    wait_until("three VMs", Duration::from_secs(30), || async {
        stack.sim_list("vms").await.len() == 3
    })
    .await;
    first.0.kill().unwrap();
    first.0.wait().unwrap();
    assert_eq!(
        stack.sim_list("vms").await.len(),
        3,
        "the VMs outlive the dead API"
    );

    let _second = stack.start_api(&dir.path().join("api-2.log")).await;
    // The reconciler deletes the VMs and the group, then records the cluster failed: wait for
    // the last of them (reading just after the deletions raced the record, a flake CI showed).
    wait_until(
        "the reconciler to delete every VM and group and give the cluster up",
        Duration::from_secs(30),
        || async {
            stack.sim_list("vms").await.is_empty()
                && stack.sim_list("security-groups").await.is_empty()
                && stack.clusters(&operator).await[0]["phase"] != "compensating"
        },
    )
    .await;
    let clusters = stack.clusters(&operator).await;
    assert_eq!(clusters[0]["phase"], "failed", "{clusters:?}");
    assert_eq!(clusters[0]["error_reason"], "abandoned", "{clusters:?}");
}

/// The cluster id in a simulator resource's client token (`cluster-{id}-…`).
fn owner(resource: &Value) -> i64 {
    resource["client_token"]
        .as_str()
        .and_then(|t| t.strip_prefix("cluster-"))
        .and_then(|t| t.split('-').next())
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("a simulator resource exk8s did not create: {resource}"))
}

/// A small deterministic generator (xorshift64*), seeded and printed so a failing run repeats.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n
    }
}

const KILLS: usize = 20;

/// SIGKILL at a random moment of founding, twenty times over one database and one simulator:
/// before the request arrives, during PKI, between journal and compute call, while waiting for
/// addresses, after `founded`, and during the previous instance's reconciliation. A last API
/// then reconciles; the simulator must hold nothing that belongs to no founded cluster, and
/// every founded cluster must still have all its VMs.
async fn killed_at_random_points_leaves_no_orphan(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let db_url = fresh_database(backend, dir.path()).await;
    let stack = stack(dir.path(), &db_url, 2).await;
    // Each compute call takes 10 ms and a VM shows its address on the third poll: a founding
    // lasts about half a second, spread over every step.
    stack
        .set_faults(json!({"latency_ms": 10, "address_after_polls": 2}))
        .await;
    let operator = token(&db_url, "7", "operator");
    let seed = std::env::var("EXK8S_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill points from seed {seed} (EXK8S_CRASH_SEED={seed} repeats them)");
    let mut rng = Rng(seed);

    // One founding left to finish measures how long founding lasts here; the kills then fall
    // uniformly over that span and a fifth beyond it.
    let span = {
        let _api = stack.start_api(&dir.path().join("api-calibrate.log")).await;
        let started = Instant::now();
        let response = stack
            .found(&stack.api_url, &operator, 3)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 201);
        started.elapsed().as_millis() as u64 * 6 / 5
    };
    eprintln!("kills fall within {span} ms of the request");

    for round in 0..KILLS {
        let mut api = stack
            .start_api(&dir.path().join(format!("api-{round}.log")))
            .await;
        let request = stack.found(&stack.api_url, &operator, 3);
        let founding = tokio::spawn(async move { request.send().await });
        tokio::time::sleep(Duration::from_millis(rng.below(span))).await;
        api.0.kill().unwrap();
        api.0.wait().unwrap();
        if let Ok(Ok(response)) = founding.await {
            assert_eq!(response.status(), 201, "round {round}: founding answered");
        }
    }

    let _last = stack.start_api(&dir.path().join("api-last.log")).await;
    wait_until(
        "the reconciler to settle every cluster",
        Duration::from_secs(60),
        || async {
            stack
                .clusters(&operator)
                .await
                .iter()
                .all(|c| c["phase"] == "founded" || c["phase"] == "failed")
        },
    )
    .await;
    let clusters = stack.clusters(&operator).await;
    let founded: std::collections::BTreeSet<i64> = clusters
        .iter()
        .filter(|c| c["phase"] == "founded")
        .map(|c| c["id"].as_i64().unwrap())
        .collect();
    let vms = stack.sim_list("vms").await;
    let groups = stack.sim_list("security-groups").await;
    for vm in &vms {
        assert!(
            founded.contains(&owner(vm)),
            "seed {seed}: VM {vm} belongs to no founded cluster; clusters: {clusters:?}"
        );
    }
    for group in &groups {
        assert!(
            founded.contains(&owner(group)),
            "seed {seed}: group {group} belongs to no founded cluster; clusters: {clusters:?}"
        );
    }
    for id in &founded {
        let count = vms.iter().filter(|vm| owner(vm) == *id).count();
        assert_eq!(
            count, 3,
            "seed {seed}: founded cluster {id} has {count} VMs"
        );
    }
    eprintln!(
        "{KILLS} kills: {} clusters founded, {} released, {} requests never reached the database",
        founded.len(),
        clusters.len() - founded.len(),
        KILLS + 1 - clusters.len()
    );
}

both_backends!(
    killed_mid_founding_then_the_reconciler_cleans_up,
    killed_at_random_points_leaves_no_orphan
);
