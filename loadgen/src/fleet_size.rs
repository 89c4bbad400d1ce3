//! Fleet size: idle clusters founded before the measured ones (so issuance runs against a large
//! database), and the timing of `GET /clusters` pages over the whole fleet.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::sync::Semaphore;

/// Founds `count` idle `nodes`-node ecdsa-p256 clusters, `parallel` at once; returns how many
/// failed (each printed).
pub(crate) async fn found_idle(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    count: usize,
    nodes: u32,
    parallel: usize,
) -> Result<usize, String> {
    let gate = Arc::new(Semaphore::new(parallel.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for i in 0..count {
        let permit = Arc::clone(&gate)
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let (http, url, token) = (http.clone(), format!("{base}/clusters"), token.to_owned());
        tasks.spawn(async move {
            let body = json!({"control_plane_count": nodes, "control_plane_image_id": 1, "control_plane_instance_type": "bench", "subnet_id": 1});
            let answer = http
                .post(url)
                .header("Prefer", "wait=300")
                .bearer_auth(token)
                .json(&body)
                .timeout(Duration::from_secs(300))
                .send()
                .await;
            drop(permit);
            match answer {
                Ok(r) if r.status().as_u16() == 201 => None,
                Ok(r) => Some(format!("idle cluster {i}: HTTP {}", r.status())),
                Err(e) => Some(format!("idle cluster {i}: {e}")),
            }
        });
        if (i + 1) % 1000 == 0 {
            eprintln!(
                "exk8s-loadgen: {} idle clusters asked for in {:.0} s",
                i + 1,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let mut failed = 0;
    while let Some(done) = tasks.join_next().await {
        if let Some(why) = done.map_err(|e| e.to_string())? {
            eprintln!("exk8s-loadgen: {why}");
            failed += 1;
        }
    }
    Ok(failed)
}

/// The walks' timings.
pub(crate) struct Walked {
    /// Each page of the first walk, from request to its last byte: the API's pool connections
    /// each prepare the page's statements, and PostgreSQL's backends load their catalogs, on
    /// first use.
    pub(crate) cold: Vec<Duration>,
    /// Each page of the walks after it, from request to its last byte.
    pub(crate) pages: Vec<Duration>,
    /// Each page's parsing into JSON values, on this client, after its last byte (the walks
    /// after the first).
    pub(crate) parsing: Vec<Duration>,
    /// Clusters listed in the last walk.
    pub(crate) clusters: usize,
    /// How long the first walk and the walks after it took.
    pub(crate) cold_took: Duration,
    pub(crate) took: Duration,
}

/// Walks `GET /clusters` from its first page to its last once cold, then `walks` times,
/// timing each page to its last byte, and its parsing apart (a page of 500 views is megabytes
/// of JSON, and this client's parsing is not the API's latency).
pub(crate) async fn list_pages(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    walks: usize,
) -> Result<Walked, String> {
    let mut latencies = Vec::new();
    let mut parsing = Vec::new();
    let mut clusters = 0;
    let mut started = Instant::now();
    let (mut cold, mut cold_took) = (Vec::new(), Duration::ZERO);
    for walk in 0..=walks {
        if walk == 1 {
            cold = std::mem::take(&mut latencies);
            parsing.clear();
            cold_took = started.elapsed();
            started = Instant::now();
        }
        let mut next = Some(format!("{base}/clusters"));
        clusters = 0;
        while let Some(url) = next.take() {
            let t = Instant::now();
            let response = http
                .get(&url)
                .bearer_auth(token)
                .timeout(Duration::from_secs(120))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if !response.status().is_success() {
                return Err(format!("GET {url}: HTTP {}", response.status()));
            }
            next = response
                .headers()
                .get("link")
                .and_then(|l| l.to_str().ok())
                .and_then(|l| {
                    l.split_once('<')?
                        .1
                        .split_once('>')
                        .map(|(u, _)| u.to_owned())
                })
                .map(|u| {
                    if u.starts_with('/') {
                        format!("{base}{u}")
                    } else {
                        u
                    }
                });
            let body = response.bytes().await.map_err(|e| e.to_string())?;
            latencies.push(t.elapsed());
            let t = Instant::now();
            let page: Vec<serde_json::Value> =
                serde_json::from_slice(&body).map_err(|e| format!("GET {url}: {e}"))?;
            parsing.push(t.elapsed());
            clusters += page.len();
        }
    }
    Ok(Walked {
        cold,
        pages: latencies,
        parsing,
        clusters,
        cold_took,
        took: started.elapsed(),
    })
}

/// Copies the certificate rows of the last node's latest bundle to every node with none, in
/// one transaction, then analyses: as if every idle node had booted.
const BOOT_SQL: &str = "BEGIN;
CREATE TEMP TABLE template AS
  SELECT name, kind, subject, issuer, serial, not_before, not_after, created_at
  FROM issued_certificates
  WHERE id IN (SELECT max(id) FROM issued_certificates
               WHERE (node_id, generation) = (SELECT node_id, generation FROM issued_certificates
                                              WHERE node_id IS NOT NULL ORDER BY id DESC LIMIT 1)
               GROUP BY name);
INSERT INTO issued_certificates (cluster_id, node_id, generation, name, kind, subject, issuer,
  serial, not_before, not_after, created_at)
SELECT n.cluster_id, n.id, n.applied_generation, t.name, t.kind, t.subject, t.issuer, t.serial,
  t.not_before, t.not_after, t.created_at
FROM cluster_nodes n CROSS JOIN template t
WHERE NOT EXISTS (SELECT 1 FROM issued_certificates c WHERE c.node_id = n.id);
COMMIT;
ANALYZE;";

/// Runs `sql` in the PostgreSQL database at `url` through psql (stopping at the first
/// error) for the option `flag`; what psql printed, each statement's tag on a line.
pub(crate) fn psql(url: &str, flag: &str, sql: &str) -> Result<String, String> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    if !url.starts_with("postgres") {
        return Err(format!("{flag} needs a PostgreSQL --database-url"));
    }
    let mut psql = Command::new("psql")
        .args([url, "-v", "ON_ERROR_STOP=1", "-At", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("running psql for {flag}: {e}"))?;
    if let Some(mut stdin) = psql.stdin.take() {
        stdin
            .write_all(sql.as_bytes())
            .map_err(|e| format!("writing to psql for {flag}: {e}"))?;
    }
    let out = psql
        .wait_with_output()
        .map_err(|e| format!("running psql for {flag}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{flag} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Boots the fleet in the PostgreSQL database at `url` (see [`BOOT_SQL`]); fails when no
/// bundle was fetched to copy from.
pub(crate) fn boot(url: &str) -> Result<(), String> {
    let said = psql(url, "--boot-fleet", BOOT_SQL)?;
    // psql prints each statement's tag: `SELECT n` for the template, `INSERT 0 n`.
    let tagged = |tag: &str| {
        said.lines()
            .find_map(|line| line.strip_prefix(tag))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .ok_or_else(|| format!("--boot-fleet: psql did not say {tag}…: {said}"))
    };
    if tagged("SELECT ")? == 0 {
        return Err("--boot-fleet: no bundle was fetched to copy certificates from".into());
    }
    let rows = tagged("INSERT 0 ")?;
    eprintln!("exk8s-loadgen: fleet booted: {rows} certificate rows recorded for idle nodes");
    Ok(())
}
