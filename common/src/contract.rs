//! The wire contract between the agent and the API beyond the bundle itself: the headers a VM
//! sends, the boot phases it reports and where each stands. Both programs use these types, so
//! a phase or header renamed on one side cannot silently diverge from the other.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The instance-metadata session token a VM presents with every bootstrap request.
pub const IMDS_TOKEN_HEADER: &str = "X-exc-imds-token";
/// The agent's fresh per-request nonce, echoed in the bundle payload.
pub const NONCE_HEADER: &str = "X-Exk8s-Nonce";
/// Longest report message the API accepts, in characters.
pub const MAX_REPORT_MESSAGE_CHARS: usize = 1000;

/// The phases of a node's boot, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BootPhase {
    Fetch,
    Verify,
    Files,
    Prereqs,
    Services,
    Etcd,
    Apiserver,
    Addons,
    Complete,
}

impl BootPhase {
    pub const ALL: [Self; 9] = [
        Self::Fetch,
        Self::Verify,
        Self::Files,
        Self::Prereqs,
        Self::Services,
        Self::Etcd,
        Self::Apiserver,
        Self::Addons,
        Self::Complete,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fetch => "fetch",
            Self::Verify => "verify",
            Self::Files => "files",
            Self::Prereqs => "prereqs",
            Self::Services => "services",
            Self::Etcd => "etcd",
            Self::Apiserver => "apiserver",
            Self::Addons => "addons",
            Self::Complete => "complete",
        }
    }
}

/// Where a reported phase stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReportState {
    Started,
    Succeeded,
    Failed,
}

impl ReportState {
    pub const ALL: [Self; 3] = [Self::Started, Self::Succeeded, Self::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
        }
    }
}

/// A name that is not one of the enum's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{given}` is not one of {expected}")]
pub struct UnknownName {
    given: String,
    expected: String,
}

macro_rules! text_enum {
    ($ty:ty) => {
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = UnknownName;

            fn from_str(s: &str) -> Result<Self, UnknownName> {
                <$ty>::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| UnknownName {
                        given: s.chars().take(40).collect(),
                        expected: <$ty>::ALL.map(<$ty>::as_str).join(", "),
                    })
            }
        }
    };
}

text_enum!(BootPhase);
text_enum!(ReportState);

/// A phase report, as the agent sends it to `…/status`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PhaseReport {
    pub phase: BootPhase,
    pub state: ReportState,
    /// At most [`MAX_REPORT_MESSAGE_CHARS`] characters.
    #[serde(default)]
    pub message: String,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    #[test]
    fn names_round_trip_through_text_and_json() {
        for phase in BootPhase::ALL {
            assert_eq!(phase.as_str().parse::<BootPhase>().unwrap(), phase);
            assert_eq!(
                serde_json::to_string(&phase).unwrap(),
                format!("\"{phase}\"")
            );
        }
        for state in ReportState::ALL {
            assert_eq!(state.as_str().parse::<ReportState>().unwrap(), state);
        }
        let error = "booting".parse::<BootPhase>().unwrap_err().to_string();
        assert!(error.contains("fetch, verify"), "{error}");
        assert!(serde_json::from_str::<PhaseReport>(r#"{"phase":"etcd","state":"ok"}"#).is_err());
    }
}
