//! A control plane's availability sampled while it changes, from a client namespace on its LAN:
//! every 200 ms, each apiserver in service answers `/readyz` and `GET /api` with the operator
//! kubeconfig sent to it, and `GET /api` goes through the control-plane name (whichever
//! apiserver the name leads to). The change under test says which node it is changing (being
//! restarted, joining or leaving) and which nodes are in service; [`check`] then allows a node to
//! fail only while it is the one changing (while its change overlapped its probes: one sample may
//! span the end of one node's restart and the start of the next), so never two at once, and the
//! name only while some node changes (the name lists every node with no health check; see docs/development.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::control_plane::kubectl;
use crate::netns::Lan;

/// How often the sampler samples.
pub const EVERY: Duration = Duration::from_millis(200);

/// One node's answers in a sample.
#[derive(Debug, Clone)]
pub struct NodeSample {
    /// The node's index in the LAN.
    pub node: usize,
    /// Whether the node's change overlapped its probes.
    pub changing: bool,
    /// `/readyz`: what it said when it did not answer 200 (the failing checks, or curl's error).
    pub ready: Result<(), String>,
    pub api: Result<(), String>,
}

/// One sample.
#[derive(Debug, Clone)]
pub struct Sample {
    pub at: Duration,
    pub step: String,
    /// The nodes seen changing while the sample was taken.
    pub changing: Vec<usize>,
    pub nodes: Vec<NodeSample>,
    pub by_name: Result<(), String>,
    /// Whether any node's change overlapped the probe through the name.
    pub by_name_during_change: bool,
}

impl Sample {
    /// Whether a node failed while it was not the one changing, or the name failed while no
    /// node changed.
    pub fn failed(&self) -> bool {
        let node_failed = self
            .nodes
            .iter()
            .any(|n| !n.changing && (n.ready.is_err() || n.api.is_err()));
        node_failed || (self.by_name.is_err() && !self.by_name_during_change)
    }
}

/// What the sampler reads and the change writes.
pub struct Shared {
    /// The nodes in service (LAN index, address); sampled in this order.
    pub serving: Mutex<Vec<(usize, String)>>,
    /// The node being changed now, if any.
    /// Each change so far: the node, when it began and, once over, when it ended.
    changes: Mutex<Vec<(usize, Instant, Option<Instant>)>>,
    /// The operator kubeconfig the sampler uses.
    pub operator_config: Mutex<PathBuf>,
    pub step: Mutex<String>,
    stop: AtomicBool,
    samples: Mutex<Vec<Sample>>,
}

impl Shared {
    pub fn new(serving: Vec<(usize, String)>, operator_config: PathBuf) -> Self {
        Self {
            serving: Mutex::new(serving),
            changes: Mutex::new(Vec::new()),
            operator_config: Mutex::new(operator_config),
            step: Mutex::new("start".into()),
            stop: AtomicBool::new(false),
            samples: Mutex::new(Vec::new()),
        }
    }

    pub fn step(&self, what: &str) {
        *self.step.lock().unwrap() = what.to_owned();
    }

    /// `Some(node)`: that node's change begins (ending any other); `None`: the change ends.
    pub fn set_changing(&self, node: Option<usize>) {
        self.record(node, Instant::now());
    }

    fn record(&self, node: Option<usize>, now: Instant) {
        let mut changes = self.changes.lock().unwrap();
        if let Some(open) = changes.last_mut().filter(|c| c.2.is_none()) {
            open.2 = Some(now);
        }
        if let Some(node) = node {
            changes.push((node, now, None));
        }
    }

    /// The nodes whose change overlapped `[from, to]`.
    fn changed_between(&self, from: Instant, to: Instant) -> Vec<usize> {
        let changes = self.changes.lock().unwrap();
        let mut nodes: Vec<usize> = changes
            .iter()
            .filter(|(_, began, ended)| *began <= to && ended.is_none_or(|e| e >= from))
            .map(|(node, _, _)| *node)
            .collect();
        nodes.dedup();
        nodes
    }
}

/// `kubectl get --raw /api` from the `client` namespace with `config`, `server` flags added.
/// A kubectl that failed without a word (killed, or never ran in the namespace) saw no
/// apiserver at all — an apiserver that does not answer makes it say why — so it is asked once
/// more, said on stderr; only a second silent failure counts against the apiservers.
pub fn get_api(lan: &Lan, client: usize, config: &Path, server: &[String]) -> Result<(), String> {
    let mut args: Vec<&str> = server.iter().map(String::as_str).collect();
    args.extend(["get", "--raw", "/api"]);
    let ask = || {
        let (ok, out, err) = kubectl(lan, client, config, &args);
        if ok && out.contains("APIVersions") {
            Ok(())
        } else if out.is_empty() && err.is_empty() {
            Err(format!("kubectl said nothing (ok: {ok})"))
        } else {
            Err(format!("{out}{err}"))
        }
    };
    match ask() {
        Err(silent) if silent.starts_with("kubectl said nothing") => {
            let again = ask();
            eprintln!("availability: {silent} from {client} {server:?}; asked again: {again:?}");
            again
        }
        answered => answered,
    }
}

fn sample(lan: &Lan, client: usize, dns_name: &str, shared: &Shared, started: Instant) -> Sample {
    let began = Instant::now();
    let config = shared.operator_config.lock().unwrap().clone();
    let serving = shared.serving.lock().unwrap().clone();
    let nodes = serving
        .iter()
        .map(|(node, ip)| {
            let from = Instant::now();
            let out = lan
                .command(client, "curl")
                .args(["-sSk", "-w", "\n%{http_code}", "--max-time", "2"])
                .arg(format!("https://{ip}:6443/readyz?verbose"))
                .output()
                .unwrap();
            let said = String::from_utf8_lossy(&out.stdout);
            let ready = match said.rsplit_once('\n') {
                Some((_, "200")) => Ok(()),
                _ if said.is_empty() && out.stderr.is_empty() => {
                    Err(format!("curl said nothing ({})", out.status))
                }
                _ => Err(format!(
                    "{}{}",
                    said.lines()
                        .filter(|l| l.starts_with("[-]") || !l.starts_with('['))
                        .collect::<Vec<_>>()
                        .join("\n"),
                    String::from_utf8_lossy(&out.stderr)
                )),
            };
            let server = [
                format!("--server=https://{ip}:6443"),
                format!("--tls-server-name={dns_name}"),
            ];
            let api = get_api(lan, client, &config, &server);
            NodeSample {
                node: *node,
                changing: shared.changed_between(from, Instant::now()).contains(node),
                ready,
                api,
            }
        })
        .collect();
    let from = Instant::now();
    let by_name = get_api(lan, client, &config, &[]);
    let by_name_during_change = !shared.changed_between(from, Instant::now()).is_empty();
    Sample {
        at: started.elapsed(),
        step: shared.step.lock().unwrap().clone(),
        changing: shared.changed_between(began, Instant::now()),
        nodes,
        by_name,
        by_name_during_change,
    }
}

/// Runs `change` while sampling from node `client` of `lan`; the samples.
pub fn sample_during(
    lan: &Lan,
    client: usize,
    dns_name: &str,
    shared: &Shared,
    change: impl FnOnce(),
) -> Vec<Sample> {
    let started = Instant::now();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !shared.stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let s = sample(lan, client, dns_name, shared, started);
                shared.samples.lock().unwrap().push(s);
                std::thread::sleep(EVERY.saturating_sub(t.elapsed()));
            }
        });
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(change));
        shared.stop.store(true, Ordering::Relaxed);
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    });
    std::mem::take(&mut *shared.samples.lock().unwrap())
}

/// Panics unless every sample kept every apiserver in service but the one changing ready and
/// serving, and the name answered while no node changed; more than `min_samples` samples must
/// have been taken, more than `min_changing` of them during changes (a loaded machine samples
/// less often than every 200 ms: each sample waits for its kubectl calls). A summary line.
pub fn check(samples: &[Sample], min_samples: usize, min_changing: usize) -> String {
    assert!(
        samples.len() > min_samples,
        "only {} samples",
        samples.len()
    );
    let mut failures = Vec::new();
    let mut by_name_during_changes = 0;
    for s in samples {
        if s.by_name.is_err() && s.by_name_during_change {
            by_name_during_changes += 1;
        }
        if s.failed() {
            failures.push(s.clone());
        }
    }
    let mut per_step = BTreeMap::<&str, usize>::new();
    for s in &failures {
        *per_step.entry(s.step.as_str()).or_default() += 1;
    }
    assert!(
        failures.is_empty(),
        "{} of {} samples failed ({per_step:?}), first: {:#?}",
        failures.len(),
        samples.len(),
        &failures[..failures.len().min(5)]
    );
    let changing = samples.iter().filter(|s| !s.changing.is_empty()).count();
    assert!(
        changing > min_changing,
        "only {changing} samples during changes"
    );
    format!(
        "{} samples over {:.0} s ({changing} during a change): every apiserver in service but \
         the one changing ready and serving the operator in each; through the name, \
         {by_name_during_changes} failed while a node changed",
        samples.len(),
        samples.last().map_or(0.0, |s| s.at.as_secs_f64())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_counts_for_the_probes_it_overlaps_and_no_other() {
        let shared = Shared::new(Vec::new(), PathBuf::new());
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        shared.record(Some(1), at(1_000));
        shared.record(None, at(3_000));
        shared.record(Some(2), at(3_500));
        assert!(shared.changed_between(at(0), at(500)).is_empty());
        assert_eq!(shared.changed_between(at(2_000), at(2_500)), [1]);
        assert_eq!(shared.changed_between(at(2_900), at(3_600)), [1, 2]);
        assert!(shared.changed_between(at(3_100), at(3_200)).is_empty());
        // A change not yet over overlaps everything after its start.
        assert_eq!(shared.changed_between(at(10_000), at(11_000)), [2]);
        shared.record(Some(0), at(12_000));
        assert_eq!(shared.changed_between(at(11_000), at(13_000)), [2, 0]);
    }

    fn sample(nodes: &[(usize, bool, bool)], by_name: (bool, bool)) -> Sample {
        let down = |ok: bool| if ok { Ok(()) } else { Err("down".into()) };
        Sample {
            at: Duration::ZERO,
            step: "test".into(),
            changing: Vec::new(),
            nodes: nodes
                .iter()
                .map(|&(node, changing, up)| NodeSample {
                    node,
                    changing,
                    ready: down(up),
                    api: Ok(()),
                })
                .collect(),
            by_name: down(by_name.0),
            by_name_during_change: by_name.1,
        }
    }

    #[test]
    fn only_the_node_changing_may_fail_and_the_name_only_during_a_change() {
        assert!(!sample(&[(0, false, true), (1, true, false)], (true, true)).failed());
        assert!(sample(&[(0, false, false), (1, true, false)], (true, true)).failed());
        assert!(sample(&[(0, false, false)], (true, false)).failed());
        assert!(!sample(&[(0, true, false)], (false, true)).failed());
        assert!(sample(&[(0, false, true)], (false, false)).failed());
    }
}
