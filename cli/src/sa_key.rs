//! `exk8s rotate-sa-key` (rotate the cluster's service-account signing key in three phases)
//! and `exk8s sa-key` (the key's age, its policy and its rotation; `--max-age-days` /
//! `--auto-rotate` set the policy).

use exk8s_api_types::{
    RotateSaKeyRequest, SaKeyRotationStarted, ServiceAccountKeyPolicy, ServiceAccountKeyView,
};

use crate::client::Api;
use crate::error::CliError;
use crate::output::{Format, show, table};

/// `POST /clusters/{id}/certificates/rotate-sa-key`, the answer shown.
pub(crate) fn rotate(
    api: &Api,
    cluster: &str,
    drop_old_after: Option<i64>,
    format: Format,
) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    let body = RotateSaKeyRequest {
        drop_old_after_seconds: drop_old_after,
    };
    let started: SaKeyRotationStarted = api
        .send(
            "POST",
            &format!("/clusters/{id}/certificates/rotate-sa-key"),
            Some(&body),
            None,
        )?
        .ok_or_else(|| CliError::Unexpected("the API answered without a body".into()))?;
    eprintln!(
        "the service-account key's rotation is in phase {}; every control-plane node takes its next generation, one at a time; the old key is dropped {} after every apiserver signs with the new one (`exk8s sa-key {cluster}` shows where it stands)",
        started.phase,
        duration(started.drop_old_after_seconds)
    );
    show(format, &started, |s| crate::day2::started_table(&s.nodes))
}

/// `GET /clusters/{id}/service-account-key`, after `PUT`ting the policy when a part of it is
/// given (the other part kept).
pub(crate) fn key(
    api: &Api,
    cluster: &str,
    max_age_days: Option<i64>,
    auto_rotate: Option<bool>,
    format: Format,
) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    let path = format!("/clusters/{id}/service-account-key");
    let mut key: ServiceAccountKeyView = api.get(&path)?;
    if max_age_days.is_some() || auto_rotate.is_some() {
        let policy = ServiceAccountKeyPolicy {
            max_age_days: max_age_days.unwrap_or(key.max_age_days),
            auto_rotate: auto_rotate.unwrap_or(key.auto_rotate),
        };
        key = api
            .send("PUT", &path, Some(&policy), None)?
            .ok_or_else(|| CliError::Unexpected("the API answered without a body".into()))?;
    }
    show(format, &key, key_table)
}

fn key_table(key: &ServiceAccountKeyView) -> comfy_table::Table {
    let mut t = table(&["age", "max age", "auto-rotate", "rotation"]);
    let rotation = key.rotation.as_ref().map_or_else(
        || "none".to_owned(),
        |r| match (&r.waiting_for, r.drop_old_at) {
            (Some(node), _) => format!("{}, waiting for {node}", r.phase),
            (None, Some(at)) if r.phase == "sign-new" => {
                format!("{}, the old key goes at {}", r.phase, rfc3339(at))
            }
            (None, _) => r.phase.clone(),
        },
    );
    t.add_row(vec![
        format!("{} days", key.age_days),
        format!("{} days", key.max_age_days),
        key.auto_rotate.to_string(),
        rotation,
    ]);
    t
}

/// `unix` as RFC 3339 (as the number when out of range).
fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| unix.to_string())
}

/// `seconds` as hours and minutes (`25h`, `90s`).
fn duration(seconds: i64) -> String {
    match seconds {
        s if s % 3600 == 0 && s > 0 => format!("{}h", s / 3600),
        s if s % 60 == 0 && s > 0 => format!("{}m", s / 60),
        s => format!("{s}s"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn durations_read_as_written() {
        assert_eq!(super::duration(90_000), "25h");
        assert_eq!(super::duration(120), "2m");
        assert_eq!(super::duration(0), "0s");
        assert_eq!(super::duration(61), "61s");
    }
}
