//! Kubernetes node labels and taints as a worker pool may ask for them, checked to the letter
//! of Kubernetes (label keys: an optional DNS-subdomain prefix and a name of at most 63
//! characters; values: at most 63; taint effects: NoSchedule, PreferNoSchedule, NoExecute) and
//! of the NodeRestriction admission plugin: a kubelet may set labels under `kubernetes.io` or
//! `k8s.io` only in the namespaces it allows, or its node registration is refused.

use std::fmt;

/// Label-key prefixes under kubernetes.io / k8s.io a kubelet may set (NodeRestriction).
const KUBELET_SETTABLE: &[&str] = &["kubelet.kubernetes.io", "node.kubernetes.io"];
/// Well-known labels under kubernetes.io a kubelet may set itself.
const KUBELET_SETTABLE_KEYS: &[&str] = &[
    "kubernetes.io/hostname",
    "kubernetes.io/arch",
    "kubernetes.io/os",
    "beta.kubernetes.io/arch",
    "beta.kubernetes.io/os",
    "beta.kubernetes.io/instance-type",
    "node.kubernetes.io/instance-type",
    "failure-domain.beta.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// Why a label or taint was refused (the caller names the field).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LabelError(String);

fn bad(what: &str, value: &str, rule: &str) -> LabelError {
    LabelError(format!(
        "{what} `{}` {rule}",
        value.chars().take(80).collect::<String>()
    ))
}

/// `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, at most 63 characters.
fn is_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes[0].is_ascii_alphanumeric()
        && bytes[bytes.len() - 1].is_ascii_alphanumeric()
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// A lowercase RFC 1123 subdomain of at most 253 characters.
fn is_subdomain(text: &str) -> bool {
    text.len() <= 253
        && text.split('.').all(|label| {
            let b = label.as_bytes();
            (1..=63).contains(&b.len())
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// A label key: `[prefix/]name`.
fn check_key(what: &str, key: &str) -> Result<(), LabelError> {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        if !is_subdomain(prefix) {
            return Err(bad(
                what,
                key,
                "has a prefix that is not a lowercase DNS subdomain",
            ));
        }
    }
    if !is_name(name) {
        return Err(bad(
            what,
            key,
            "must be at most 63 of A-Z, a-z, 0-9, '-', '_', '.' after an optional `prefix/`, starting and ending alphanumeric",
        ));
    }
    Ok(())
}

fn check_value(what: &str, value: &str) -> Result<(), LabelError> {
    if value.is_empty() || is_name(value) {
        Ok(())
    } else {
        Err(bad(
            what,
            value,
            "must be empty or at most 63 of A-Z, a-z, 0-9, '-', '_', '.', starting and ending alphanumeric",
        ))
    }
}

/// One node label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct NodeLabel {
    key: String,
    value: String,
}

impl NodeLabel {
    /// Checks the key and value, and that a kubelet may set the key (NodeRestriction).
    pub fn new(key: &str, value: &str) -> Result<Self, LabelError> {
        check_key("label key", key)?;
        check_value("label value", value)?;
        if let Some((prefix, _)) = key.split_once('/') {
            let reserved = ["kubernetes.io", "k8s.io"]
                .iter()
                .any(|r| prefix == *r || prefix.ends_with(&format!(".{r}")));
            let allowed = KUBELET_SETTABLE
                .iter()
                .any(|a| prefix == *a || prefix.ends_with(&format!(".{a}")))
                || KUBELET_SETTABLE_KEYS.contains(&key);
            if reserved && !allowed {
                return Err(bad(
                    "label key",
                    key,
                    "is in a kubernetes.io/k8s.io namespace a kubelet may not set (NodeRestriction); use node.kubernetes.io/, kubelet.kubernetes.io/ or your own prefix",
                ));
            }
        }
        Ok(Self {
            key: key.to_owned(),
            value: value.to_owned(),
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for NodeLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.key, self.value)
    }
}

/// What a taint does to pods that do not tolerate it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

impl TaintEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::NoSchedule => "NoSchedule",
            Self::PreferNoSchedule => "PreferNoSchedule",
            Self::NoExecute => "NoExecute",
        }
    }
}

/// One node taint.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Taint {
    key: String,
    value: String,
    effect: TaintEffect,
}

impl Taint {
    /// What every control-plane node registers with, as Kubernetes names it: only pods that
    /// tolerate it (the addons do) are scheduled there.
    pub fn control_plane() -> Self {
        Self {
            key: "node-role.kubernetes.io/control-plane".into(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        }
    }

    pub fn new(key: &str, value: &str, effect: &str) -> Result<Self, LabelError> {
        check_key("taint key", key)?;
        check_value("taint value", value)?;
        let effect = match effect {
            "NoSchedule" => TaintEffect::NoSchedule,
            "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
            "NoExecute" => TaintEffect::NoExecute,
            other => {
                return Err(bad(
                    "taint effect",
                    other,
                    "must be NoSchedule, PreferNoSchedule or NoExecute",
                ));
            }
        };
        Ok(Self {
            key: key.to_owned(),
            value: value.to_owned(),
            effect,
        })
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn value(&self) -> &str {
        &self.value
    }

    pub fn effect(&self) -> TaintEffect {
        self.effect
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_follow_kubernetes_and_node_restriction() {
        for (key, value) in [
            ("pool", "blue"),
            ("example.com/tier", "batch-1"),
            ("node.kubernetes.io/pool", "a"),
            ("kubelet.kubernetes.io/x", ""),
            ("topology.kubernetes.io/zone", "z1"),
            ("A_b.c-9", "V.v_1"),
        ] {
            assert!(NodeLabel::new(key, value).is_ok(), "{key}={value}");
        }
        for (key, value) in [
            ("", "x"),
            ("-pool", "x"),
            ("pool", "-x"),
            ("pool", &"v".repeat(64)),
            (&"k".repeat(64), "x"),
            ("Example.com/tier", "x"),
            ("a/b/c", "x"),
            ("node-role.kubernetes.io/worker", ""),
            ("kubernetes.io/team", "x"),
            ("sub.k8s.io/x", "y"),
            ("node-restriction.kubernetes.io/x", "y"),
        ] {
            assert!(NodeLabel::new(key, value).is_err(), "{key}={value}");
        }
    }

    #[test]
    fn taints_need_a_key_and_a_known_effect() {
        let taint = Taint::new("dedicated", "gpu", "NoSchedule").unwrap();
        assert_eq!(taint.effect().as_str(), "NoSchedule");
        assert!(Taint::new("example.com/spot", "", "NoExecute").is_ok());
        assert!(Taint::new("dedicated", "gpu", "Never").is_err());
        assert!(Taint::new("", "gpu", "NoSchedule").is_err());
        assert!(Taint::new("dedicated", "a b", "NoSchedule").is_err());
    }
}
