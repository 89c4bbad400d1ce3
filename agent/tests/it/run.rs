//! `run` against a fake IMDS and API: the happy path with phase reports, binding refusals,
//! and the network faults: 5xx and 429 retried, 4xx final, size cap, slow bodies, deadlines.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use exk8s_common::node_auth::NODE_KEY_HEADER;

use crate::helpers::{
    NODE_KEY, VM_ID, agent, code, files, only_the_node_key, payload, sign, stderr, tree,
};
use crate::server::{Reply, Request, Server};

pub const IMDS_TOKEN: &str = "imds-session-token-abcdef";
pub const ACCESS_TOKEN: &str = "bootstrap-access-token-123456";

/// Answers IMDS requests; everything else goes to `api`.
pub fn imds_or(
    api: impl Fn(&Request) -> Reply + Send + Sync + 'static,
) -> impl Fn(&Request) -> Reply + Send + Sync + 'static {
    move |r: &Request| match r.path.as_str() {
        "/imds/token" => Reply::ok(IMDS_TOKEN),
        "/imds/latest/identity/node-identity"
            if r.header("X-exc-imds-token") == Some(IMDS_TOKEN) =>
        {
            Reply::ok(format!("{{\"node_id\":{VM_ID}}}"))
        }
        "/imds/latest/identity/access-token"
            if r.header("X-exc-imds-token") == Some(IMDS_TOKEN) =>
        {
            Reply::ok(format!("{{\"access_token\":\"{ACCESS_TOKEN}\"}}"))
        }
        p if p.starts_with("/imds/") => Reply::status(401),
        _ => api(r),
    }
}

/// A bundle for this VM echoing the request's nonce (with `mutate` applied first).
pub fn bundle_for(
    r: &Request,
    mutate: impl Fn(&mut exk8s_common::payload::BundlePayload),
) -> Reply {
    let authorized = r.header("X-exc-imds-token") == Some(IMDS_TOKEN)
        && r.header("Authorization") == Some(&format!("Bearer {ACCESS_TOKEN}"));
    if !authorized {
        return Reply::status(401);
    }
    let mut p = payload(VM_ID, 3, files("a"));
    p.freshness.nonce = r.header("X-Exk8s-Nonce").unwrap().parse().unwrap();
    mutate(&mut p);
    Reply::ok(sign(&p))
}

pub fn config(dir: &Path, server: &Server, extra: &str) -> std::path::PathBuf {
    let path = dir.join("agent.toml");
    std::fs::write(
        &path,
        format!(
            "api_url = \"{url}\"\nimds_url = \"{url}/imds\"\ninsecure_http = true\n\
             imds_timeout_secs = 5\nfetch_timeout_secs = 6\n{extra}",
            url = server.url
        ),
    )
    .unwrap();
    path
}

fn run(scratch: &Path, server: &Server, extra: &str) -> (std::process::Output, std::path::PathBuf) {
    let root = scratch.join("root");
    let cfg = config(scratch, server, extra);
    let out = agent(scratch)
        .env("EXK8S_CONFIG", cfg)
        .arg("run")
        .arg("--root")
        .arg(&root)
        .output()
        .unwrap();
    (out, root)
}

#[test]
fn boots_from_imds_and_api_and_reports_every_phase() {
    let scratch = tempfile::tempdir().unwrap();
    let server = Server::start(imds_or(|r| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/bootstrap/101") => bundle_for(r, |_| {}),
        ("POST", "/bootstrap/101/status") => Reply::ok("{}"),
        _ => Reply::status(404),
    }));
    let (out, root) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(root.join("etc/exk8s/pki/etcd-server-key.pem").exists());
    assert!(root.join("var/lib/exk8s/bootstrap.done").exists());
    let reports: Vec<serde_json::Value> = server
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.path.ends_with("/status"))
        .map(|r| {
            assert_eq!(r.header("X-exc-imds-token"), Some(IMDS_TOKEN));
            serde_json::from_slice(&r.body).unwrap()
        })
        .collect();
    let phases: Vec<String> = reports
        .iter()
        .filter(|r| r["state"] == "succeeded")
        .map(|r| r["phase"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(
        phases,
        [
            "fetch", "verify", "files", "prereqs", "services", "complete"
        ],
        "{reports:?}"
    );
    // No credential ever reaches a log line.
    let log = stderr(&out);
    assert!(
        !log.contains(IMDS_TOKEN) && !log.contains(ACCESS_TOKEN),
        "{log}"
    );

    // The fetch registered the node key the agent keeps, privately.
    let registered = server
        .requests
        .lock()
        .unwrap()
        .iter()
        .find(|r| r.path == "/bootstrap/101")
        .and_then(|r| r.header(NODE_KEY_HEADER).map(str::to_owned))
        .expect("the first fetch sends the node key");
    // Reports after verification name the bundle's generation.
    let complete = reports.iter().find(|r| r["phase"] == "complete").unwrap();
    assert_eq!(complete["generation"], 1, "{complete}");
    let key = std::fs::read_to_string(root.join(NODE_KEY)).unwrap();
    let key = exk8s_common::node_auth::NodeKey::from_secret_text(&key).unwrap();
    assert_eq!(key.public().to_text(), registered);
    assert!(!log.contains(key.to_secret_text().as_str()));
}

#[test]
fn run_on_a_bootstrapped_node_looks_for_an_update_instead_of_exiting() {
    let scratch = tempfile::tempdir().unwrap();
    let server = Server::start(imds_or(|r| match (r.method.as_str(), r.path.as_str()) {
        ("GET", "/bootstrap/101") => bundle_for(r, |_| {}),
        ("GET", "/nodes/101/generation") => {
            Reply::ok(r#"{"desired_generation":1,"applied_generation":1,"up_to_date":true}"#)
        }
        _ => Reply::ok("{}"),
    }));
    let (out, _) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let (out, _) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("looking for an update"),
        "{}",
        stderr(&out)
    );
    assert_eq!(server.count("/nodes/101/generation"), 1);
    assert_eq!(
        server.count("/bootstrap/101"),
        1,
        "a bootstrapped node fetched its bootstrap bundle again"
    );
}

#[test]
fn a_bundle_for_another_vm_or_request_is_refused_and_writes_nothing() {
    type Mutation = fn(&mut exk8s_common::payload::BundlePayload);
    let cases: [(&str, Mutation); 3] = [
        ("is for vm 102", |p| p.identity.vm_id = 102),
        ("nonce", |p| {
            p.freshness.nonce = "some-other-nonce-0000000".parse().unwrap()
        }),
        ("expired", |p| {
            p.freshness.issued_at -= 7200;
            p.freshness.expires_at -= 7200;
        }),
    ];
    for (expect, mutate) in cases {
        let scratch = tempfile::tempdir().unwrap();
        let server = Server::start(imds_or(move |r| match r.path.as_str() {
            "/bootstrap/101" => bundle_for(r, mutate),
            _ => Reply::ok("{}"),
        }));
        let (out, root) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
        assert_eq!(code(&out), 4, "{expect}: {}", stderr(&out));
        assert!(stderr(&out).contains(expect), "{}", stderr(&out));
        assert!(
            only_the_node_key(&root),
            "{expect}: wrote {:?}",
            tree(&root)
        );
        let failed = server.requests.lock().unwrap().iter().any(|r| {
            r.path.ends_with("/status") && String::from_utf8_lossy(&r.body).contains("\"failed\"")
        });
        assert!(failed, "{expect}: the refusal was not reported");
    }
}

#[test]
fn server_errors_and_rate_limits_are_retried() {
    let scratch = tempfile::tempdir().unwrap();
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&calls);
    let server = Server::start(imds_or(move |r| match r.path.as_str() {
        "/bootstrap/101" => match seen.fetch_add(1, Ordering::SeqCst) {
            0 => Reply::status(500),
            1 => Reply::Full {
                status: 429,
                headers: vec![("Retry-After".into(), "1".into())],
                body: vec![],
            },
            _ => bundle_for(r, |_| {}),
        },
        _ => Reply::ok("{}"),
    }));
    let start = Instant::now();
    let (out, _) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert!(
        start.elapsed() >= Duration::from_secs(1),
        "Retry-After was not honoured"
    );
}

#[test]
fn a_client_error_is_final() {
    let scratch = tempfile::tempdir().unwrap();
    let server = Server::start(imds_or(|r| match r.path.as_str() {
        "/bootstrap/101" => Reply::status(404),
        _ => Reply::ok("{}"),
    }));
    let (out, root) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("HTTP 404"), "{}", stderr(&out));
    assert_eq!(server.count("/bootstrap/101"), 1, "a 404 was retried");
    assert!(only_the_node_key(&root), "wrote {:?}", tree(&root));
}

#[test]
fn an_endless_body_is_cut_at_the_envelope_limit() {
    let scratch = tempfile::tempdir().unwrap();
    let server = Server::start(imds_or(|r| match r.path.as_str() {
        "/bootstrap/101" => Reply::Endless,
        _ => Reply::ok("{}"),
    }));
    let start = Instant::now();
    let (out, root) = run(scratch.path(), &server, "request_timeout_secs = 30\n");
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("limit"), "{}", stderr(&out));
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(only_the_node_key(&root), "wrote {:?}", tree(&root));
}

#[test]
fn a_trickling_body_times_out_and_the_deadline_ends_the_retries() {
    let scratch = tempfile::tempdir().unwrap();
    let server = Server::start(imds_or(|r| match r.path.as_str() {
        "/bootstrap/101" => Reply::Trickle,
        _ => Reply::ok("{}"),
    }));
    let start = Instant::now();
    let (out, _) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(stderr(&out).contains("gave up after"), "{}", stderr(&out));
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(15),
        "the 6 s fetch deadline took {took:?}"
    );
}

#[test]
fn no_imds_until_the_deadline_is_network_exhaustion() {
    let scratch = tempfile::tempdir().unwrap();
    let server = Server::start(|_r: &Request| Reply::status(503));
    let (out, _) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_eq!(code(&out), 3, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("IMDS session token"),
        "{}",
        stderr(&out)
    );
    assert!(server.count("/imds/token") >= 2, "IMDS was not retried");
}

#[test]
fn a_plain_http_api_needs_the_explicit_insecure_flag() {
    let scratch = tempfile::tempdir().unwrap();
    let server = Server::start(|_r: &Request| Reply::status(500));
    let cfg = scratch.path().join("agent.toml");
    std::fs::write(
        &cfg,
        format!("api_url = \"{0}\"\nimds_url = \"{0}/imds\"\n", server.url),
    )
    .unwrap();
    let out = agent(scratch.path())
        .env("EXK8S_CONFIG", &cfg)
        .arg("run")
        .output()
        .unwrap();
    assert_eq!(code(&out), 2, "{}", stderr(&out));
    assert!(stderr(&out).contains("insecure_http"), "{}", stderr(&out));
    assert!(server.paths().is_empty(), "contacted a plain-HTTP API");
}

/// A first boot that fails after its fetch is tried again with the bundle it fetched, while that
/// bundle is valid: no second fetch, the same files (each fetch here serves other contents, as
/// freshly minted certificates are), the fetch reported as resumed; once the boot completes the
/// kept bundle is gone. A kept bundle that no longer verifies is forgotten and fetched afresh.
#[test]
fn a_retried_first_boot_resumes_with_the_bundle_it_fetched() {
    let scratch = tempfile::tempdir().unwrap();
    let fetches = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&fetches);
    let server = Server::start(imds_or(move |r| {
        match (r.method.as_str(), r.path.as_str()) {
            ("GET", "/bootstrap/101") => {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                bundle_for(r, |p| p.files = files(&format!("fetch-{n}")))
            }
            ("POST", "/bootstrap/101/status") => Reply::ok("{}"),
            _ => Reply::status(404),
        }
    }));
    let root = scratch.path().join("root");
    let kept = root.join("var/lib/exk8s/first-boot.bundle");
    let cert = root.join("etc/exk8s/pki/etcd-server.pem");
    // A directory where the bundle writes a file: the first attempt fails in its files phase.
    std::fs::create_dir_all(&cert).unwrap();
    let (out, _) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_ne!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(fetches.load(Ordering::SeqCst), 1);
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&kept).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "the kept bundle holds keys");

    std::fs::remove_dir(&cert).unwrap();
    let (out, _) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(fetches.load(Ordering::SeqCst), 1, "resumed without a fetch");
    assert_eq!(std::fs::read_to_string(&cert).unwrap(), "cert fetch-1\n");
    assert!(stderr(&out).contains("resuming with the bundle a failed attempt fetched"));
    let resumed = server
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|r| r.path.ends_with("/status"))
        .map(|r| serde_json::from_slice::<serde_json::Value>(&r.body).unwrap())
        .any(|r| {
            r["phase"] == "fetch" && r["message"].as_str().is_some_and(|m| m.contains("resumed"))
        });
    assert!(resumed, "the resumed fetch is reported");
    assert!(root.join("var/lib/exk8s/bootstrap.done").exists());
    assert!(!kept.exists(), "forgotten once the boot completed");

    // Another machine's attempt kept a bundle that a byte flipped: refused, forgotten, fetched.
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    let (kept, cert) = (
        root.join("var/lib/exk8s/first-boot.bundle"),
        root.join("etc/exk8s/pki/etcd-server.pem"),
    );
    std::fs::create_dir_all(&cert).unwrap();
    let (out, _) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_ne!(code(&out), 0, "{}", stderr(&out));
    let mut bytes = std::fs::read(&kept).unwrap();
    let last = bytes.len() - 10;
    bytes[last] ^= 0x01;
    std::fs::write(&kept, bytes).unwrap();
    std::fs::remove_dir(&cert).unwrap();
    let before = fetches.load(Ordering::SeqCst);
    let (out, _) = run(scratch.path(), &server, "request_timeout_secs = 2\n");
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no longer serves"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fetches.load(Ordering::SeqCst), before + 1);
    assert_eq!(
        std::fs::read_to_string(&cert).unwrap(),
        format!("cert fetch-{}\n", before + 1)
    );
    assert!(!kept.exists());
}
