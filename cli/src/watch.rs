//! `exk8s clusters create --wait`: follows the cluster until it is ready, a line (or, on a
//! terminal, a progress bar) per node showing the phase its agent last reported, and stops
//! with the reason when founding fails or the time is up. It reads the cluster's event stream
//! (`GET /clusters/{id}/events`), reopened after its last event when it drops.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::time::{Duration, Instant};

use exk8s_api_types::{ChangeEvent, ClusterView, StatusEvent};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::client::Api;
use crate::error::CliError;

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

/// What a follow waits for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Goal {
    /// The cluster is ready.
    Ready,
    /// Every control-plane member runs this Kubernetes version and nothing rolls out.
    Runs(String),
}

/// Waits until cluster `id` is ready, following its event stream (resumed with its last event
/// id when it drops); its last view.
pub(crate) fn until_ready(api: &Api, id: i64, timeout: Duration) -> Result<ClusterView, CliError> {
    until(api, id, Goal::Ready, timeout)
}

/// Waits until cluster `id` reaches `goal`, following its event stream; its last view.
pub(crate) fn until(
    api: &Api,
    id: i64,
    goal: Goal,
    timeout: Duration,
) -> Result<ClusterView, CliError> {
    let mut display = Display::new();
    let mut follow = Follow {
        api,
        id,
        goal,
        deadline: Instant::now() + timeout,
        timeout,
        name: String::new(),
        names: BTreeMap::new(),
        phases: BTreeMap::new(),
        phase: "provisioning".into(),
        last: None,
    };
    follow.learn_names()?;
    let result = follow.run(&mut display);
    display.finish();
    result
}

/// Times a dropped stream is reopened in a row before giving up.
const REOPENS: u32 = 5;

struct Follow<'a> {
    api: &'a Api,
    id: i64,
    goal: Goal,
    deadline: Instant,
    timeout: Duration,
    name: String,
    /// Node names by VM id, from the cluster's view.
    names: BTreeMap<i64, String>,
    /// Each node's last phase, by VM id.
    phases: BTreeMap<i64, String>,
    phase: String,
    last: Option<i64>,
}

impl Follow<'_> {
    fn run(&mut self, display: &mut Display) -> Result<ClusterView, CliError> {
        let path = format!("/clusters/{}/events", self.id);
        let mut reopened = 0;
        loop {
            let body = match self.api.events(&path, self.last) {
                Ok(body) => body,
                Err(e @ CliError::Unreachable { .. }) if reopened < REOPENS => {
                    reopened += 1;
                    eprintln!("the event stream is out of reach ({e}); retrying");
                    std::thread::sleep(Duration::from_secs(2));
                    continue;
                }
                Err(e) => return Err(e),
            };
            for block in crate::sse::Events::new(std::io::BufReader::new(body)) {
                self.check_time()?;
                let Ok(block) = block else { break };
                if let crate::sse::Block::Event(event) = block {
                    if let Some(view) = self.apply(event, display)? {
                        return Ok(view);
                    }
                }
                reopened = 0;
            }
            self.check_time()?;
            reopened += 1;
            if reopened > REOPENS {
                return Err(CliError::Failed(format!(
                    "the event stream of cluster {} keeps dropping; `exk8s clusters get {}` \
                     shows where it stands",
                    self.id, self.id
                )));
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }

    fn check_time(&self) -> Result<(), CliError> {
        if Instant::now() < self.deadline {
            return Ok(());
        }
        let up = self
            .phases
            .values()
            .filter(|p| position(p) == PHASES.len() as u64);
        if let Goal::Runs(version) = &self.goal {
            return Err(CliError::Failed(format!(
                "cluster {} did not run {version} everywhere after {}s; it goes on in the \
                 background: `exk8s clusters get {}`",
                self.id,
                self.timeout.as_secs(),
                self.id
            )));
        }
        Err(CliError::Failed(format!(
            "cluster {} was not ready after {}s (phase {}, {}/{} nodes up); it goes on in the \
             background: `exk8s clusters get {}`",
            self.id,
            self.timeout.as_secs(),
            self.phase,
            up.count(),
            self.phases.len(),
            self.id
        )))
    }

    /// The cluster's name and its nodes' names.
    fn learn_names(&mut self) -> Result<(), CliError> {
        let view: ClusterView = self.api.get(&format!("/clusters/{}", self.id))?;
        self.name = view.name;
        for node in view.nodes {
            self.names.insert(node.vm_id, node.name);
        }
        Ok(())
    }

    /// Shows one event; the cluster's view once it is ready, an error when it failed.
    fn apply(
        &mut self,
        event: crate::sse::Event,
        display: &mut Display,
    ) -> Result<Option<ClusterView>, CliError> {
        if event.data.is_empty() {
            return Ok(None);
        }
        if let Ok(id) = event.last_id.parse() {
            self.last = Some(id);
        }
        let unreadable = |e: serde_json::Error| {
            CliError::Unexpected(format!("an event the CLI cannot read ({e})"))
        };
        match event.kind.as_str() {
            "cluster" => {
                let change: ChangeEvent = serde_json::from_str(&event.data).map_err(unreadable)?;
                self.phase = change.phase;
                if matches!(self.phase.as_str(), "failed" | "compensating" | "deleting") {
                    let why = [change.message, change.error_reason]
                        .into_iter()
                        .flatten()
                        .find(|t| !t.is_empty())
                        .unwrap_or_else(|| "no reason recorded".into());
                    return Err(CliError::Failed(format!(
                        "cluster {} is {}: {why}",
                        self.id, self.phase
                    )));
                }
            }
            // An upgrade's progress is the status event's `RollingOut`: the stream replays the
            // cluster's history, whose old reports are not this upgrade's.
            "node" | "report" if self.goal != Goal::Ready => {}
            "node" | "report" => {
                let change: ChangeEvent = serde_json::from_str(&event.data).map_err(unreadable)?;
                let Some(vm) = change.vm_id else {
                    return Ok(None);
                };
                if !self.names.contains_key(&vm) {
                    self.learn_names()?;
                }
                let name = self
                    .names
                    .get(&vm)
                    .cloned()
                    .unwrap_or_else(|| format!("vm {vm}"));
                let phase = change.phase;
                display.node(&name, &phase);
                if phase.ends_with(":failed") {
                    let said = change.message.unwrap_or_default();
                    return Err(CliError::Failed(format!(
                        "node {name} reported {phase}{}; `exk8s nodes {}` shows every node",
                        if said.is_empty() {
                            String::new()
                        } else {
                            format!(": {said}")
                        },
                        self.id
                    )));
                }
                self.phases.insert(vm, phase);
            }
            "status" => {
                let status: StatusEvent = serde_json::from_str(&event.data).map_err(unreadable)?;
                self.phase = status.phase.to_string();
                let rolling = status
                    .conditions
                    .iter()
                    .find(|c| c.type_ == "RollingOut" && c.status == "True");
                let reached = match &self.goal {
                    Goal::Ready => {
                        display.cluster(format!(
                            "cluster {}: {}, {}/{} control-plane nodes ready",
                            self.name, self.phase, status.ready_replicas, status.replicas
                        ));
                        status.ready
                    }
                    Goal::Runs(version) => {
                        display.cluster(format!(
                            "cluster {}: runs {}, {}/{} control-plane members up to date{}",
                            self.name,
                            status.version,
                            status.up_to_date_replicas,
                            status.replicas,
                            rolling.map_or(String::new(), |c| format!(
                                "\n  {}",
                                c.message.replace('\n', "\n  ")
                            ))
                        ));
                        if let Some(stopped) = rolling
                            .and_then(|c| c.message.lines().find(|l| l.starts_with("* stopped:")))
                        {
                            return Err(CliError::Failed(format!(
                                "the upgrade of cluster {} to {version} {}",
                                self.name,
                                stopped.trim_start_matches("* ")
                            )));
                        }
                        status.version == *version && rolling.is_none()
                    }
                };
                if reached {
                    return self.api.get(&format!("/clusters/{}", self.id)).map(Some);
                }
            }
            "deleted" => {
                return Err(CliError::Failed(format!("cluster {} was deleted", self.id)));
            }
            _ => {}
        }
        Ok(None)
    }
}
