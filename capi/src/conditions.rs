//! Conditions as Cluster API v1beta2 writes them (`metav1.Condition`): a condition keeps its
//! `lastTransitionTime` while its status stays, and carries the generation it was judged at.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Cluster API's `Paused` condition and its reasons.
pub const PAUSED: &str = "Paused";
pub const PAUSED_REASON: &str = "Paused";
pub const NOT_PAUSED_REASON: &str = "NotPaused";
/// Cluster API's paused annotation on a provider's object.
pub const PAUSED_ANNOTATION: &str = "cluster.x-k8s.io/paused";

/// `True`/`False`.
pub fn status(value: bool) -> String {
    if value { "True" } else { "False" }.to_owned()
}

/// Sets condition `type_` in `conditions`: a new one, or the old one updated (its transition
/// time kept unless its status changed).
pub fn set(
    conditions: &mut Vec<Condition>,
    type_: &str,
    value: &str,
    reason: &str,
    message: &str,
    generation: Option<i64>,
) {
    let now = Time(Timestamp::now());
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(old) => {
            if old.status != value {
                old.last_transition_time = now;
            }
            value.clone_into(&mut old.status);
            reason.clone_into(&mut old.reason);
            message.clone_into(&mut old.message);
            old.observed_generation = generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_owned(),
            status: value.to_owned(),
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation: generation,
            last_transition_time: now,
        }),
    }
}

/// Why reconciling is paused (the Cluster's `spec.paused`, the object's annotation), or `None`.
pub fn paused_because(cluster_paused: bool, annotated: bool, kind: &str) -> Option<String> {
    let mut why = Vec::new();
    if cluster_paused {
        why.push("Cluster spec.paused is set to true".to_owned());
    }
    if annotated {
        why.push(format!("{kind} has the {PAUSED_ANNOTATION} annotation"));
    }
    (!why.is_empty()).then(|| why.join(", "))
}

/// Sets `Paused` from [`paused_because`]'s answer.
pub fn set_paused(conditions: &mut Vec<Condition>, why: Option<&str>, generation: Option<i64>) {
    match why {
        Some(why) => set(conditions, PAUSED, "True", PAUSED_REASON, why, generation),
        None => set(
            conditions,
            PAUSED,
            "False",
            NOT_PAUSED_REASON,
            "",
            generation,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_condition_keeps_its_transition_time_while_its_status_stays() {
        let mut conditions = Vec::new();
        set(&mut conditions, "Ready", "False", "Waiting", "a", Some(1));
        let first = conditions[0].last_transition_time.clone();
        set(&mut conditions, "Ready", "False", "Waiting", "b", Some(2));
        assert_eq!(conditions[0].last_transition_time, first);
        assert_eq!(
            (
                conditions[0].message.as_str(),
                conditions[0].observed_generation
            ),
            ("b", Some(2))
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
        set(&mut conditions, "Ready", "True", "Ready", "", Some(2));
        assert_ne!(conditions[0].last_transition_time, first);
        assert_eq!(conditions.len(), 1);
    }

    #[test]
    fn paused_says_each_reason() {
        assert_eq!(paused_because(false, false, "ExK8sCluster"), None);
        assert_eq!(
            paused_because(true, true, "ExK8sCluster").unwrap(),
            "Cluster spec.paused is set to true, ExK8sCluster has the cluster.x-k8s.io/paused annotation"
        );
    }
}
