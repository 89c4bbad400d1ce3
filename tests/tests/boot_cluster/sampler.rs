//! Sampling a booted control plane while it changes: rounds of every apiserver's `/readyz`
//! (anonymous, as a load balancer's health check asks), requests through the node-local
//! balancers and HAProxy (as clients reach the control plane), and every etcd member's status
//! (its raft term and the leader it knows) — and the rule a one-at-a-time change must keep:
//! in every round at least two apiservers ready and every request through a balancer answered.
//!
//! The one exception the rule allows is the moment etcd itself is briefly unavailable to every
//! apiserver at once — a leader change when the leader's member restarts, or etcd slowed on a
//! loaded host — which fails each apiserver's `etcd` check for up to its two-second timeout
//! (and it keeps answering the cached failure for a second more). Such a stretch is excused
//! only when nothing else was down: at most one apiserver failing for any other reason (the
//! member being changed), at most one etcd member not answering, at most
//! [`STORAGE_BLIP`] long, and no more of them than there are members.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use exk8s_tests::machine::Machine;
use serde_json::Value;

use super::lan::{Answer, Trust, https};

/// Where the sampler sends a request as a client would, each answer keyed by its name in a
/// round: its own node-local balancer (as the node's components reach the control plane), and
/// the HAProxy of `docs/apiserver-endpoint.md` in front of the members ([`super::haproxy`]).
pub(crate) const THROUGH: [(&str, &str); 2] = [
    ("balancer", "https://127.0.0.1:7445/version"),
    ("haproxy", "https://127.0.0.1:8443/version"),
];

/// How a round's entry for `GET /version` through another node's own balancer (as its kubelet
/// reaches the control plane) starts; the node's name follows.
const OTHER_BALANCER: &str = "the balancer of ";

/// The longest stretch of rounds in which etcd may be unavailable to every apiserver (from the
/// first such round's start to the last's): an election (one second of etcd's election
/// timeout), the apiserver's two-second check and its cached answer.
const STORAGE_BLIP: Duration = Duration::from_secs(6);

/// What an etcd member said of itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EtcdStatus {
    pub term: u64,
    pub leader: u64,
}

/// One round of samples.
#[derive(Debug)]
pub(crate) struct Round {
    started: Instant,
    /// The time of day the round started, to set beside the logs.
    pub at: String,
    /// Each apiserver's `/readyz` (`ok`, the checks it failed, or why it gave no answer), then each
    /// request through a balancer (`ok` for a version).
    pub answers: Vec<(String, String)>,
    /// Each etcd member's status, or why it gave none.
    pub etcd: Vec<(String, Result<EtcdStatus, String>)>,
}

impl Round {
    fn apiservers(&self) -> impl Iterator<Item = &(String, String)> {
        self.answers.iter().filter(|(at, _)| !through(at))
    }

    fn ready(&self) -> usize {
        self.apiservers().filter(|(_, a)| a == "ok").count()
    }

    /// Whether every apiserver that is not ready failed only its etcd checks, but one (the
    /// member being changed), and at most one etcd member did not answer.
    fn storage_only(&self) -> bool {
        let otherwise = self
            .apiservers()
            .filter(|(_, a)| a != "ok" && !a.split("; ").all(|c| c.starts_with("[-]etcd")))
            .count();
        let silent = self.etcd.iter().filter(|(_, s)| s.is_err()).count();
        otherwise <= 1 && silent <= 1
    }

    fn term(&self) -> Option<u64> {
        self.etcd
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok().map(|s| s.term))
            .max()
    }
}

/// Whether a round's entry is a request through a balancer rather than an apiserver's own
/// `/readyz`.
fn through(at: &str) -> bool {
    at.starts_with(OTHER_BALANCER) || THROUGH.iter().any(|(name, _)| *name == at)
}

/// `/readyz` of the apiserver at `ip`: `ok`, or what failed (the checks a 500 names, `[-]…`,
/// or why there was no answer).
fn readyz(sampler: &Machine, ip: &str) -> String {
    let url = format!("https://{ip}:6443/readyz");
    match https(&sampler.netns, &Trust::Any, &url, None) {
        Ok(Answer { status: 200, body }) => body.trim().to_owned(),
        Ok(Answer { status, body }) => {
            let failed: Vec<&str> = body.lines().filter(|l| l.starts_with("[-]")).collect();
            if failed.is_empty() {
                format!("{status} {}", body.trim())
            } else {
                failed.join("; ")
            }
        }
        Err(e) => e,
    }
}

/// The status of the etcd member at `ip`, asked over mutual TLS with the sampler's own
/// health-check client identity (the JSON gateway writes 64-bit numbers as strings).
fn etcd_status(sampler: &Machine, ip: &str) -> Result<EtcdStatus, String> {
    etcd_status_as(sampler, &sampler.root.join("etc/exk8s/pki"), ip)
}

/// [`etcd_status`] asked from `sampler`'s LAN with the etcd CA and health-check client
/// identity held in `pki` (a node's PKI directory, or a copy of one kept from before a change).
pub(crate) fn etcd_status_as(
    sampler: &Machine,
    pki: &std::path::Path,
    ip: &str,
) -> Result<EtcdStatus, String> {
    let trust = Trust::Mutual {
        ca: &pki.join("etcd-ca.pem"),
        cert: &pki.join("etcd-healthcheck-client.pem"),
        key: &pki.join("etcd-healthcheck-client-key.pem"),
    };
    let url = format!("https://{ip}:2379/v3/maintenance/status");
    let said = https(&sampler.netns, &trust, &url, Some("{}"))?;
    let status: Value = serde_json::from_str(&said.body)
        .map_err(|_| format!("{} {}", said.status, said.body.trim()))?;
    let number = |v: &Value| {
        v.as_str()
            .and_then(|s| s.parse().ok())
            .or_else(|| v.as_u64())
    };
    match (number(&status["raftTerm"]), number(&status["leader"])) {
        (Some(term), Some(leader)) => Ok(EtcdStatus { term, leader }),
        _ => Err(said.body),
    }
}

/// One round: each apiserver's `/readyz` and each etcd member's status at `ips`, asked from
/// `sampler`'s LAN, then `GET /version` through each of [`THROUGH`] and through the balancer
/// of each of `others`.
fn round(sampler: &Machine, ips: &[String], others: &[Machine]) -> Round {
    let (started, at) = (Instant::now(), exk8s_tests::procs::time_of_day());
    let mut answers: Vec<(String, String)> = ips
        .iter()
        .map(|ip| (ip.clone(), readyz(sampler, ip)))
        .collect();
    let etcd = ips
        .iter()
        .map(|ip| (ip.clone(), etcd_status(sampler, ip)))
        .collect();
    let asked = THROUGH
        .iter()
        .map(|(name, url)| ((*name).to_owned(), *url, sampler));
    let others = others
        .iter()
        .filter(|m| m.vm != sampler.vm)
        .map(|m| (format!("{OTHER_BALANCER}{}", m.name), THROUGH[0].1, m));
    for (name, url, from) in asked.chain(others) {
        let answer = match version(from, url) {
            ok if ok == "ok" => ok,
            failed => format!("{failed} at {}", exk8s_tests::procs::time_of_day()),
        };
        answers.push((name, answer));
    }
    Round {
        started,
        at,
        answers,
        etcd,
    }
}

/// `GET /version` at `url` from `from`'s LAN: `ok`, or what it answered instead (or why it did
/// not).
pub(crate) fn version(from: &Machine, url: &str) -> String {
    match https(&from.netns, &Trust::Any, url, None) {
        Ok(Answer { status: 200, body }) if body.contains("\"gitVersion\"") => "ok".to_owned(),
        Ok(Answer { status, body }) => format!("{status} {}", body.trim()),
        Err(e) => e,
    }
}

/// Samples rounds every few hundred milliseconds while `change` runs (through the balancer of
/// each of `others` too).
pub(crate) fn sampling<T: Send>(
    sampler: &Machine,
    ips: &[String],
    others: &[Machine],
    change: impl FnOnce() -> T + Send,
) -> (T, Vec<Round>) {
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let samples = s.spawn(|| {
            let mut rounds = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                rounds.push(round(sampler, ips, others));
                std::thread::sleep(Duration::from_millis(300));
            }
            rounds
        });
        let changed = {
            let _stop = exk8s_tests::procs::SetOnDrop(&stop);
            change()
        };
        (changed, samples.join().unwrap())
    })
}

/// Every request through a balancer was answered.
fn assert_balancers_answered(change: &str, rounds: &[Round]) {
    let failed: Vec<(&str, &(String, String))> = rounds
        .iter()
        .flat_map(|r| r.answers.iter().map(move |a| (r.at.as_str(), a)))
        .filter(|(_, (at, a))| through(at) && a != "ok")
        .collect();
    assert!(
        failed.is_empty(),
        "{change}: {} requests through a balancer failed in {} rounds: {failed:?}",
        failed.len(),
        rounds.len()
    );
}

/// The stretches of consecutive rounds with fewer than `ready` apiservers ready, as index
/// ranges.
fn short_stretches(rounds: &[Round], ready: usize) -> Vec<std::ops::Range<usize>> {
    let mut stretches: Vec<std::ops::Range<usize>> = Vec::new();
    for (i, round) in rounds.iter().enumerate() {
        if round.ready() >= ready {
            continue;
        }
        match stretches.last_mut() {
            Some(last) if last.end == i => last.end = i + 1,
            _ => stretches.push(i..i + 1),
        }
    }
    stretches
}

/// Whether a stretch of short rounds is etcd briefly unavailable to every apiserver and
/// nothing else (see the module's doc).
fn storage_blip(rounds: &[Round], stretch: &std::ops::Range<usize>) -> bool {
    let (first, last) = (&rounds[stretch.start], &rounds[stretch.end - 1]);
    last.started.duration_since(first.started) <= STORAGE_BLIP
        && rounds[stretch.clone()].iter().all(Round::storage_only)
}

/// Every request through a balancer was answered, and in every round at least two apiservers
/// answered `ok` — but for brief stretches of etcd unavailable to them all (the module's doc),
/// no more than there are members.
pub(crate) fn assert_two_ready(change: &str, rounds: &[Round]) {
    assert_ready(change, rounds, 2);
}

/// [`assert_two_ready`] for a control plane that lost a member: of the two sampled survivors
/// at least one answered `ok` in every round.
pub(crate) fn assert_one_ready(change: &str, rounds: &[Round]) {
    assert_ready(change, rounds, 1);
}

/// Every request through a balancer answered, and in every round at least `ready` apiservers
/// answered `ok` but for the brief stretches [`assert_two_ready`] allows.
fn assert_ready(change: &str, rounds: &[Round], ready: usize) {
    assert_balancers_answered(change, rounds);
    assert!(rounds.len() >= 10, "{change}: {rounds:?}");
    let stretches = short_stretches(rounds, ready);
    let (blips, short): (Vec<_>, Vec<_>) = stretches
        .iter()
        .partition(|stretch| storage_blip(rounds, stretch));
    let shown = |stretches: &[&std::ops::Range<usize>]| -> Vec<&[Round]> {
        stretches.iter().map(|s| &rounds[(*s).clone()]).collect()
    };
    assert!(
        short.is_empty(),
        "{change}: {} of {} rounds found fewer than {ready} apiserver(s) ready: {:?}",
        short.iter().map(|s| s.len()).sum::<usize>(),
        rounds.len(),
        shown(&short)
    );
    let members = rounds[0].etcd.len();
    assert!(
        blips.len() <= members,
        "{change}: etcd was unavailable to every apiserver {} times, more than once per \
         member: {:?}",
        blips.len(),
        shown(&blips)
    );
    let down = rounds
        .iter()
        .flat_map(|r| r.answers.iter())
        .filter(|(_, a)| a != "ok")
        .count();
    let terms: Vec<String> = blips
        .iter()
        .map(|s| {
            let before = s.start.checked_sub(1).and_then(|i| rounds[i].term());
            let after = rounds.get(s.end).and_then(Round::term);
            format!(
                "at {} for {} round(s), etcd's term {before:?} → {after:?}",
                rounds[s.start].at,
                s.len()
            )
        })
        .collect();
    eprintln!(
        "{change}: {} rounds of /readyz, {down} answers not ok (never fewer than {ready} ready \
         but for etcd briefly unavailable to every apiserver: {terms:?})",
        rounds.len()
    );
}

/// Every answer in every round was `ok` (for changes that leave every sampled apiserver be).
pub(crate) fn assert_all_ok(change: &str, rounds: &[Round]) {
    let samples: Vec<(&str, &(String, String))> = rounds
        .iter()
        .flat_map(|r| r.answers.iter().map(move |a| (r.at.as_str(), a)))
        .collect();
    let failed: Vec<_> = samples.iter().filter(|(_, (_, a))| a != "ok").collect();
    assert!(samples.len() >= 10, "{change}: {samples:?}");
    assert!(
        failed.is_empty(),
        "{change}: {} of {} samples failed: {failed:?}",
        failed.len(),
        samples.len()
    );
}
