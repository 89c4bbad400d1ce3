//! `exk8s-api dev` as a child process: the whole stack on a data dir, with an operator token.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use crate::procs::{Proc, binary, free_port, wait_until};

/// A running stack: where it answers and an operator token for it.
pub struct Stack {
    pub base: String,
    pub token: String,
    pub data: PathBuf,
    api: Mutex<Proc>,
    /// The command's binary, arguments, environment and log, to start it again
    /// ([`Stack::kill_and_restart`]).
    bin: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    log: PathBuf,
}

/// `exk8s-api dev` arguments for a test's many agent runs from one address, seconds apart:
/// more than a real node sends, so the bootstrap rate limits are raised out of the way.
pub const MANY_AGENTS: [&str; 4] = [
    "--bootstrap-rate-per-vm",
    "600",
    "--bootstrap-rate-per-source",
    "6000",
];

impl Stack {
    /// The `exk8s` CLI run as an operator of this stack runs it: its URL and token from the
    /// environment, `home` as `HOME`, nothing else inherited but `PATH`.
    pub fn exk8s(&self, home: &Path, args: &[&str]) -> std::process::Output {
        Command::new(binary("exk8s"))
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("HOME", home)
            .env("EXK8S_API", &self.base)
            .env("EXK8S_TOKEN", &self.token)
            .args(args)
            .output()
            .unwrap()
    }
}

pub fn http() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(60))
        .build()
}

/// Starts `exk8s-api dev` with its data in `data`, addresses from `sim_cidr`, and `extra`
/// arguments; its log goes to `log`. Waits until it answers.
pub fn start_dev(data: &Path, sim_cidr: &str, log: &Path, extra: &[&str]) -> Stack {
    start_dev_with_env(data, sim_cidr, log, extra, &[])
}

/// `env` as the stack keeps it (for restarts).
fn owned(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// [`start_dev`] with `env` added to the stack's environment.
pub fn start_dev_with_env(
    data: &Path,
    sim_cidr: &str,
    log: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Stack {
    start_dev_on(free_port(), data, sim_cidr, log, extra, env)
}

/// [`start_dev_with_env`] on `127.0.0.1:port` (an image baked for the stack names it).
pub fn start_dev_on(
    port: u16,
    data: &Path,
    sim_cidr: &str,
    log: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Stack {
    let env = owned(env);
    let _ = std::fs::remove_file(data.join("operator.token"));
    let listen = format!("127.0.0.1:{port}");
    let mut args: Vec<String> = [
        "dev",
        "--listen",
        &listen,
        "--sim-cidr",
        sim_cidr,
        "--data-dir",
    ]
    .map(str::to_owned)
    .to_vec();
    args.push(data.display().to_string());
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let api = spawn_api(&args, &env, log, false);
    let base = format!("http://{listen}");
    wait_until("the dev stack", Duration::from_secs(30), || {
        data.join("operator.token").exists()
            && http().get(&format!("{base}/healthz")).call().is_ok()
    });
    let token = std::fs::read_to_string(data.join("operator.token"))
        .unwrap()
        .trim()
        .to_owned();
    Stack {
        base,
        token,
        data: data.to_owned(),
        api: Mutex::new(api),
        bin: binary("exk8s-api"),
        args,
        env,
        log: log.to_owned(),
    }
}

/// `exk8s-api ARGS`, its stderr to `log` (appended to when `append`).
fn spawn_api(args: &[String], env: &[(String, String)], log: &Path, append: bool) -> Proc {
    spawn_api_from(&binary("exk8s-api"), args, env, log, append)
}

/// [`spawn_api`] of the exk8s-api at `bin`.
fn spawn_api_from(
    bin: &Path,
    args: &[String],
    env: &[(String, String)],
    log: &Path,
    append: bool,
) -> Proc {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(append)
        .truncate(!append)
        .open(log)
        .unwrap();
    Proc(
        Command::new(bin)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

fn run_api(args: &[&str]) -> String {
    let out = Command::new(binary("exk8s-api"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "exk8s-api {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `exk8s-api serve` on a fresh PostgreSQL database with the simulators (compute, DNS, IMDS)
/// in-process, addresses from `sim_cidr`, `extra` arguments, keys and `api.log` under `dir`, and
/// an operator token.
pub fn start_postgres_serve(dir: &Path, sim_cidr: &str, extra: &[&str]) -> Stack {
    start_postgres_serve_with_env(dir, sim_cidr, extra, &[])
}

/// [`start_postgres_serve`] with `env` added to the API's environment.
pub fn start_postgres_serve_with_env(
    dir: &Path,
    sim_cidr: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Stack {
    let env = owned(env);
    let db_url = crate::postgres::fresh_shared_database("e2e");
    let kek = dir.join("kek.key").display().to_string();
    let signing = dir.join("signing.key").display().to_string();
    run_api(&["keys", "generate-kek", "--out", &kek]);
    run_api(&["keys", "generate", "--out", &signing]);
    let port = free_port();
    let base = format!("http://127.0.0.1:{port}");
    let listen = format!("127.0.0.1:{port}");
    let imds_url = format!("{base}/sim/imds");
    let mut args: Vec<String> = [
        "serve",
        "--listen",
        &listen,
        "--database-url",
        &db_url,
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
        "--imds-url",
        &imds_url,
        "--agent-insecure-http",
        "--sim-cidr",
        sim_cidr,
        // A boot, a failed sync and a retry, seconds apart: more than a real node sends.
        "--bootstrap-rate-per-vm",
        "600",
        "--bootstrap-rate-per-source",
        "6000",
    ]
    .map(str::to_owned)
    .to_vec();
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    let log = dir.join("api.log");
    let api = spawn_api(&args, &env, &log, false);
    wait_until("the API", Duration::from_secs(30), || {
        http().get(&format!("{base}/healthz")).call().is_ok()
    });
    let token = run_api(&[
        "tokens",
        "create",
        "--database-url",
        &db_url,
        "--org",
        "1",
        "--principal",
        "e2e",
        "--scope",
        "operator",
    ])
    .trim()
    .to_owned();
    Stack {
        base,
        token,
        data: dir.to_owned(),
        api: Mutex::new(api),
        bin: binary("exk8s-api"),
        args,
        env,
        log,
    }
}

/// `BIN serve ARGS` — the exk8s-api at `bin`, this workspace's or another release's — serving
/// at `base` with `token` for its operator, its log at `log`; waits until it answers.
pub fn serve_from(bin: &Path, base: &str, token: &str, args: &[String], log: &Path) -> Stack {
    let mut all = vec!["serve".to_owned()];
    all.extend_from_slice(args);
    let api = spawn_api_from(bin, &all, &[], log, false);
    wait_until("the API", Duration::from_secs(60), || {
        http().get(&format!("{base}/healthz")).call().is_ok()
    });
    Stack {
        base: base.to_owned(),
        token: token.to_owned(),
        data: log.parent().unwrap_or(Path::new(".")).to_owned(),
        api: Mutex::new(api),
        bin: bin.to_owned(),
        args: all,
        env: Vec::new(),
        log: log.to_owned(),
    }
}

/// Lines of the API's log a failing test prints.
const LOG_TAIL: usize = 120;

impl Drop for Stack {
    /// A test that panics with the stack up prints the end of the API's log (its warnings and
    /// what it last did), which goes with the stack's temporary directory otherwise.
    fn drop(&mut self) {
        if self.args.iter().any(|a| a == "--machines") {
            // A stack with booted machines powers them off when it stops (SIGTERM): none
            // outlives the test.
            let api = std::mem::replace(
                &mut *self
                    .api
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
                Proc(Command::new("true").spawn().unwrap()),
            );
            api.terminate(Duration::from_secs(180));
        }
        if !std::thread::panicking() {
            return;
        }
        let Ok(log) = std::fs::read_to_string(&self.log) else {
            return;
        };
        let lines: Vec<&str> = log.lines().collect();
        let tail = &lines[lines.len().saturating_sub(LOG_TAIL)..];
        eprintln!(
            "the last {} lines of the API's log ({}):\n{}",
            tail.len(),
            self.log.display(),
            tail.join("\n")
        );
    }
}

impl Stack {
    /// Kills the API with SIGKILL mid-whatever, then starts it again with the same command (same
    /// port, same data); waits until it answers.
    pub fn kill_and_restart(&self) {
        let mut api = self.api.lock().unwrap();
        api.0.kill().unwrap();
        api.0.wait().unwrap();
        *api = spawn_api_from(&self.bin, &self.args, &self.env, &self.log, true);
        drop(api);
        wait_until("the restarted API", Duration::from_secs(30), || {
            http().get(&format!("{}/healthz", self.base)).call().is_ok()
        });
    }

    /// `POST /clusters` for `count` nodes, waiting for founding to end; the response status and
    /// body.
    pub fn found(&self, count: i64) -> (u16, serde_json::Value) {
        let response = http()
            .post(&format!("{}/clusters", self.base))
            .set("Authorization", &format!("Bearer {}", self.token))
            .set("Prefer", "wait=600")
            .send_json(serde_json::json!({"control_plane_count": count, "control_plane_image_id": 1, "control_plane_instance_type": "dev.small", "subnet_id": 1}));
        match response {
            Ok(r) => (r.status(), r.into_json().unwrap()),
            Err(ureq::Error::Status(status, r)) => (status, r.into_json().unwrap_or_default()),
            Err(e) => panic!("POST /clusters: {e}"),
        }
    }

    /// The signed bundle of `vm`, fetched the way a VM does through the simulated IMDS.
    pub fn fetch_bundle(&self, vm: i64, nonce: &str) -> Vec<u8> {
        let imds = format!("{}/sim/imds/{vm}", self.base);
        let session = http()
            .put(&format!("{imds}/token"))
            .call()
            .unwrap()
            .into_string()
            .unwrap();
        let access: serde_json::Value = http()
            .get(&format!("{imds}/latest/identity/access-token"))
            .set("X-exc-imds-token", session.trim())
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        let mut body = Vec::new();
        std::io::Read::read_to_end(
            &mut http()
                .get(&format!("{}/bootstrap/{vm}", self.base))
                .set("X-exc-imds-token", session.trim())
                .set(
                    "Authorization",
                    &format!("Bearer {}", access["access_token"].as_str().unwrap()),
                )
                .set("X-Exk8s-Nonce", nonce)
                .call()
                .unwrap()
                .into_reader(),
            &mut body,
        )
        .unwrap();
        body
    }
}
