//! The console's action forms: what each action asks (its fields, with the values the cluster
//! has now as defaults), what it says it will do (the form is its confirmation), and the API
//! request a sent form becomes. Fields the operator leaves empty are left out of the request,
//! so the API's own defaults and messages apply.

use axum::http::Method;
use serde::Serialize;
use serde_json::{Map, Value};

use super::client::Refusal;
use crate::cluster::spec::PodNetwork;
use crate::pki::KeyAlgorithm;
use exk8s_api_types::{ClusterView, KubernetesVersionView};

/// What the console can ask of the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Action {
    Found,
    Snapshot,
    Renew,
    Scale,
    Upgrade,
    AddPool,
    ScalePool,
    Delete,
}

/// How an action presents itself.
#[derive(Debug, Serialize)]
pub(super) struct Words {
    pub title: &'static str,
    pub explains: &'static str,
    pub button: &'static str,
    /// Whether it destroys something (its button says so by its look too).
    pub danger: bool,
}

impl Action {
    /// The action a cluster page's path names (founding is not a cluster's action).
    pub(super) fn of_slug(slug: &str) -> Option<Self> {
        [
            Self::Snapshot,
            Self::Renew,
            Self::Scale,
            Self::Upgrade,
            Self::AddPool,
            Self::ScalePool,
            Self::Delete,
        ]
        .into_iter()
        .find(|a| a.slug() == slug)
    }

    pub(super) fn slug(self) -> &'static str {
        match self {
            Self::Found => "found",
            Self::Snapshot => "snapshot",
            Self::Renew => "renew",
            Self::Scale => "scale",
            Self::Upgrade => "upgrade",
            Self::AddPool => "add-pool",
            Self::ScalePool => "scale-pool",
            Self::Delete => "delete",
        }
    }

    pub(super) fn words(self) -> Words {
        let (title, explains, button) = match self {
            Self::Found => (
                "Found a cluster",
                "The API makes the cluster's certificate authorities and keys, starts its control-plane machines and follows them as their agents report; the cluster's page shows its progress.",
                "Found the cluster",
            ),
            Self::Snapshot => (
                "Take an etcd snapshot",
                "A healthy etcd member takes a snapshot at its next sync and uploads it to the API's store; the cluster's page lists it when it is stored.",
                "Take the snapshot",
            ),
            Self::Renew => (
                "Renew certificates",
                "Every node gets a new generation with fresh certificates from the same authorities, one node at a time and only while the others are healthy.",
                "Renew the certificates",
            ),
            Self::Scale => (
                "Scale the control plane",
                "Members join or leave etcd one at a time, each change waiting for the cluster to be healthy again.",
                "Scale the control plane",
            ),
            Self::Upgrade => (
                "Upgrade Kubernetes",
                "The control plane moves to the release one member at a time, the worker pools after it; the skew policy decides which releases may follow the one the cluster runs.",
                "Start the upgrade",
            ),
            Self::AddPool => (
                "Add a worker pool",
                "The API starts the pool's machines; each joins the cluster as its agent applies its bundle.",
                "Add the pool",
            ),
            Self::ScalePool => (
                "Scale a worker pool",
                "Machines are added, or drained and removed, until the pool has the count asked for.",
                "Scale the pool",
            ),
            Self::Delete => (
                "Delete the cluster",
                "Every machine of the cluster is deleted with its disks, and its records go. Its snapshots go with it. This cannot be undone.",
                "Delete the cluster",
            ),
        };
        Words {
            title,
            explains,
            button,
            danger: self == Self::Delete,
        }
    }
}

/// How a field is asked and what its value becomes in the API's request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum Kind {
    /// A whole number.
    Number,
    /// Free text, sent as a string.
    Text,
    /// One of `choices`, sent as a string.
    Choice,
    /// One of `choices`, sent as a whole number.
    NumberChoice,
    /// Yes or no, sent as a boolean.
    Check,
    /// Checked by the console, not sent (the name typed to confirm a delete).
    Confirm,
}

/// One choice of a [`Kind::Choice`] field.
#[derive(Debug, Serialize)]
pub(super) struct Choice {
    pub value: String,
    pub label: String,
}

/// One field of a form: its name is the API request's field.
#[derive(Debug, Serialize)]
pub(super) struct Field {
    pub name: &'static str,
    pub label: &'static str,
    pub kind: Kind,
    pub value: String,
    pub choices: Vec<Choice>,
    pub help: &'static str,
}

impl Field {
    fn new(name: &'static str, label: &'static str, kind: Kind, value: impl Into<String>) -> Self {
        Self {
            name,
            label,
            kind,
            value: value.into(),
            choices: Vec::new(),
            help: "",
        }
    }

    fn help(mut self, help: &'static str) -> Self {
        self.help = help;
        self
    }

    fn choices<I: IntoIterator<Item = (String, String)>>(mut self, choices: I) -> Self {
        self.choices = choices
            .into_iter()
            .map(|(value, label)| Choice { value, label })
            .collect();
        self
    }
}

/// What the forms are filled from: the cluster as it is (none when founding) and the releases
/// the API offers.
pub(super) struct Known<'a> {
    pub cluster: Option<&'a ClusterView>,
    pub versions: &'a [KubernetesVersionView],
    /// The pool a pool's action is about.
    pub pool: Option<&'a str>,
}

fn same(items: &[&str]) -> Vec<(String, String)> {
    items
        .iter()
        .map(|i| ((*i).to_owned(), (*i).to_owned()))
        .collect()
}

/// `action`'s fields, each with its default.
pub(super) fn fields(action: Action, known: &Known<'_>) -> Vec<Field> {
    let releases = || {
        known.versions.iter().map(|v| {
            let label = if v.default {
                format!("{} (default)", v.version)
            } else {
                v.version.clone()
            };
            (v.version.clone(), label)
        })
    };
    let default_release = known
        .versions
        .iter()
        .find(|v| v.default)
        .map(|v| v.version.clone())
        .unwrap_or_default();
    let pool_count = known
        .cluster
        .zip(known.pool)
        .and_then(|(c, pool)| c.node_pools.iter().find(|p| p.name == pool))
        .map(|p| p.desired.to_string())
        .unwrap_or_default();
    match action {
        Action::Found => vec![
            Field::new("name", "Name", Kind::Text, "")
                .help("Lower-case letters, digits and '-'; the API names it when empty."),
            Field::new(
                "kubernetes_version",
                "Kubernetes",
                Kind::Choice,
                default_release,
            )
            .choices(releases()),
            Field::new(
                "control_plane_count",
                "Control-plane members",
                Kind::NumberChoice,
                "1",
            )
            .choices(same(&["1", "3"])),
            Field::new(
                "pod_network",
                "Pod network",
                Kind::Choice,
                PodNetwork::default().as_str(),
            )
            .choices(same(&PodNetwork::ALL.map(PodNetwork::as_str))),
            Field::new(
                "key_algorithm",
                "Key algorithm",
                Kind::Choice,
                KeyAlgorithm::default().as_str(),
            )
            .choices(same(&KeyAlgorithm::ALL.map(KeyAlgorithm::as_str))),
            Field::new(
                "control_plane_instance_type",
                "Instance type",
                Kind::Text,
                "",
            ),
            Field::new("control_plane_image_id", "Image id", Kind::Number, "")
                .help("The node image, with exk8s-agent, the machines boot from."),
            Field::new("zone_id", "Zone id", Kind::Number, "").help("Zone 1 when empty."),
            Field::new("subnet_id", "Subnet id", Kind::Number, ""),
            Field::new("ssh_pubkey", "SSH public key", Kind::Text, "")
                .help("An OpenSSH public key line for the machines' admin user; none when empty."),
        ],
        Action::Snapshot | Action::Renew => Vec::new(),
        Action::Scale => vec![
            Field::new(
                "control_plane_count",
                "Control-plane members",
                Kind::NumberChoice,
                known
                    .cluster
                    .map(|c| c.replicas.to_string())
                    .unwrap_or_default(),
            )
            .choices(same(&["1", "3", "5", "7"])),
        ],
        Action::Upgrade => vec![
            Field::new(
                "kubernetes_version",
                "Kubernetes",
                Kind::Choice,
                known
                    .cluster
                    .map(|c| c.kubernetes_version.clone())
                    .unwrap_or_default(),
            )
            .choices(releases()),
            Field::new(
                "snapshot_first",
                "Take an etcd snapshot first",
                Kind::Check,
                "on",
            ),
        ],
        Action::AddPool => vec![
            Field::new("name", "Name", Kind::Text, "")
                .help("Lower-case letters, digits and '-'; the API names it when empty."),
            Field::new("count", "Machines", Kind::Number, "1"),
            Field::new("instance_type", "Instance type", Kind::Text, "")
                .help("The control plane's when empty."),
            Field::new("image_id", "Image id", Kind::Number, "")
                .help("The control plane's when empty."),
            Field::new("subnet_id", "Subnet id", Kind::Number, "")
                .help("The control plane's when empty."),
        ],
        Action::ScalePool => vec![Field::new("count", "Machines", Kind::Number, pool_count)],
        Action::Delete => vec![
            Field::new(
                "confirm",
                "The cluster's name, to confirm",
                Kind::Confirm,
                "",
            )
            .help("Type the name exactly as the page shows it."),
        ],
    }
}

/// The values of a sent form in `fields` (a check box is sent only when checked).
pub(super) fn fill(fields: &mut [Field], sent: impl Fn(&str) -> Option<String>) {
    for field in fields {
        field.value = match (field.kind, sent(field.name)) {
            (Kind::Check, Some(_)) => "on".to_owned(),
            (_, Some(value)) => value,
            (_, None) => String::new(),
        };
    }
}

/// The API request's JSON body from the filled `fields`: empty fields left out; a number that
/// is not one is refused naming its field.
pub(super) fn body(fields: &[Field]) -> Result<Value, Refusal> {
    let mut body = Map::new();
    for field in fields {
        let value = field.value.trim();
        let json = match field.kind {
            Kind::Confirm => continue,
            Kind::Check => Value::Bool(value == "on"),
            _ if value.is_empty() => continue,
            Kind::Number | Kind::NumberChoice => match value.parse::<i64>() {
                Ok(n) => Value::from(n),
                Err(_) => {
                    return Err(Refusal {
                        message: format!("{} must be a whole number, got {value:?}", field.name),
                        field: Some(field.name.to_owned()),
                    });
                }
            },
            Kind::Text | Kind::Choice => Value::String(value.to_owned()),
        };
        body.insert(field.name.to_owned(), json);
    }
    Ok(Value::Object(body))
}

/// Whether `name` can be a pool's name, and so one segment of a path as it is (the API names
/// pools with lower-case letters, digits and '-').
pub(super) fn pool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// The API request `action` on `cluster_id` makes (`pool`, checked by [`pool_name`], for a
/// pool's action): its method, path and whether it sends the form as its body.
pub(super) fn request(
    action: Action,
    cluster_id: i64,
    pool: Option<&str>,
) -> (Method, String, bool) {
    let pool = pool.unwrap_or_default();
    match action {
        Action::Found => (Method::POST, "/clusters".to_owned(), true),
        Action::Snapshot => (
            Method::POST,
            format!("/clusters/{cluster_id}/snapshots"),
            false,
        ),
        Action::Renew => (
            Method::POST,
            format!("/clusters/{cluster_id}/certificates/renew"),
            false,
        ),
        Action::Scale | Action::Upgrade => (Method::PATCH, format!("/clusters/{cluster_id}"), true),
        Action::AddPool => (
            Method::POST,
            format!("/clusters/{cluster_id}/node-pools"),
            true,
        ),
        Action::ScalePool => (
            Method::PATCH,
            format!("/clusters/{cluster_id}/node-pools/{pool}"),
            true,
        ),
        Action::Delete => (Method::DELETE, format!("/clusters/{cluster_id}"), false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cluster_action_is_named_by_its_slug_and_founding_is_not() {
        for action in [
            Action::Snapshot,
            Action::Renew,
            Action::Scale,
            Action::Upgrade,
            Action::AddPool,
            Action::ScalePool,
            Action::Delete,
        ] {
            assert_eq!(Action::of_slug(action.slug()), Some(action));
        }
        assert_eq!(Action::of_slug("found"), None);
        assert_eq!(Action::of_slug("Delete"), None);
    }

    #[test]
    fn a_sent_form_becomes_the_api_request_with_empty_fields_left_out() {
        let k = Known {
            cluster: None,
            versions: &[],
            pool: None,
        };
        let mut fields = fields(Action::Found, &k);
        let sent = [
            ("name", "shop"),
            ("control_plane_count", "3"),
            ("pod_network", "flannel"),
            ("control_plane_image_id", " 7 "),
            ("zone_id", ""),
        ];
        fill(&mut fields, |name| {
            sent.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        });
        let json = body(&fields).unwrap();
        assert_eq!(
            json,
            serde_json::json!({"name": "shop", "control_plane_count": 3,
                               "pod_network": "flannel", "control_plane_image_id": 7})
        );
    }

    #[test]
    fn a_number_that_is_not_one_is_refused_naming_its_field() {
        let mut fields = vec![Field::new("count", "Machines", Kind::Number, "")];
        fill(&mut fields, |_| Some("three".to_owned()));
        let refused = body(&fields).unwrap_err();
        assert_eq!(refused.field.as_deref(), Some("count"));
        assert_eq!(
            refused.message,
            "count must be a whole number, got \"three\""
        );
    }

    #[test]
    fn a_check_box_is_false_when_not_sent_and_a_confirmation_is_never_sent() {
        let mut fields = vec![
            Field::new("snapshot_first", "", Kind::Check, "on"),
            Field::new("confirm", "", Kind::Confirm, ""),
        ];
        fill(&mut fields, |name| {
            (name == "confirm").then(|| "shop".to_owned())
        });
        assert_eq!(
            body(&fields).unwrap(),
            serde_json::json!({"snapshot_first": false})
        );
    }

    #[test]
    fn a_pool_name_is_one_path_segment() {
        assert!(pool_name("workers-2"));
        for bad in ["", "a/b", "a b", "..", "A", "x?y", &"a".repeat(64)] {
            assert!(!pool_name(bad), "{bad:?}");
        }
        let (_, path, _) = request(Action::ScalePool, 4, Some("workers-2"));
        assert_eq!(path, "/clusters/4/node-pools/workers-2");
        let (method, path, sends) = request(Action::Delete, 4, None);
        assert_eq!(
            (method, path.as_str(), sends),
            (Method::DELETE, "/clusters/4", false)
        );
    }
}
