//! What `exk8s-capi run` may do in a management cluster, as RBAC: a `ClusterRole` of exactly the
//! verbs its controllers use, and a `ClusterRoleBinding` granting it to the identity it runs as
//! (a service account in a pod, or the user of its kubeconfig's client certificate).

use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::ObjectMeta;

/// The role's and the binding's name.
pub const NAME: &str = "exk8s-capi";

/// Who the controller runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    ServiceAccount { namespace: String, name: String },
    User(String),
}

impl std::str::FromStr for Identity {
    type Err = String;

    /// `NAMESPACE/NAME` for a service account.
    fn from_str(text: &str) -> Result<Self, String> {
        let (namespace, name) = text.split_once('/').ok_or_else(|| {
            format!("{text:?} is not NAMESPACE/NAME (the service account the controller runs as)")
        })?;
        let label = |part: &str| {
            (1..=63).contains(&part.len())
                && part
                    .bytes()
                    .next()
                    .is_some_and(|b| b.is_ascii_alphanumeric())
                && part
                    .bytes()
                    .last()
                    .is_some_and(|b| b.is_ascii_alphanumeric())
                && part
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        if !label(namespace) || !label(name) {
            return Err(format!(
                "{text:?}: the namespace and the name must each be a DNS label (1-63 of a-z, 0-9 \
                 and '-', starting and ending with a letter or digit)"
            ));
        }
        Ok(Self::ServiceAccount {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let owned = |items: &[&str]| Some(items.iter().map(|s| (*s).to_owned()).collect());
    PolicyRule {
        api_groups: owned(&[group]),
        resources: owned(resources),
        verbs: verbs.iter().map(|s| (*s).to_owned()).collect(),
        ..PolicyRule::default()
    }
}

/// The controller's permissions: its own kinds (read, their finalizers and spec fields it sets,
/// their status), Cluster API's `Cluster` and `MachinePool` (read), and Secrets (the
/// credentials it reads, the kubeconfig Secrets it writes).
pub fn cluster_role() -> ClusterRole {
    const READ: [&str; 3] = ["get", "list", "watch"];
    const WRITE: [&str; 5] = ["get", "list", "watch", "patch", "update"];
    ClusterRole {
        metadata: ObjectMeta {
            name: Some(NAME.to_owned()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![
            rule(
                "controlplane.cluster.x-k8s.io",
                &["exk8scontrolplanes", "exk8scontrolplanes/status"],
                &WRITE,
            ),
            rule(
                "infrastructure.cluster.x-k8s.io",
                &[
                    "exk8sclusters",
                    "exk8sclusters/status",
                    "exk8smachinepools",
                    "exk8smachinepools/status",
                ],
                &WRITE,
            ),
            rule("cluster.x-k8s.io", &["clusters", "machinepools"], &READ),
            rule(
                "",
                &["secrets"],
                &["get", "list", "watch", "create", "patch"],
            ),
        ]),
        ..ClusterRole::default()
    }
}

/// The binding of [`cluster_role`] to `identity`.
pub fn binding(identity: &Identity) -> ClusterRoleBinding {
    let subject = match identity {
        Identity::ServiceAccount { namespace, name } => Subject {
            kind: "ServiceAccount".into(),
            name: name.clone(),
            namespace: Some(namespace.clone()),
            ..Subject::default()
        },
        Identity::User(name) => Subject {
            kind: "User".into(),
            name: name.clone(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Subject::default()
        },
    };
    ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(NAME.to_owned()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: NAME.into(),
        },
        subjects: Some(vec![subject]),
    }
}

/// Both as YAML documents, for `kubectl apply -f -`.
pub fn rbac_yaml(identity: &Identity) -> Result<String, yaml_serde::Error> {
    let mut out = String::new();
    for document in [
        yaml_serde::to_string(&with_kind(&cluster_role(), "ClusterRole")?)?,
        yaml_serde::to_string(&with_kind(&binding(identity), "ClusterRoleBinding")?)?,
    ] {
        out.push_str("---\n");
        out.push_str(&document);
    }
    Ok(out)
}

/// `object` with its `apiVersion` and `kind` first (k8s-openapi's types serialize neither).
fn with_kind(
    object: &impl serde::Serialize,
    kind: &str,
) -> Result<serde_json::Value, yaml_serde::Error> {
    let mut value = serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
    });
    let body =
        serde_json::to_value(object).map_err(<yaml_serde::Error as serde::ser::Error>::custom)?;
    if let (Some(out), serde_json::Value::Object(fields)) = (value.as_object_mut(), body) {
        out.extend(fields);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_account_is_namespace_slash_name() {
        assert_eq!(
            "capi-system/exk8s-capi".parse::<Identity>(),
            Ok(Identity::ServiceAccount {
                namespace: "capi-system".into(),
                name: "exk8s-capi".into()
            })
        );
        for bad in ["exk8s-capi", "/x", "a/", "A/b", "a/b/c"] {
            let error = bad.parse::<Identity>().unwrap_err();
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn the_yaml_names_its_kinds_and_binds_the_role() {
        let yaml = rbac_yaml(&Identity::User("exk8s-capi".into())).unwrap();
        assert!(yaml.contains("kind: ClusterRole\n"), "{yaml}");
        assert!(yaml.contains("kind: ClusterRoleBinding\n"), "{yaml}");
        assert!(
            yaml.contains("apiVersion: rbac.authorization.k8s.io/v1"),
            "{yaml}"
        );
    }
}
