//! Bundle fetches as a fleet makes them ([`FetchSet`]): each one verified and checked for its
//! VM and nonce, each failure classified ([`FetchError`]), and the latencies summed up
//! ([`Summary`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use exk8s_common::{Keyring, verify};
use serde::Serialize;
use serde_json::Value;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::Semaphore;

use crate::fleet::{Vm, key_pool_filled};

#[derive(Debug, Serialize)]
pub(crate) struct Summary {
    pub(crate) what: String,
    pub(crate) count: usize,
    pub(crate) errors: usize,
    /// 429 or 5xx in the API's error format (with Retry-After where due).
    pub(crate) clean_errors: usize,
    /// Passed the client timeout.
    pub(crate) hung: usize,
    /// Any other answer, or a bundle that does not verify or is not this request's.
    pub(crate) bad: usize,
    pub(crate) seconds: f64,
    pub(crate) per_second: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    /// With --idle-check: seconds until the API's CPU fell idle after the set ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) idle_after_s: Option<f64>,
    /// A fetch set's CPU per bundle, and with --floor its ratio to the floor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cpu: Option<CpuPerBundle>,
}

/// What one bundle cost the machine's processes, in milliseconds of CPU.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct CpuPerBundle {
    /// The API process and its key helpers.
    pub(crate) api_ms: f64,
    /// Every PostgreSQL process on the machine (none on SQLite).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) postgres_ms: Option<f64>,
    /// The size of the payload the API signed.
    pub(crate) payload_bytes: u64,
    /// The cryptography a bundle needs ([`crate::floor`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) floor_ms: Option<f64>,
    /// `api_ms / floor_ms`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) ratio: Option<f64>,
}

pub(crate) fn summarise(
    what: String,
    mut latencies: Vec<Duration>,
    failures: &[FetchError],
    elapsed: Duration,
) -> Summary {
    let errors = failures.len();
    let kind = |k: fn(&FetchError) -> bool| failures.iter().filter(|f| k(f)).count();
    latencies.sort();
    let pick = |q: f64| {
        if latencies.is_empty() {
            return 0.0;
        }
        let index = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[index].as_secs_f64() * 1000.0
    };
    let count = latencies.len() + errors;
    Summary {
        what,
        count,
        errors,
        clean_errors: kind(|f| matches!(f, FetchError::Clean(_))),
        hung: kind(|f| matches!(f, FetchError::Hung)),
        bad: kind(|f| matches!(f, FetchError::Bad(_))),
        seconds: elapsed.as_secs_f64(),
        per_second: latencies.len() as f64 / elapsed.as_secs_f64().max(1e-9),
        p50_ms: pick(0.50),
        p90_ms: pick(0.90),
        p99_ms: pick(0.99),
        idle_after_s: None,
        cpu: None,
    }
}

/// Why one fetch failed.
#[derive(Debug)]
pub(crate) enum FetchError {
    /// A refusal the API meant: 429, or a 5xx with our error body (and Retry-After if 429/503).
    Clean(u16),
    /// No complete answer within the client timeout.
    Hung,
    Bad(String),
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Clean(status) => write!(f, "clean refusal: HTTP {status}"),
            Self::Hung => f.write_str("no answer within the timeout"),
            Self::Bad(why) => f.write_str(why),
        }
    }
}

pub(crate) fn transport(e: reqwest::Error) -> FetchError {
    if e.is_timeout() {
        FetchError::Hung
    } else {
        FetchError::Bad(format!("transport: {e}"))
    }
}

/// How a request that was not answered 200 failed.
pub(crate) async fn refusal(response: reqwest::Response) -> FetchError {
    let status = response.status().as_u16();
    let retry_after = response.headers().contains_key("retry-after");
    let body: Value = match response.json().await {
        Ok(body) => body,
        Err(e) if e.is_timeout() => return FetchError::Hung,
        Err(_) => return FetchError::Bad(format!("HTTP {status} without a JSON error body")),
    };
    let formatted = body["error"]["code"].is_string();
    let clean = (status == 429 || status >= 500)
        && formatted
        && (retry_after || !matches!(status, 429 | 503));
    if clean {
        FetchError::Clean(status)
    } else {
        FetchError::Bad(format!("HTTP {status}: {body}"))
    }
}

async fn fetch(
    http: &reqwest::Client,
    base: &str,
    route: &str,
    vm: &Vm,
    nonce: &str,
    keys: &Keyring,
    payload_bytes: &AtomicU64,
) -> Result<(), FetchError> {
    let response = http
        .get(format!("{base}{route}/{}", vm.id))
        .header("X-exc-imds-token", &vm.imds)
        .bearer_auth(&vm.bearer)
        .header("X-Exk8s-Nonce", nonce)
        .send()
        .await
        .map_err(transport)?;
    if response.status().as_u16() != 200 {
        return Err(refusal(response).await);
    }
    let body = response.bytes().await.map_err(transport)?;
    let bundle = verify(&body, keys).map_err(|e| FetchError::Bad(e.to_string()))?;
    let p = bundle.payload();
    if p.identity.vm_id != vm.id as u64 || p.freshness.nonce.as_str() != nonce {
        return Err(FetchError::Bad("a bundle for another VM or request".into()));
    }
    if payload_bytes.load(Ordering::Relaxed) == 0 {
        // The first bundle's payload size (its base64 in the envelope, three bytes per four).
        let envelope: Value = serde_json::from_slice(&body).unwrap_or_default();
        let encoded = envelope["payload"].as_str().map_or(0, str::len);
        payload_bytes.store(encoded as u64 * 3 / 4, Ordering::Relaxed);
    }
    Ok(())
}

/// Reports how long the key pool took to fill, once it is full.
pub(crate) async fn await_key_pool(
    http: &reqwest::Client,
    base: &str,
    what: &str,
) -> Result<(), String> {
    let waited = key_pool_filled(http, base).await?;
    eprintln!(
        "exk8s-loadgen: {what}: the key pool was full {waited:.1} s after the last VM was recorded"
    );
    Ok(())
}

/// One algorithm's fetches over its clusters' VMs.
pub(crate) struct FetchSet {
    pub(crate) algorithm: String,
    pub(crate) vms: Vec<Vm>,
    pub(crate) total: usize,
    /// The first bundle's payload size, once one was fetched.
    pub(crate) payload_bytes: Arc<AtomicU64>,
    /// The bundle route, before `/{vm_id}`.
    pub(crate) route: String,
}

impl FetchSet {
    /// Plays the fetches, at most `concurrency` in flight, each VM in turn.
    pub(crate) async fn play(
        self,
        http: &reqwest::Client,
        base: &str,
        keys: &Arc<Keyring>,
        concurrency: usize,
    ) -> Result<Summary, String> {
        let algorithm = self.algorithm;
        if self.vms.is_empty() && self.total > 0 {
            return Err(format!(
                "no {algorithm} VM to fetch from: every founding failed"
            ));
        }
        let vms = Arc::new(self.vms);
        let route: Arc<str> = self.route.into();
        let (latencies, failed, elapsed) = drive(self.total, concurrency, |i| {
            let (http, base, route, vms, keys, size) = (
                http.clone(),
                base.to_owned(),
                Arc::clone(&route),
                Arc::clone(&vms),
                Arc::clone(keys),
                Arc::clone(&self.payload_bytes),
            );
            async move {
                let vm = &vms[i % vms.len()];
                let nonce = format!("loadgen-nonce-{i:016}");
                fetch(&http, &base, &route, vm, &nonce, &keys, &size).await
            }
        })
        .await?;
        if let Some(e) = failed.iter().find(|e| !matches!(e, FetchError::Clean(_))) {
            eprintln!("exk8s-loadgen: first hung or bad fetch for {algorithm}: {e}");
        } else if let Some(e) = failed.first() {
            eprintln!("exk8s-loadgen: first failed fetch for {algorithm}: {e}");
        }
        Ok(summarise(
            format!("fetch {algorithm} c={concurrency}"),
            latencies,
            &failed,
            elapsed,
        ))
    }
}

/// Plays `total` requests made by `request(i)`, at most `concurrency` in flight: each one's
/// latency when it succeeded, the failures, and how long all took.
pub(crate) async fn drive<F, R>(
    total: usize,
    concurrency: usize,
    request: F,
) -> Result<(Vec<Duration>, Vec<FetchError>, Duration), String>
where
    F: Fn(usize) -> R,
    R: Future<Output = Result<(), FetchError>> + Send + 'static,
{
    let gate = Arc::new(Semaphore::new(concurrency));
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for i in 0..total {
        let permit = Arc::clone(&gate)
            .acquire_owned()
            .await
            .map_err(|e| e.to_string())?;
        let one = request(i);
        tasks.spawn(async move {
            let t = Instant::now();
            let result = one.await;
            drop(permit);
            (t.elapsed(), result)
        });
    }
    let mut latencies = Vec::new();
    let mut failed: Vec<FetchError> = Vec::new();
    while let Some(done) = tasks.join_next().await {
        let (elapsed, result) = done.map_err(|e| e.to_string())?;
        match result {
            Ok(()) => latencies.push(elapsed),
            Err(e) => failed.push(e),
        }
    }
    Ok((latencies, failed, started.elapsed()))
}
