//! The API under measurement: `exk8s-api serve` started on a fresh data directory with its
//! keys, schema and an operator token made by its own CLI, the simulators for compute, DNS and
//! instance metadata, and rate limits out of the way; stopped when the run ends.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use exk8s_common::Keyring;
use serde_json::json;

use crate::fleet::get_text;
use crate::{Args, proxy};

/// Stops the API when the run ends: SIGTERM first when given time to end by itself
/// (`--graceful-stop-secs`), killed otherwise or past it.
pub(crate) struct Api {
    pub child: Child,
    pub graceful: Duration,
}

impl Drop for Api {
    fn drop(&mut self) {
        if !self.graceful.is_zero() {
            let pid = rustix::process::Pid::from_child(&self.child);
            if rustix::process::kill_process(pid, rustix::process::Signal::TERM).is_ok() {
                let start = Instant::now();
                while start.elapsed() < self.graceful {
                    if !matches!(self.child.try_wait(), Ok(None)) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                eprintln!(
                    "exk8s-loadgen: the API did not end within {}s of SIGTERM; killing it",
                    self.graceful.as_secs()
                );
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A started API and what the run needs of it.
pub(crate) struct Served {
    pub api: Api,
    pub base: String,
    pub token: String,
    /// The database as the CLI reaches it (the API itself may go through the latency proxy).
    pub db_url: String,
    /// The API's published bundle-signing keys.
    pub keys: Arc<Keyring>,
    /// Holds the keys and the SQLite database until the run ends.
    pub _dir: tempfile::TempDir,
}

/// Starts the API as `args` ask and waits until it answers.
pub(crate) async fn serve(args: &Args, http: &reqwest::Client) -> Result<Served, String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let db_url = args
        .database_url
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}/exk8s.db?mode=rwc", dir.path().display()));
    // The API reaches PostgreSQL through the latency proxy; the CLI steps below go direct.
    let serve_db_url = if args.db_latency_ms > 0 {
        let upstream = proxy::upstream(&db_url)?;
        let address = proxy::start(upstream, Duration::from_millis(args.db_latency_ms))
            .await
            .map_err(|e| format!("starting the latency proxy: {e}"))?;
        proxy::through(&db_url, address)?
    } else {
        db_url.clone()
    };
    let kek = dir.path().join("kek").display().to_string();
    let signing = dir.path().join("signing").display().to_string();
    run_api(&args.api_bin, &["keys", "generate-kek", "--out", &kek])?;
    run_api(&args.api_bin, &["keys", "generate", "--out", &signing])?;
    run_api(&args.api_bin, &["migrate", "--database-url", &db_url])?;
    let token = run_api(
        &args.api_bin,
        &[
            "tokens",
            "create",
            "--database-url",
            &db_url,
            "--org",
            "1",
            "--principal",
            "loadgen",
            "--scope",
            "operator",
        ],
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?
        .port();
    let base = format!("http://127.0.0.1:{port}");
    let child = Command::new(&args.api_bin)
        .args([
            "serve",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--database-url",
            &serve_db_url,
            "--kek-file",
            &kek,
            "--signing-key",
            &signing,
            "--compute",
            "sim",
            "--dns",
            "sim",
            "--imds",
            "sim",
            "--public-url",
            &base,
            "--bootstrap-rate-per-vm",
            "100000000",
            "--bootstrap-rate-per-source",
            "100000000",
        ])
        .args(&args.api_args)
        .env("EXK8S_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting the API: {e}"))?;
    let api = Api {
        child,
        graceful: Duration::from_secs(args.graceful_stop_secs),
    };
    let start = Instant::now();
    while http.get(format!("{base}/healthz")).send().await.is_err() {
        if start.elapsed() > Duration::from_secs(30) {
            return Err("the API did not start".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let keys_text = get_text(http, &format!("{base}/bootstrap/keys"), None).await?;
    let mut keys = Keyring::new();
    keys.add_pub_text(&keys_text, "/bootstrap/keys")
        .map_err(|e| e.to_string())?;
    let keys = Arc::new(keys);
    if args.sim_latency_ms > 0 {
        let set = http
            .put(format!("{base}/sim/compute/sim/faults"))
            .json(&json!({"latency_ms": args.sim_latency_ms}))
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if !set.status().is_success() {
            return Err(format!("setting simulator latency: HTTP {}", set.status()));
        }
    }

    Ok(Served {
        api,
        base,
        token,
        db_url,
        keys,
        _dir: dir,
    })
}

fn run_api(bin: &PathBuf, args: &[&str]) -> Result<String, String> {
    let out = Command::new(bin)
        .args(args)
        .output()
        .map_err(|e| format!("running {}: {e}", bin.display()))?;
    if !out.status.success() {
        return Err(format!(
            "exk8s-api {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}
