//! `exk8s clusters create --wait`: follows the cluster until it is ready, a line (or, on a
//! terminal, a progress bar) per node showing the phase its agent last reported, and stops
//! with the reason when founding fails or the time is up. It polls `GET /clusters/{id}`.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::Value;

use crate::client::Api;
use crate::error::CliError;

/// How often the cluster is read.
const EVERY: Duration = Duration::from_secs(2);

/// The boot phases an agent reports, in order: a node's bar moves along them.
const PHASES: [&str; 9] = [
    "pending",
    "fetch",
    "verify",
    "files",
    "prereqs",
    "services",
    "etcd",
    "apiserver",
    "addons",
];

/// Where a node stands, from its phase text (`etcd`, `etcd:started`, `complete`, …).
fn position(phase: &str) -> u64 {
    let name = phase.split(':').next().unwrap_or(phase);
    if matches!(name, "complete" | "sync") {
        return PHASES.len() as u64;
    }
    PHASES.iter().position(|p| *p == name).unwrap_or(0) as u64
}

/// Shows progress on a terminal, or plain lines on stderr when there is none.
enum Display {
    Bars {
        all: MultiProgress,
        cluster: ProgressBar,
        nodes: BTreeMap<String, ProgressBar>,
    },
    Lines {
        seen: BTreeMap<String, String>,
    },
}

impl Display {
    fn new() -> Self {
        if !std::io::stderr().is_terminal() {
            return Self::Lines {
                seen: BTreeMap::new(),
            };
        }
        let all = MultiProgress::new();
        let cluster = all.add(ProgressBar::new_spinner());
        cluster.enable_steady_tick(Duration::from_millis(120));
        Self::Bars {
            all,
            cluster,
            nodes: BTreeMap::new(),
        }
    }

    fn cluster(&mut self, text: String) {
        match self {
            Self::Bars { cluster, .. } => cluster.set_message(text),
            Self::Lines { seen } => changed(seen, "cluster", text),
        }
    }

    fn node(&mut self, name: &str, phase: &str) {
        match self {
            Self::Bars { all, nodes, .. } => {
                let bar = nodes.entry(name.to_owned()).or_insert_with(|| {
                    let bar = all.add(ProgressBar::new(PHASES.len() as u64));
                    let style = ProgressStyle::with_template("  {prefix:<28} [{bar:24}] {msg}")
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> ");
                    bar.set_style(style);
                    bar.set_prefix(name.to_owned());
                    bar
                });
                bar.set_position(position(phase));
                bar.set_message(phase.to_owned());
            }
            Self::Lines { seen } => changed(seen, &format!("node {name}"), phase.to_owned()),
        }
    }

    fn finish(&self) {
        if let Self::Bars { cluster, nodes, .. } = self {
            for bar in nodes.values() {
                bar.finish();
            }
            cluster.finish();
        }
    }
}

fn changed(seen: &mut BTreeMap<String, String>, what: &str, now: String) {
    if seen.get(what) != Some(&now) {
        eprintln!("{what}: {now}");
        seen.insert(what.to_owned(), now);
    }
}

/// Waits until cluster `id` is ready; its last view.
pub(crate) fn until_ready(api: &Api, id: i64, timeout: Duration) -> Result<Value, CliError> {
    let start = Instant::now();
    let mut display = Display::new();
    let result = loop {
        let view = api.get(&format!("/clusters/{id}"))?;
        let phase = view["phase"].as_str().unwrap_or("unknown").to_owned();
        let nodes = view["nodes"].as_array().cloned().unwrap_or_default();
        let done = nodes
            .iter()
            .filter(|n| position(n["phase"].as_str().unwrap_or("")) == PHASES.len() as u64)
            .count();
        display.cluster(format!(
            "cluster {}: {phase}, {done}/{} nodes up",
            view["name"].as_str().unwrap_or("?"),
            nodes.len()
        ));
        for node in &nodes {
            display.node(
                node["name"].as_str().unwrap_or("?"),
                node["phase"].as_str().unwrap_or("pending"),
            );
        }
        if view["ready"] == true {
            break Ok(view);
        }
        if matches!(phase.as_str(), "failed" | "compensating" | "deleting") {
            let why = view["error_message"]
                .as_str()
                .or(view["error_reason"].as_str())
                .unwrap_or("no reason recorded");
            break Err(CliError::Failed(format!("cluster {id} is {phase}: {why}")));
        }
        if let Some(failed) = nodes
            .iter()
            .find(|n| n["phase"].as_str().is_some_and(|p| p.ends_with(":failed")))
        {
            break Err(CliError::Failed(format!(
                "node {} reported {}; `exk8s nodes {id}` shows every node",
                failed["name"].as_str().unwrap_or("?"),
                failed["phase"].as_str().unwrap_or("?")
            )));
        }
        if start.elapsed() >= timeout {
            break Err(CliError::Failed(format!(
                "cluster {id} was not ready after {}s (phase {phase}, {done}/{} nodes up); \
                 it goes on in the background: `exk8s clusters get {id}`",
                timeout.as_secs(),
                nodes.len()
            )));
        }
        std::thread::sleep(EVERY);
    };
    display.finish();
    result
}
