//! `SnapshotsUpToDate`: when the last good etcd snapshot was stored, and whether the schedule
//! is kept — False once a snapshot is overdue (its interval and the member's upload window past
//! the last one stored, or past the founding), saying what became of the last attempt.

use super::{Condition, Status};
use crate::db::snapshots::{SnapshotRow, SnapshotState};

/// A cluster's schedule and its latest snapshots.
#[derive(Debug, Clone, Copy)]
pub struct Snapshots<'a> {
    /// Whether the cluster was founded (before, it has no etcd to snapshot).
    pub founded: bool,
    /// 0: only when an operator asks.
    pub every_secs: i64,
    /// The cluster's founding (the schedule's start).
    pub created_at: i64,
    /// The latest in each state.
    pub latest: &'a [SnapshotRow],
}

fn when(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

fn hours(secs: i64) -> String {
    if secs % 3600 == 0 {
        format!("{}h", secs / 3600)
    } else {
        format!("{}m", secs / 60)
    }
}

/// The condition at `now`; `grace` is how long a member has to upload one.
pub fn snapshots(s: Snapshots<'_>, now: i64, grace: i64) -> Condition {
    let latest = |state| s.latest.iter().find(|r| r.state == state);
    let stored = latest(SnapshotState::Stored);
    let failed = latest(SnapshotState::Failed);
    let requested = latest(SnapshotState::Requested);
    let taking = requested.filter(|r| r.not_after >= now);
    // Past its deadline but not yet marked failed (the next pass marks it).
    let expired = requested.filter(|r| r.not_after < now);
    let last = stored.map(|r| {
        format!(
            "snapshot {} was stored at {} (revision {}, etcd {})",
            r.id,
            when(r.taken_at.unwrap_or(r.requested_at)),
            r.revision.unwrap_or_default(),
            r.etcd_version.as_deref().unwrap_or("?")
        )
    });
    let attempt = match (taking, failed) {
        (Some(t), _) => format!("; snapshot {} is being taken by {}", t.id, t.member_name),
        (None, _) if expired.is_some_and(|e| failed.is_none_or(|f| e.id > f.id)) => {
            let e = expired.map_or((0, ""), |e| (e.id, e.member_name.as_str()));
            format!(
                "; the last attempt, snapshot {}, failed: {} did not upload it before its deadline",
                e.0, e.1
            )
        }
        (None, Some(f)) if stored.is_none_or(|s| f.id > s.id) => format!(
            "; the last attempt, snapshot {}, failed: {}",
            f.id,
            f.error.as_deref().unwrap_or("no reason recorded")
        ),
        _ => String::new(),
    };
    let condition = |status, reason, message: String| Condition {
        type_: "SnapshotsUpToDate",
        status,
        reason,
        message,
        since: stored.and_then(|r| r.taken_at).unwrap_or(s.created_at),
    };
    if !s.founded {
        return condition(
            Status::Unknown,
            "NotFounded",
            "the cluster is not founded: it has no etcd to snapshot".into(),
        );
    }
    if s.every_secs == 0 {
        return match last {
            Some(last) => condition(
                Status::True,
                "Manual",
                format!("no schedule (snapshots only when asked); {last}{attempt}"),
            ),
            None => condition(
                Status::Unknown,
                "NotScheduled",
                format!("no schedule and no snapshot taken yet{attempt}"),
            ),
        };
    }
    let since = stored.and_then(|r| r.taken_at).unwrap_or(s.created_at);
    let due = since + s.every_secs;
    let every = hours(s.every_secs);
    if now > due + grace {
        let what = last.unwrap_or_else(|| "no snapshot was ever stored".into());
        return condition(
            Status::False,
            "ScheduleMissed",
            format!(
                "a snapshot every {every} was due at {}, and none is stored since: {what}{attempt}",
                when(due)
            ),
        );
    }
    match last {
        Some(last) => condition(
            Status::True,
            "Taken",
            format!(
                "{last}; every {every}, the next is due at {}{attempt}",
                when(due)
            ),
        ),
        None => condition(
            Status::Unknown,
            "NotYetTaken",
            format!(
                "a snapshot every {every}: the first is due at {}{attempt}",
                when(due)
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::snapshots::Trigger;

    fn row(id: i64, state: SnapshotState, at: i64) -> SnapshotRow {
        SnapshotRow {
            id,
            cluster_id: 1,
            state,
            trigger: Trigger::Schedule,
            node_id: 1,
            member_name: "cp-101".into(),
            requested_at: at,
            not_after: at + 1200,
            taken_at: (state == SnapshotState::Stored).then_some(at + 60),
            revision: Some(42),
            etcd_version: Some("3.6.14".into()),
            size_bytes: Some(1 << 20),
            sha256: None,
            object_key: None,
            ca_sha256: None,
            error: (state == SnapshotState::Failed).then(|| "connection refused".into()),
        }
    }

    const DAY: i64 = 86_400;

    fn schedule(every_secs: i64, latest: &[SnapshotRow]) -> Snapshots<'_> {
        Snapshots {
            founded: true,
            every_secs,
            created_at: 0,
            latest,
        }
    }
    const GRACE: i64 = 1200;

    #[test]
    fn the_condition_follows_the_schedule() {
        let every = 12 * 3600;
        let s = |latest| schedule(every, latest);
        let none = snapshots(s(&[]), 3600, GRACE);
        assert_eq!((none.status, none.reason), (Status::Unknown, "NotYetTaken"));
        assert!(none.message.contains("every 12h"), "{}", none.message);
        let overdue = snapshots(s(&[]), every + GRACE + 1, GRACE);
        assert_eq!(
            (overdue.status, overdue.reason),
            (Status::False, "ScheduleMissed")
        );
        assert!(overdue.message.contains("no snapshot was ever stored"));

        let stored = [row(3, SnapshotState::Stored, DAY)];
        let good = snapshots(s(&stored), DAY + 3600, GRACE);
        assert_eq!((good.status, good.reason), (Status::True, "Taken"));
        assert!(
            good.message.contains("snapshot 3 was stored"),
            "{}",
            good.message
        );
        assert_eq!(good.since, DAY + 60);

        let latest = [
            row(3, SnapshotState::Stored, DAY),
            row(4, SnapshotState::Failed, DAY + every),
        ];
        let missed = snapshots(s(&latest), DAY + 60 + every + GRACE + 1, GRACE);
        assert_eq!(
            (missed.status, missed.reason),
            (Status::False, "ScheduleMissed")
        );
        assert!(
            missed
                .message
                .contains("snapshot 4, failed: connection refused"),
            "{}",
            missed.message
        );
        let taking = [
            row(3, SnapshotState::Stored, DAY),
            row(5, SnapshotState::Requested, DAY + every),
        ];
        let on_time = snapshots(s(&taking), DAY + every + 100, GRACE);
        assert!(
            on_time
                .message
                .contains("snapshot 5 is being taken by cp-101")
        );
    }

    #[test]
    fn without_a_schedule_only_what_was_taken_is_shown() {
        let s = |latest| schedule(0, latest);
        let none = snapshots(s(&[]), 100 * DAY, GRACE);
        assert_eq!(
            (none.status, none.reason),
            (Status::Unknown, "NotScheduled")
        );
        let stored = [row(1, SnapshotState::Stored, DAY)];
        let manual = snapshots(s(&stored), 100 * DAY, GRACE);
        assert_eq!((manual.status, manual.reason), (Status::True, "Manual"));
    }
}
