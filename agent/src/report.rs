//! Phase reports to the API: during the first boot to `POST /bootstrap/control-plane/{vm_id}/status`
//! (bootstrap token), afterwards to `POST /nodes/{vm_id}/status` (signed with the node key).
//! Best effort: a report that fails is logged and forgotten; it never aborts the work.

pub use exk8s_common::contract::ReportState as State;
use exk8s_common::contract::{BootPhase, IMDS_TOKEN_HEADER, MAX_REPORT_MESSAGE_CHARS, PhaseReport};

use crate::imds::Identity;
use crate::log::{log_info, log_warn};
use crate::node_api::NodeApi;

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

/// Sends phase reports for one VM, naming the generation being applied once it is known.
pub struct Reporter<'a> {
    pub target: Target<'a>,
    pub generation: Option<u64>,
}

impl<'a> Reporter<'a> {
    pub fn none() -> Self {
        Reporter {
            target: Target::None,
            generation: None,
        }
    }

    pub fn to(target: Target<'a>) -> Self {
        Reporter {
            target,
            generation: None,
        }
    }

    /// The same target, reporting `generation` from now on.
    pub fn with_generation(self, generation: u64) -> Self {
        Reporter {
            generation: Some(generation),
            ..self
        }
    }

    pub fn report(&self, phase: BootPhase, state: State, message: &str) {
        log_info!(
            "phase {phase}: {state}{}{message}",
            if message.is_empty() { "" } else { ": " }
        );
        let body = PhaseReport {
            phase,
            state,
            message: message.chars().take(MAX_REPORT_MESSAGE_CHARS).collect(),
            generation: self.generation,
        };
        let result = match &self.target {
            Target::None => return,
            Target::Node(api) => api.report(&body),
            Target::Bootstrap {
                agent,
                api_url,
                identity,
            } => {
                let url = format!(
                    "{}/bootstrap/control-plane/{}/status",
                    api_url.trim_end_matches('/'),
                    identity.vm_id
                );
                agent
                    .post(&url)
                    .set(IMDS_TOKEN_HEADER, identity.imds_token.expose())
                    .set(
                        "Authorization",
                        &format!("Bearer {}", identity.access_token.expose()),
                    )
                    .set("Content-Type", "application/json")
                    .send_string(&serde_json::to_string(&body).unwrap_or_default())
                    .map(drop)
                    .map_err(|e| e.to_string())
            }
        };
        if let Err(e) = result {
            log_warn!("could not report phase {phase} to the API (continuing): {e}");
        }
    }
}
