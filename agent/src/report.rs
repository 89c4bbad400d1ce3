//! Phase reports to the API: during the first boot to `POST /bootstrap/{vm_id}/status`
//! (bootstrap token), afterwards to `POST /nodes/{vm_id}/status` (signed with the node key).
//! Each report carries the components' health the run's probes saw so far.
//! Progress reports are best effort: one attempt, a failure logged and forgotten. The outcome
//! (`complete` or `sync`, succeeded or failed) is what the API's rollout waits for, so it is
//! retried on rate limits, server errors and network faults for up to a minute; it still never
//! aborts the work (the next sync says it again).

pub use exk8s_common::contract::ReportState as State;
use exk8s_common::contract::{
    BootPhase, Component, ComponentHealth, IMDS_TOKEN_HEADER, MAX_REPORT_MESSAGE_CHARS, PhaseReport,
};

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::time::Duration;

use crate::http::{Attempt, classify, retry};
use crate::imds::{Identity, relay};
use crate::log::{log_info, log_warn};
use crate::node_api::NodeApi;

/// How long the outcome report is retried.
const OUTCOME_DEADLINE: Duration = Duration::from_secs(60);

/// Where reports go.
pub enum Target<'a> {
    /// Nowhere: a local `apply`.
    None,
    /// The first boot, with the bootstrap credentials.
    Bootstrap {
        agent: &'a ureq::Agent,
        api_url: &'a str,
        identity: &'a Identity,
    },
    /// A sync, signed with the node key.
    Node(&'a NodeApi<'a>),
}

/// Sends phase reports for one VM, naming the generation being applied once it is known and
/// every component health seen so far.
pub struct Reporter<'a> {
    pub target: Target<'a>,
    pub generation: Option<u64>,
    /// Components' health as this run's probes saw them; each report carries them.
    seen: RefCell<BTreeMap<Component, ComponentHealth>>,
}

impl<'a> Reporter<'a> {
    pub fn none() -> Self {
        Self::to(Target::None)
    }

    pub fn to(target: Target<'a>) -> Self {
        Reporter {
            target,
            generation: None,
            seen: RefCell::new(BTreeMap::new()),
        }
    }

    /// Records what a probe saw of a component; the next reports carry it.
    pub fn saw(&self, health: ComponentHealth) {
        self.seen.borrow_mut().insert(health.component, health);
    }

    /// The components' health seen so far.
    pub fn seen(&self) -> Vec<ComponentHealth> {
        self.seen.borrow().values().cloned().collect()
    }

    /// The same target, reporting `generation` from now on.
    pub fn with_generation(self, generation: u64) -> Self {
        Reporter {
            generation: Some(generation),
            ..self
        }
    }

    /// A progress report: one attempt.
    pub fn report(&self, phase: BootPhase, state: State, message: &str) {
        self.send(phase, state, message, false);
    }

    /// The outcome: retried for up to a minute.
    pub fn outcome(&self, phase: BootPhase, state: State, message: &str) {
        self.send(phase, state, message, true);
    }

    fn send(&self, phase: BootPhase, state: State, message: &str, persist: bool) {
        log_info!(
            "phase {phase}: {state}{}{message}",
            if message.is_empty() { "" } else { ": " }
        );
        if matches!(self.target, Target::None) {
            return;
        }
        let body = PhaseReport {
            phase,
            state,
            message: message.chars().take(MAX_REPORT_MESSAGE_CHARS).collect(),
            generation: self.generation,
            components: self.seen.borrow().values().cloned().collect(),
        };
        let attempt = || match &self.target {
            Target::None => Attempt::Done(()),
            Target::Node(api) => api.report(&body),
            Target::Bootstrap {
                agent,
                api_url,
                identity,
            } => {
                let url = format!(
                    "{}/bootstrap/{}/status",
                    api_url.trim_end_matches('/'),
                    identity.vm_id
                );
                let sent = agent
                    .post(&url)
                    .set(IMDS_TOKEN_HEADER, identity.imds_token.expose())
                    .set(
                        "Authorization",
                        &format!("Bearer {}", identity.access_token.expose()),
                    )
                    .set("Content-Type", "application/json")
                    .send_string(&serde_json::to_string(&body).unwrap_or_default());
                match classify("status report", sent) {
                    Ok(_) => Attempt::Done(()),
                    Err(attempt) => relay(attempt),
                }
            }
        };
        let result = if persist {
            retry("reporting the outcome", OUTCOME_DEADLINE, attempt)
                .map_err(|e| crate::error::chain(&e))
        } else {
            match attempt() {
                Attempt::Done(()) => Ok(()),
                Attempt::Fatal(e) => Err(crate::error::chain(&e)),
                Attempt::Retry { reason, .. } => Err(reason),
            }
        };
        if let Err(reason) = result {
            log_warn!("could not report phase {phase} to the API (continuing): {reason}");
        }
    }
}
