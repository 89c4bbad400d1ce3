//! The node-pool contract: `POST /clusters/{id}/node-pools` and `PATCH …/{pool}`. Every field is
//! checked here, with a message naming it, before anything is recorded or created; labels and
//! taints are checked to the letter of Kubernetes and of NodeRestriction ([`crate::labels`]).

use std::collections::BTreeMap;

use crate::field::{FieldError, Validate};
use crate::labels::{NodeLabel, Taint};
use crate::trust::CONTROL_PLANE_GROUP;
pub use exk8s_api_types::pools::{CreatePoolRequest, TaintRequest, UpdatePoolRequest};

/// Nodes a pool may have.
pub const COUNT: std::ops::RangeInclusive<i64> = 0..=1000;
/// Workers a replacement may make beyond a pool's count.
pub const MAX_SURGE: std::ops::RangeInclusive<i64> = 0..=10;
/// A pool's name becomes part of its nodes' names (`<pool>-<vm id>.cluster-<id>.internal`).
const NAME_MAX: usize = 40;

/// A pool request that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolSpec {
    pub name: String,
    pub count: i64,
    pub instance_type: String,
    pub image_id: i64,
    pub subnet_id: i64,
    pub registration: Registration,
    pub max_surge: i64,
}

/// Labels and taints, checked, with their stored (JSON) forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub labels_json: String,
    pub taints_json: String,
}

/// A checked `PATCH`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolUpdate {
    pub count: Option<i64>,
    pub labels_json: Option<String>,
    pub taints_json: Option<String>,
    /// The release to run (its workers are replaced to match).
    pub kubernetes_version: Option<crate::upgrade::skew::Release>,
    /// Whether it follows the control plane's release (`None`: it does when `kubernetes_version`
    /// is the control plane's).
    pub follow_control_plane: Option<bool>,
    pub max_surge: Option<i64>,
}

fn required<T>(field: &str, value: Option<T>) -> Result<T, FieldError> {
    value.ok_or_else(|| FieldError::new(field, format!("{field} is required")))
}

fn check_name(name: &str) -> Result<(), FieldError> {
    let bytes = name.as_bytes();
    let label = (1..=NAME_MAX).contains(&bytes.len())
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-');
    if !label {
        return Err(FieldError::new(
            "name",
            format!(
                "name must be a lowercase DNS label of 1–{NAME_MAX} characters (a-z, 0-9, '-', starting and ending alphanumeric)"
            ),
        ));
    }
    if name == CONTROL_PLANE_GROUP {
        return Err(FieldError::new(
            "name",
            format!("name `{CONTROL_PLANE_GROUP}` is the control plane's"),
        ));
    }
    Ok(())
}

fn check_count(count: i64) -> Result<i64, FieldError> {
    if COUNT.contains(&count) {
        Ok(count)
    } else {
        Err(FieldError::new(
            "count",
            format!("count must be between 0 and 1000, not {count}"),
        ))
    }
}

fn check_max_surge(max_surge: i64) -> Result<i64, FieldError> {
    if MAX_SURGE.contains(&max_surge) {
        Ok(max_surge)
    } else {
        Err(FieldError::new(
            "max_surge",
            format!(
                "max_surge must be between {} and {}, not {max_surge} (how many new workers a \
                 replacement makes before old ones go; 0 takes one old worker down at a time \
                 before making its replacement)",
                MAX_SURGE.start(),
                MAX_SURGE.end()
            ),
        ))
    }
}

fn positive(field: &str, value: i64) -> Result<i64, FieldError> {
    if value > 0 {
        Ok(value)
    } else {
        Err(FieldError::new(field, format!("{field} must be positive")))
    }
}

fn labels_json(labels: &BTreeMap<String, String>) -> Result<String, FieldError> {
    if labels.len() > 64 {
        return Err(FieldError::new("labels", "at most 64 labels"));
    }
    for (key, value) in labels {
        NodeLabel::new(key, value)
            .map_err(|e| FieldError::new(&format!("labels.{key}"), e.to_string()))?;
    }
    serde_json::to_string(labels).map_err(|e| FieldError::new("labels", e.to_string()))
}

fn taints_json(taints: &[TaintRequest]) -> Result<String, FieldError> {
    if taints.len() > 64 {
        return Err(FieldError::new("taints", "at most 64 taints"));
    }
    let mut seen = std::collections::BTreeSet::new();
    for (index, t) in taints.iter().enumerate() {
        let field = format!("taints[{index}]");
        Taint::new(&t.key, &t.value, &t.effect)
            .map_err(|e| FieldError::new(&field, e.to_string()))?;
        if !seen.insert((&t.key, &t.effect)) {
            return Err(FieldError::new(
                &field,
                format!(
                    "taint `{}:{}` is given twice (Kubernetes allows one per key and effect)",
                    t.key, t.effect
                ),
            ));
        }
    }
    serde_json::to_string(taints).map_err(|e| FieldError::new("taints", e.to_string()))
}

impl Validate for CreatePoolRequest {
    type Valid = PoolSpec;

    fn validate(self) -> Result<PoolSpec, FieldError> {
        let name = required("name", self.name)?;
        check_name(&name)?;
        let count = check_count(required("count", self.count)?)?;
        let instance_type = required("instance_type", self.instance_type)?;
        let valid_type = (1..=64).contains(&instance_type.len())
            && instance_type.as_bytes()[0].is_ascii_alphanumeric()
            && instance_type
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
        if !valid_type {
            return Err(FieldError::new(
                "instance_type",
                "instance_type must be 1–64 of A-Z, a-z, 0-9, '.', '_', '-', starting alphanumeric",
            ));
        }
        Ok(PoolSpec {
            name,
            count,
            instance_type,
            image_id: positive("image_id", required("image_id", self.image_id)?)?,
            subnet_id: positive("subnet_id", required("subnet_id", self.subnet_id)?)?,
            registration: Registration {
                labels_json: labels_json(&self.labels.unwrap_or_default())?,
                taints_json: taints_json(&self.taints.unwrap_or_default())?,
            },
            max_surge: check_max_surge(self.max_surge.unwrap_or(1))?,
        })
    }
}

impl Validate for UpdatePoolRequest {
    type Valid = PoolUpdate;

    fn validate(self) -> Result<PoolUpdate, FieldError> {
        if self.count.is_none()
            && self.labels.is_none()
            && self.taints.is_none()
            && self.kubernetes_version.is_none()
            && self.follow_control_plane.is_none()
            && self.max_surge.is_none()
        {
            return Err(FieldError::new(
                "count",
                "nothing to change: give count, labels, taints, kubernetes_version, \
                 follow_control_plane or max_surge",
            ));
        }
        Ok(PoolUpdate {
            count: self.count.map(check_count).transpose()?,
            labels_json: self.labels.as_ref().map(labels_json).transpose()?,
            taints_json: self.taints.as_deref().map(taints_json).transpose()?,
            kubernetes_version: self
                .kubernetes_version
                .as_deref()
                .map(|v| {
                    v.parse().map_err(|e: crate::upgrade::skew::NotARelease| {
                        FieldError::new("kubernetes_version", e.to_string())
                    })
                })
                .transpose()?,
            follow_control_plane: self.follow_control_plane,
            max_surge: self.max_surge.map(check_max_surge).transpose()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn create(body: serde_json::Value) -> Result<PoolSpec, FieldError> {
        serde_json::from_value::<CreatePoolRequest>(body)
            .unwrap()
            .validate()
    }

    fn good() -> serde_json::Value {
        json!({"name": "blue", "count": 3, "instance_type": "e2.medium", "image_id": 42, "subnet_id": 5})
    }

    #[test]
    fn a_complete_request_passes_with_empty_registration() {
        let spec = create(good()).unwrap();
        assert_eq!(spec.count, 3);
        assert_eq!(spec.registration.labels_json, "{}");
        assert_eq!(spec.registration.taints_json, "[]");
        assert_eq!(spec.max_surge, 1);
    }

    #[test]
    fn every_bad_field_is_named() {
        let cases: Vec<(&str, serde_json::Value, &str)> = vec![
            ("name", json!(null), "name is required"),
            ("name", json!("Blue"), "lowercase DNS label"),
            ("name", json!("cp"), "control plane"),
            ("name", json!("a".repeat(41)), "1–40"),
            ("count", json!(1001), "between 0 and 1000"),
            ("count", json!(-1), "between 0 and 1000"),
            ("instance_type", json!("e2 medium"), "instance_type must"),
            ("image_id", json!(0), "positive"),
            ("subnet_id", json!(null), "subnet_id is required"),
            ("max_surge", json!(-1), "between 0 and 10"),
            ("max_surge", json!(11), "between 0 and 10"),
        ];
        for (field, value, says) in cases {
            let mut body = good();
            body[field] = value;
            let e = create(body).unwrap_err();
            assert_eq!(e.field, field, "{e:?}");
            assert!(e.message.contains(says), "{field}: {}", e.message);
        }
    }

    #[test]
    fn labels_and_taints_are_checked_and_named() {
        let mut body = good();
        body["labels"] = json!({"node-role.kubernetes.io/worker": ""});
        let e = create(body).unwrap_err();
        assert_eq!(e.field, "labels.node-role.kubernetes.io/worker");
        assert!(e.message.contains("NodeRestriction"), "{}", e.message);

        let mut body = good();
        body["taints"] = json!([{"key": "dedicated", "value": "gpu", "effect": "NoSchedule"},
                                {"key": "x", "effect": "Sometimes"}]);
        assert_eq!(create(body).unwrap_err().field, "taints[1]");

        let mut body = good();
        body["taints"] = json!([{"key": "a", "effect": "NoSchedule"}, {"key": "a", "value": "b", "effect": "NoSchedule"}]);
        let e = create(body).unwrap_err();
        assert!(e.message.contains("twice"), "{}", e.message);
    }

    #[test]
    fn an_update_must_change_something_and_is_checked() {
        let none = UpdatePoolRequest::default().validate().unwrap_err();
        assert!(none.message.contains("nothing to change"));
        let bad = UpdatePoolRequest {
            count: Some(5000),
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "count");
        let ok = UpdatePoolRequest {
            count: Some(0),
            ..Default::default()
        };
        assert_eq!(ok.validate().unwrap().count, Some(0));
        let surge = UpdatePoolRequest {
            max_surge: Some(3),
            ..Default::default()
        };
        assert_eq!(surge.validate().unwrap().max_surge, Some(3));
        let none = UpdatePoolRequest {
            max_surge: Some(0),
            ..Default::default()
        };
        assert_eq!(none.validate().unwrap().max_surge, Some(0));
        let bad = UpdatePoolRequest {
            max_surge: Some(-1),
            ..Default::default()
        };
        assert_eq!(bad.validate().unwrap_err().field, "max_surge");
    }
}
