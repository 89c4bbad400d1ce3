//! Renders the judged conditions ([`crate::status`]) in Cluster API v1beta2's wire shape.

pub use exk8s_api_types::Condition;

pub(super) fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

impl From<crate::status::Condition> for Condition {
    fn from(c: crate::status::Condition) -> Self {
        Self {
            type_: c.type_.into(),
            status: c.status.as_str().into(),
            reason: c.reason.into(),
            message: c.message,
            last_transition_time: rfc3339(c.since),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{Status, deleting};

    #[test]
    fn a_condition_is_written_as_cluster_api_writes_it() {
        let rendered = Condition::from(deleting(
            crate::db::phase::ClusterPhase::Deleting,
            1_700_000_000,
        ));
        assert_eq!(rendered.type_, "Deleting");
        assert_eq!(rendered.status, Status::True.as_str());
        assert_eq!(rendered.reason, "Deleting");
        assert_eq!(rendered.last_transition_time, "2023-11-14T22:13:20Z");
        let json = serde_json::to_value(&rendered).unwrap();
        assert_eq!(json["type"], "Deleting");
        assert_eq!(json["lastTransitionTime"], "2023-11-14T22:13:20Z");
    }
}
