//! Why control-plane remediation last waited, as the cluster row keeps it
//! (`clusters.remediation_blocked`, JSON) for its `RemediationAllowed` condition: written by the
//! reconciler's health pass when its decision changes, cleared when nothing is held back.

use serde::{Deserialize, Serialize};

use super::Blocked;

/// One stored refusal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Held {
    /// [`Blocked::reason`].
    pub reason: String,
    /// [`Blocked::describe`].
    pub message: String,
    /// When the pass first refused for this reason.
    pub since: i64,
}

/// What a row stores (None: nothing, or a value this build cannot read).
pub fn read(stored: Option<&str>) -> Option<Held> {
    serde_json::from_str(stored?).ok()
}

/// The value to store for `blocked` at `now` given what is stored: `None` when the stored one
/// says the same already (no write), else the new text — keeping its `since` while the reason
/// stays.
pub fn next(stored: Option<&str>, blocked: &Blocked, now: i64) -> Option<String> {
    let old = read(stored);
    let held = Held {
        reason: blocked.reason().to_owned(),
        message: blocked.describe(),
        since: old
            .as_ref()
            .filter(|o| o.reason == blocked.reason())
            .map_or(now, |o| o.since),
    };
    (old.as_ref() != Some(&held)).then(|| serde_json::to_string(&held).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_is_written_once_and_keeps_its_start_while_its_reason_stays() {
        let quorum = Blocked::QuorumAtRisk {
            healthy: 1,
            members: 3,
        };
        let first = next(None, &quorum, 100).unwrap();
        assert_eq!(read(Some(&first)).unwrap().since, 100);
        assert_eq!(
            next(Some(&first), &quorum, 200),
            None,
            "unchanged: no write"
        );
        let worse = Blocked::QuorumAtRisk {
            healthy: 0,
            members: 3,
        };
        let second = next(Some(&first), &worse, 300).unwrap();
        let held = read(Some(&second)).unwrap();
        assert_eq!((held.reason.as_str(), held.since), ("QuorumAtRisk", 100));
        assert!(held.message.contains("only 0 of 3"), "{}", held.message);
        let other = next(Some(&second), &Blocked::Off, 400).unwrap();
        assert_eq!(read(Some(&other)).unwrap().since, 400);
        assert_eq!(read(Some("not json")), None);
    }
}
