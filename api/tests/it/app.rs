//! `spawn_app`: the real server on port 0 against a fresh database (a SQLite file, or a new
//! PostgreSQL database on the local server), with the in-process simulators.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use exk8s_api::app::{ApiConfig, AppState};
use exk8s_api::crypto::{Kek, Keyring};
use exk8s_api::db::{self, Db};
use exk8s_api::http::server::Application;
use exk8s_api::metrics::Metrics;
use exk8s_api::sim::Simulators;
use exk8s_api::tokens::{self, Scope};
use exk8s_common::BundleSigner;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The PostgreSQL server tests use; scripts/test.sh makes sure one answers.
pub fn postgres_admin_url() -> String {
    std::env::var("EXK8S_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// A fresh database URL for `backend` (the temp dir keeps a SQLite file alive).
pub async fn fresh_database(backend: Backend, dir: &std::path::Path) -> String {
    match backend {
        Backend::Sqlite => format!("sqlite://{}/exk8s.db?mode=rwc", dir.display()),
        Backend::Postgres => {
            let admin = postgres_admin_url();
            let name = format!("exk8s_test_{}", uuid::Uuid::new_v4().simple());
            sqlx::any::install_default_drivers();
            let pool = sqlx::AnyPool::connect(&admin).await.unwrap_or_else(|e| {
                panic!("PostgreSQL must answer at {admin} (scripts/test.sh starts it): {e}")
            });
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(&pool)
                .await
                .unwrap();
            pool.close().await;
            let base = admin
                .rsplit_once('/')
                .map_or(admin.as_str(), |(b, _)| b)
                .to_owned();
            format!("{base}/{name}")
        }
    }
}

pub struct TestApp {
    pub url: String,
    pub db_url: String,
    pub state: AppState,
    pub sims: Simulators,
    pub http: reqwest::Client,
    /// An operator token of org 7.
    pub token: String,
    pub stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub server: tokio::task::JoinHandle<std::io::Result<()>>,
    pub _dir: Arc<tempfile::TempDir>,
}

/// Every log line of this test binary, captured at TRACE level (scanned for secrets).
pub static LOGS: std::sync::OnceLock<Arc<std::sync::Mutex<Vec<u8>>>> = std::sync::OnceLock::new();

struct Capture(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn capture_logs() -> Arc<std::sync::Mutex<Vec<u8>>> {
    LOGS.get_or_init(|| {
        let buffer = Arc::new(std::sync::Mutex::new(Vec::new()));
        let writer = Arc::clone(&buffer);
        let _ = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Capture(Arc::clone(&writer)))
            .try_init();
        buffer
    })
    .clone()
}

pub fn test_config() -> ApiConfig {
    ApiConfig {
        rate_per_vm: exk8s_api::ratelimit::Limit {
            per_minute: 6000,
            burst: 1000,
        },
        rate_per_source: exk8s_api::ratelimit::Limit {
            per_minute: 60000,
            burst: 10000,
        },
        public_url: "http://127.0.0.1:1".into(),
        address_timeout: Duration::from_secs(2),
        drain: Duration::from_millis(0),
        kubernetes_versions: vec!["v1.35.3".into(), "v1.34.6".into()],
        // The reconciler's pass at start runs; a test that wants another calls it. A timed
        // pass in the middle of a test would race what it checks (a slow run of the suite
        // passes the default minute).
        reconcile_interval: Duration::from_secs(3600),
        ..ApiConfig::default()
    }
}

pub async fn spawn_app(backend: Backend) -> TestApp {
    spawn_with(backend, test_config(), None).await
}

/// Spawns a server; `shared` reuses another app's database and temp dir (two replicas).
pub async fn spawn_with(
    backend: Backend,
    config: ApiConfig,
    shared: Option<(&str, Arc<tempfile::TempDir>)>,
) -> TestApp {
    spawn_clocked(
        backend,
        config,
        shared,
        Arc::new(exk8s_api::clock::SystemClock),
    )
    .await
}

/// Spawns a server whose certificate lifetimes follow `clock`.
pub async fn spawn_clocked(
    backend: Backend,
    config: ApiConfig,
    shared: Option<(&str, Arc<tempfile::TempDir>)>,
    clock: Arc<dyn exk8s_api::clock::Clock>,
) -> TestApp {
    spawn_on(backend, config, shared, clock, None).await
}

/// Another API process beside `app`: its database, directory and simulated cloud.
pub async fn spawn_replica(app: &TestApp, backend: Backend) -> TestApp {
    spawn_replica_with(app, backend, test_config()).await
}

/// [`spawn_replica`] with `config`.
pub async fn spawn_replica_with(app: &TestApp, backend: Backend, config: ApiConfig) -> TestApp {
    spawn_on(
        backend,
        config,
        Some((&app.db_url, Arc::clone(&app._dir))),
        Arc::new(exk8s_api::clock::SystemClock),
        Some(app.sims.clone()),
    )
    .await
}

async fn spawn_on(
    backend: Backend,
    config: ApiConfig,
    shared: Option<(&str, Arc<tempfile::TempDir>)>,
    clock: Arc<dyn exk8s_api::clock::Clock>,
    sims: Option<Simulators>,
) -> TestApp {
    capture_logs();
    let (db_url, dir) = match shared {
        Some((url, dir)) => (url.to_owned(), dir),
        None => {
            let dir = Arc::new(tempfile::tempdir().unwrap());
            (fresh_database(backend, dir.path()).await, dir)
        }
    };
    let sims = sims.unwrap_or_else(|| Simulators::new("127.0.10.0/24").unwrap());
    let db = Db::connect(&db_url).unwrap();
    let state = AppState {
        snapshot_store: exk8s_api::snapshots::Store::open(&exk8s_api::snapshots::Location::Local(
            dir.path().join("snapshots"),
        ))
        .unwrap(),
        feed: Arc::new(exk8s_api::feed::Feed::new(db.clone(), config.event_streams)),
        db,
        keks: Arc::new(Keyring::new(vec![Kek::new("test-kek", &[9; 32]).unwrap()]).unwrap()),
        signer: Arc::new(BundleSigner::from_seed(&[0x44; 32])),
        extra_trusted_keys: Arc::new(vec![]),
        compute: Arc::new(sims.compute.clone()),
        dns: Some(Arc::new(sims.dns.clone())),
        config: Arc::new(config.clone()),
        metrics: Arc::new(Metrics::default()),
        draining: Arc::new(AtomicBool::new(false)),
        cpu: exk8s_api::cpu::CpuPool::per_core_with_queue(config.cpu_queue_per_core),
        limits: Arc::new(exk8s_api::app::BootstrapLimits::new(&config)),
        clock,
        issuers: Arc::new(exk8s_api::records::issuers::IssuerCache::new(
            exk8s_api::records::issuers::DEFAULT_CAPACITY,
        )),
        recorded: Arc::new(exk8s_api::cert_cache::CertificateCache::new(
            exk8s_api::cert_cache::DEFAULT_BOUND_ROWS,
        )),
        founders: exk8s_api::founding::queue::Founders::new(
            config.founding_workers,
            config.founding_queue,
        ),
        key_pool: exk8s_api::keypool::KeyPool::start(config.key_pool_max).unwrap(),
    };
    let app = Application::build(state.clone(), "127.0.0.1:0")
        .await
        .unwrap();
    let url = format!("http://{}", app.local_addr().unwrap());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let token = operator_token(&state, 7, Scope::Operator, 3600).await;
    TestApp {
        url,
        db_url,
        state,
        sims,
        http: reqwest::Client::new(),
        token,
        stop: Some(stop),
        server,
        _dir: dir,
    }
}

/// Inserts an IMDS session token for a VM (as the metadata service would); returns it.
pub async fn imds_token(state: &AppState, vm_id: i64, org: i64, ttl: i64) -> String {
    let token = tokens::generate("exk8s_imds").unwrap().to_string();
    let now = db::now();
    db::tokens::insert_imds_token(
        &state.db.pool,
        &tokens::hash(&token),
        vm_id,
        org,
        now,
        now + ttl,
    )
    .await
    .unwrap();
    token
}

/// Inserts a principal token; returns it.
pub async fn operator_token(state: &AppState, org: i64, scope: Scope, ttl: i64) -> String {
    let prefix = match scope {
        Scope::Operator => "exk8s_op",
        Scope::Bootstrap => "exk8s_bs",
    };
    let token = tokens::generate(prefix).unwrap().to_string();
    let now = db::now();
    db::tokens::insert_api_token(
        &state.db.pool,
        &tokens::hash(&token),
        org,
        "tester",
        scope,
        now,
        now + ttl,
    )
    .await
    .unwrap();
    token
}

impl TestApp {
    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .post(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
    }

    pub fn patch(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .patch(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
    }

    pub fn put(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .put(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
    }

    pub fn delete(&self, path: &str) -> reqwest::RequestBuilder {
        self.http
            .delete(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
    }

    /// POST /clusters with a valid body for `count` nodes, merged with `extra`, waiting for
    /// founding to end (201 or its error).
    pub async fn found(&self, count: i64, extra: serde_json::Value) -> reqwest::Response {
        let mut body = valid_body(count);
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            for (k, v) in e {
                b.insert(k.clone(), v.clone());
            }
        }
        self.post("/clusters")
            .header(WAIT.0, WAIT.1)
            .json(&body)
            .send()
            .await
            .unwrap()
    }

    /// The `/metrics` exposition (no token: anyone may read it).
    pub async fn metrics(&self) -> String {
        let answer = self
            .http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status(), 200);
        answer.text().await.unwrap()
    }

    /// Clusters that are not deleted (a deleted one's row is kept: `db::kept`).
    pub async fn cluster_count(&self) -> i64 {
        use sqlx::Row as _;
        sqlx::query("SELECT COUNT(*) AS n FROM clusters WHERE phase <> 'deleted'")
            .fetch_one(&self.state.db.pool)
            .await
            .unwrap()
            .get::<i64, _>("n")
    }
}

/// A response's JSON body; anything else fails the test with the status and the text.
/// The preference that makes `POST /clusters` answer when founding ends (201 or its error)
/// rather than at once (202).
pub const WAIT: (&str, &str) = ("Prefer", "wait=600");

pub async fn json_of(response: reqwest::Response) -> serde_json::Value {
    let status = response.status();
    let text = response.text().await.unwrap();
    serde_json::from_str(&text).unwrap_or_else(|_| panic!("status {status}, not JSON: {text}"))
}

pub fn valid_body(count: i64) -> serde_json::Value {
    serde_json::json!({
        "control_plane_count": count,
        "control_plane_image_id": 42,
        "control_plane_instance_type": "e2.medium",
        "subnet_id": 5,
    })
}

/// Runs an async test body once per backend.
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() { super::$name(crate::app::Backend::Sqlite).await }
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() { super::$name(crate::app::Backend::Postgres).await }
        }
    )*};
}
pub(crate) use both_backends;

/// A VM of a founded test cluster with its two credentials.
pub(crate) struct Node {
    pub vm: i64,
    pub cluster: i64,
    pub imds: String,
    pub bootstrap: String,
}

/// Founds an `count`-node cluster for `org` and gives each VM its two credentials.
pub(crate) async fn cluster_with_credentials(app: &TestApp, org: i64, count: i64) -> Vec<Node> {
    let operator = if org == 7 {
        app.token.clone()
    } else {
        operator_token(&app.state, org, Scope::Operator, 3600).await
    };
    let mut body = crate::app::valid_body(count);
    body["control_plane_image_id"] = serde_json::json!(42);
    let response = app
        .http
        .post(format!("{}/clusters", app.url))
        .header(WAIT.0, WAIT.1)
        .bearer_auth(&operator)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    let created: serde_json::Value = response.json().await.unwrap();
    credentials_for(app, org, &created).await
}

/// Each VM of a `POST /clusters` answer with its two credentials.
pub(crate) async fn credentials_for(
    app: &TestApp,
    org: i64,
    created: &serde_json::Value,
) -> Vec<Node> {
    let cluster = created["cluster_id"].as_i64().unwrap();
    let bootstrap = operator_token(&app.state, org, Scope::Bootstrap, 3600).await;
    let mut nodes = Vec::new();
    for vm in created["control_plane_vm_ids"].as_array().unwrap() {
        let vm = vm.as_i64().unwrap();
        nodes.push(Node {
            vm,
            cluster,
            imds: imds_token(&app.state, vm, org, 600).await,
            bootstrap: bootstrap.clone(),
        });
    }
    nodes
}
