//! Prometheus metrics, kept by hand (a few counters and one histogram need no framework):
//! requests by route and status with latency, clusters founded and failed, compensations.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

/// Latency buckets, seconds.
const BUCKETS: [f64; 10] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0];

#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn inc(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

#[derive(Debug, Default, Clone)]
struct Series {
    count: u64,
    sum: f64,
    buckets: [u64; BUCKETS.len()],
}

#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<(String, String, u16), Series>>,
    pub clusters_founded: Counter,
    pub clusters_failed: Counter,
    pub compensations: Counter,
    pub bundles_issued: Counter,
}

impl Metrics {
    pub fn observe(&self, method: &str, route: &str, status: u16, seconds: f64) {
        let mut requests = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let series = requests
            .entry((method.to_owned(), route.to_owned(), status))
            .or_default();
        series.count += 1;
        series.sum += seconds;
        for (bucket, bound) in series.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let requests = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let _ = writeln!(
            out,
            "# HELP exk8s_http_requests_total HTTP requests by route and status."
        );
        let _ = writeln!(out, "# TYPE exk8s_http_requests_total counter");
        for ((method, route, status), s) in &requests {
            let _ = writeln!(
                out,
                "exk8s_http_requests_total{{method=\"{method}\",route=\"{route}\",status=\"{status}\"}} {}",
                s.count
            );
        }
        let _ = writeln!(
            out,
            "# HELP exk8s_http_request_duration_seconds HTTP request latency."
        );
        let _ = writeln!(out, "# TYPE exk8s_http_request_duration_seconds histogram");
        for ((method, route, status), s) in &requests {
            let labels = format!("method=\"{method}\",route=\"{route}\",status=\"{status}\"");
            for (bound, count) in BUCKETS.iter().zip(s.buckets) {
                let _ = writeln!(
                    out,
                    "exk8s_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {count}"
                );
            }
            let _ = writeln!(
                out,
                "exk8s_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}",
                s.count
            );
            let _ = writeln!(
                out,
                "exk8s_http_request_duration_seconds_sum{{{labels}}} {}",
                s.sum
            );
            let _ = writeln!(
                out,
                "exk8s_http_request_duration_seconds_count{{{labels}}} {}",
                s.count
            );
        }
        for (name, help, counter) in [
            (
                "exk8s_clusters_founded_total",
                "Clusters founded.",
                &self.clusters_founded,
            ),
            (
                "exk8s_clusters_failed_total",
                "Foundings that failed.",
                &self.clusters_failed,
            ),
            (
                "exk8s_compensations_total",
                "Failed or abandoned foundings whose resources were released.",
                &self.compensations,
            ),
            (
                "exk8s_bundles_issued_total",
                "Bootstrap bundles issued.",
                &self.bundles_issued,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                counter.get()
            );
        }
        out
    }
}
