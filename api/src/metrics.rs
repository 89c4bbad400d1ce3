//! Prometheus metrics, kept by hand (a few counters, one histogram and one gauge need no
//! framework): requests by route and status with latency, clusters founded and failed,
//! compensations, and each cluster's soonest certificate expiry.

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

/// A request series' labels: the method from a fixed set, the route template the router matched
/// (never the raw path) and the status the API answered. Each part is bounded by the API itself,
/// so no client can add series: the exposition's size does not depend on what clients send.
type RequestLabels = (&'static str, String, u16);

#[derive(Debug, Default)]
pub struct Metrics {
    requests: Mutex<BTreeMap<RequestLabels, Series>>,
    pub clusters_founded: Counter,
    pub clusters_failed: Counter,
    pub compensations: Counter,
    pub bundles_issued: Counter,
    /// Leaf keys bundles took from the key pool, and keys they had to make themselves.
    pub bundle_keys_pooled: Counter,
    pub bundle_keys_fresh: Counter,
    /// cluster id → the soonest `notAfter` (unix seconds) among its certificates.
    soonest_expiry: Mutex<BTreeMap<i64, SoonestExpiry>>,
}

/// A cluster's soonest certificate expiries (unix seconds), what its nodes run apart from the
/// operator credentials it minted: no node runs an operator's kubeconfig, so its expiry must not
/// hold the nodes' gauge in the past (an alert on it would never clear).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SoonestExpiry {
    /// Among the certificates the cluster's nodes run.
    pub nodes: Option<i64>,
    /// Among the operator credentials (the latest operator kubeconfig).
    pub operator: Option<i64>,
}

impl Metrics {
    /// Counts one request. `method` comes from a fixed set (`http::method_label`), `route` is the
    /// route template the router matched or `unmatched`.
    pub fn observe(&self, method: &'static str, route: &str, status: u16, seconds: f64) {
        let mut requests = self
            .requests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let series = requests
            .entry((method, route.to_owned(), status))
            .or_default();
        series.count += 1;
        series.sum += seconds;
        for (bucket, bound) in series.buckets.iter_mut().zip(BUCKETS) {
            if seconds <= bound {
                *bucket += 1;
            }
        }
    }

    /// Counts one bundle's `total` leaf keys, `fresh` of them made on the request's time.
    pub fn count_bundle_keys(&self, total: usize, fresh: usize) {
        let pooled = total.saturating_sub(fresh) as u64;
        self.bundle_keys_pooled
            .0
            .fetch_add(pooled, Ordering::Relaxed);
        self.bundle_keys_fresh
            .0
            .fetch_add(fresh as u64, Ordering::Relaxed);
    }

    /// Records a cluster's soonest certificate expiry (the inventory and the renewal pass do).
    pub fn set_soonest_expiry(&self, cluster_id: i64, soonest: SoonestExpiry) {
        self.soonest_expiry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(cluster_id, soonest);
    }

    /// The clusters that have gauges now.
    pub fn clusters_with_gauges(&self) -> std::collections::BTreeSet<i64> {
        self.soonest_expiry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .keys()
            .copied()
            .collect()
    }

    /// Forgets the gauges of `clusters` (deleted: they have no certificates to expire, and
    /// their series would stay forever).
    pub fn forget_clusters<'a>(&self, clusters: impl IntoIterator<Item = &'a i64>) {
        let mut gauges = self
            .soonest_expiry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for id in clusters {
            gauges.remove(id);
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
            (
                "exk8s_bundle_keys_pooled_total",
                "Bundles' leaf keys taken from the key pool (made ahead of demand).",
                &self.bundle_keys_pooled,
            ),
            (
                "exk8s_bundle_keys_fresh_total",
                "Bundles' leaf keys made while their request waited.",
                &self.bundle_keys_fresh,
            ),
        ] {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                counter.get()
            );
        }
        let soonest = self
            .soonest_expiry
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        for (name, help, pick) in [
            (
                "exk8s_cluster_certificate_soonest_expiry_timestamp_seconds",
                "The soonest notAfter among the certificates a cluster's nodes run (unix seconds).",
                (|s: &SoonestExpiry| s.nodes) as fn(&SoonestExpiry) -> Option<i64>,
            ),
            (
                "exk8s_cluster_operator_credential_soonest_expiry_timestamp_seconds",
                "The notAfter of a cluster's latest operator kubeconfig certificate (unix seconds).",
                |s: &SoonestExpiry| s.operator,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for (cluster_id, value) in soonest.iter().filter_map(|(id, s)| Some((id, pick(s)?))) {
                let _ = writeln!(out, "{name}{{cluster_id=\"{cluster_id}\"}} {value}");
            }
        }
        out
    }
}

/// The key pool's gauges and counter, appended to the exposition.
pub fn render_key_pool(out: &mut String, stats: crate::keypool::PoolStats) {
    for (name, kind, help, value) in [
        (
            "exk8s_key_pool_ready_keys",
            "gauge",
            "RSA leaf keys made ahead and waiting.",
            stats.ready as u64,
        ),
        (
            "exk8s_key_pool_wanted_keys",
            "gauge",
            "RSA leaf keys the clusters' pending bundles will take.",
            stats.wanted as u64,
        ),
        (
            "exk8s_key_pool_made_total",
            "counter",
            "RSA leaf keys the key pool has made.",
            stats.made,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    }
}

/// The metrics' reference page, generated from the exposition itself: every family's name,
/// type, labels and help, as `/metrics` serves them.
#[cfg(test)]
mod reference {
    use std::collections::BTreeMap;

    use super::*;

    /// `(type, help, label names)` of each family in a Prometheus text exposition, in order.
    fn families(text: &str) -> Vec<(String, String, String, Vec<String>)> {
        let mut families: Vec<(String, String, String, Vec<String>)> = Vec::new();
        let mut index = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap();
                index.insert(name.to_owned(), families.len());
                families.push((name.to_owned(), String::new(), help.to_owned(), Vec::new()));
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                families[index[name]].1 = kind.to_owned();
            } else if let Some((series, _)) = line.split_once('{') {
                let base = ["_bucket", "_sum", "_count"]
                    .iter()
                    .find_map(|s| series.strip_suffix(s).filter(|b| index.contains_key(*b)))
                    .unwrap_or(series);
                let labels = &mut families[index[base]].3;
                let inside = line[series.len() + 1..].split('}').next().unwrap();
                for pair in inside.split(',') {
                    let label = pair.split('=').next().unwrap().to_owned();
                    if label != "le" && !labels.contains(&label) {
                        labels.push(label);
                    }
                }
            }
        }
        families
    }

    fn page() -> String {
        let metrics = Metrics::default();
        metrics.observe("GET", "/clusters", 200, 0.01);
        metrics.set_soonest_expiry(
            1,
            SoonestExpiry {
                nodes: Some(1),
                operator: Some(1),
            },
        );
        let mut text = metrics.render();
        render_key_pool(&mut text, crate::keypool::PoolStats::default());
        let mut page = String::from(
            "# Metrics reference\n\n\
             What `exk8s-api` serves at `/metrics` (Prometheus text format), generated from the \
             exposition itself (`cargo test -p exk8s-api --lib metrics` checks it is current; \
             `EXK8S_BLESS=1` rewrites it). Every label's values are bounded by the API: a \
             request's route is the template the router matched, never the raw path. Alert \
             rules that use them: [Monitoring](../monitoring.md).\n\n\
             | metric | type | labels | meaning |\n|---|---|---|---|\n",
        );
        for (name, kind, help, labels) in families(&text) {
            let labels = labels
                .iter()
                .map(|l| format!("`{l}`"))
                .collect::<Vec<_>>()
                .join(", ");
            page.push_str(&format!("| `{name}` | {kind} | {labels} | {help} |\n"));
        }
        page
    }

    #[test]
    fn the_metrics_reference_is_current() {
        let page = page();
        assert!(
            page.contains(
                "| `exk8s_http_requests_total` | counter | `method`, `route`, `status` |"
            ),
            "{page}"
        );
        let kept = exk8s_cli_reference::keep(
            env!("CARGO_MANIFEST_DIR"),
            "docs/reference/metrics.md",
            &page,
        );
        assert_eq!(kept, Ok(()));
    }
}
