//! Phase reports to `POST /bootstrap/control-plane/{vm_id}/status`. Best effort: a report that
//! fails is logged and forgotten; it never aborts the boot.

pub use exk8s_common::contract::ReportState as State;
use exk8s_common::contract::{BootPhase, IMDS_TOKEN_HEADER, MAX_REPORT_MESSAGE_CHARS, PhaseReport};

use crate::imds::Identity;
use crate::log::{log_info, log_warn};

/// Sends phase reports for one VM; a no-op without an API (local `apply`).
pub struct Reporter<'a> {
    pub target: Option<(&'a ureq::Agent, &'a str, &'a Identity)>,
}

impl Reporter<'_> {
    pub fn none() -> Self {
        Reporter { target: None }
    }

    pub fn report(&self, phase: BootPhase, state: State, message: &str) {
        log_info!(
            "phase {phase}: {state}{}{message}",
            if message.is_empty() { "" } else { ": " }
        );
        let Some((agent, api_url, identity)) = self.target else {
            return;
        };
        let url = format!(
            "{}/bootstrap/control-plane/{}/status",
            api_url.trim_end_matches('/'),
            identity.vm_id
        );
        let body = PhaseReport {
            phase,
            state,
            message: message.chars().take(MAX_REPORT_MESSAGE_CHARS).collect(),
            generation: None,
        };
        let result = agent
            .post(&url)
            .set(IMDS_TOKEN_HEADER, identity.imds_token.expose())
            .set(
                "Authorization",
                &format!("Bearer {}", identity.access_token.expose()),
            )
            .set("Content-Type", "application/json")
            .send_string(&serde_json::to_string(&body).unwrap_or_default());
        if let Err(e) = result {
            log_warn!("could not report phase {phase} to the API (continuing): {e}");
        }
    }
}
