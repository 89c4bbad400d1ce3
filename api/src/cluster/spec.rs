//! A cluster's spec as it is stored (`clusters.spec_json`): what its machines are made of and
//! where they go, and how long its leaves last — the facts no column holds. Its name, size,
//! Kubernetes version and key algorithm have their own columns and are not repeated here.
//!
//! The stored text carries its version. [`Spec::from_stored`] reads every version ever written
//! (version 1 was the validated founding request, written without a version) and refuses what
//! it cannot use, naming why; [`Spec::to_stored`] writes the current one.

use serde::{Deserialize, Serialize};

/// Leaf certificates last a year unless the cluster says otherwise.
pub const DEFAULT_LEAF_LIFETIME_DAYS: i64 = 365;
/// The leaf lifetimes a cluster may ask for, in days.
pub const LEAF_LIFETIME_DAYS: std::ops::RangeInclusive<i64> = 1..=3650;

/// The version [`Spec::to_stored`] writes.
pub const VERSION: u32 = 2;

/// Where a cluster's machines go.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    pub zone_id: i64,
    /// The control plane's subnet (and a pool's unless it names its own).
    pub subnet_id: i64,
    /// Security groups asked for; the cluster's own group is added when it made one.
    pub security_group_ids: Vec<i64>,
    pub allocate_public_ipv4: bool,
    pub ssh_pubkey: Option<String>,
    pub root_volume_size_gib: i64,
}

/// What a control-plane machine is made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControlPlaneMachine {
    pub image_id: i64,
    pub instance_type: String,
}

/// The pod network a cluster's first node installs with its addons.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PodNetwork {
    /// Cilium, from its Helm chart (the default).
    #[default]
    Cilium,
    /// Flannel (VXLAN between nodes), from the manifest exk8s renders: each node's pods keep
    /// containerd's bridge on the node's `podCIDR`; flanneld routes the other nodes' ranges
    /// over VXLAN and masquerades traffic leaving the pod network.
    Flannel,
    /// None installed: the operator brings one. Until then each node's pods use containerd's
    /// bridge on the node's `podCIDR` (no traffic between nodes' pods).
    None,
}

impl PodNetwork {
    /// Every choice, as requests spell them.
    pub const ALL: [Self; 3] = [Self::Cilium, Self::Flannel, Self::None];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cilium => "cilium",
            Self::Flannel => "flannel",
            Self::None => "none",
        }
    }
}

impl std::str::FromStr for PodNetwork {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|n| n.as_str() == text)
            .ok_or_else(|| {
                format!(
                    "pod_network must be `cilium`, `flannel` or `none`, got `{}`",
                    text.chars().take(40).collect::<String>()
                )
            })
    }
}

/// A cluster's stored spec, current version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Spec {
    pub placement: Placement,
    pub control_plane: ControlPlaneMachine,
    /// Days every leaf certificate lasts.
    pub leaf_lifetime_days: i64,
    /// Clusters stored before the choice existed run Cilium.
    #[serde(default)]
    pub pod_network: PodNetwork,
}

/// Why a stored spec cannot be used (a defect or a newer API's row, never an operator's input).
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("the stored cluster spec is not valid JSON of version {version}: {message}")]
    Malformed { version: u32, message: String },
    #[error(
        "the stored cluster spec is of version {0}, newer than this API reads (up to {VERSION})"
    )]
    Unknown(u32),
    #[error("the stored cluster spec asks for leaves of {0} days (allowed: 1 to 3650)")]
    LeafLifetime(i64),
}

/// Version 1: the validated founding request as it was, without a version field.
#[derive(Deserialize)]
struct V1 {
    control_plane_image_id: i64,
    control_plane_instance_type: String,
    zone_id: i64,
    subnet_id: i64,
    security_group_ids: Vec<i64>,
    allocate_public_ipv4: bool,
    ssh_pubkey: Option<String>,
    root_volume_size_gib: i64,
    /// Clusters made before the setting existed have the default.
    #[serde(default = "default_leaf_lifetime_days")]
    leaf_lifetime_days: i64,
}

fn default_leaf_lifetime_days() -> i64 {
    DEFAULT_LEAF_LIFETIME_DAYS
}

impl From<V1> for Spec {
    fn from(v: V1) -> Self {
        Self {
            placement: Placement {
                zone_id: v.zone_id,
                subnet_id: v.subnet_id,
                security_group_ids: v.security_group_ids,
                allocate_public_ipv4: v.allocate_public_ipv4,
                ssh_pubkey: v.ssh_pubkey,
                root_volume_size_gib: v.root_volume_size_gib,
            },
            control_plane: ControlPlaneMachine {
                image_id: v.control_plane_image_id,
                instance_type: v.control_plane_instance_type,
            },
            leaf_lifetime_days: v.leaf_lifetime_days,
            pod_network: PodNetwork::Cilium,
        }
    }
}

/// Version 2 and later: the spec beside its version.
#[derive(Serialize, Deserialize)]
struct Versioned<S> {
    version: u32,
    #[serde(flatten)]
    spec: S,
}

impl Spec {
    /// Reads a stored spec of any version.
    pub fn from_stored(text: &str) -> Result<Self, SpecError> {
        #[derive(Deserialize)]
        struct Version {
            #[serde(default = "first")]
            version: u32,
        }
        fn first() -> u32 {
            1
        }
        let malformed = |version| {
            move |e: serde_json::Error| SpecError::Malformed {
                version,
                message: e.to_string(),
            }
        };
        let version = serde_json::from_str::<Version>(text)
            .map_err(malformed(0))?
            .version;
        let spec = match version {
            1 => serde_json::from_str::<V1>(text)
                .map_err(malformed(1))?
                .into(),
            VERSION => {
                serde_json::from_str::<Versioned<Spec>>(text)
                    .map_err(malformed(VERSION))?
                    .spec
            }
            newer => return Err(SpecError::Unknown(newer)),
        };
        if !LEAF_LIFETIME_DAYS.contains(&spec.leaf_lifetime_days) {
            return Err(SpecError::LeafLifetime(spec.leaf_lifetime_days));
        }
        Ok(spec)
    }

    /// The stored text of this spec, at the current version.
    pub fn to_stored(&self) -> String {
        let versioned = Versioned {
            version: VERSION,
            spec: self,
        };
        // Serialising plain structs of integers, strings and booleans cannot fail.
        serde_json::to_string(&versioned).unwrap_or_default()
    }

    /// How long every leaf lasts.
    pub fn leaf_lifetime(&self) -> time::Duration {
        time::Duration::days(self.leaf_lifetime_days)
    }

    /// The security groups a machine of the cluster joins: those asked for, then the
    /// cluster's own.
    pub fn security_groups(&self, own: Option<i64>) -> Vec<i64> {
        let mut groups = self.placement.security_group_ids.clone();
        groups.extend(own);
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A version-1 row as founding wrote it before leaf lifetimes were asked for.
    const V1_OLDEST: &str = r#"{"name":"prod","control_plane_count":3,"control_plane_image_id":7,"control_plane_instance_type":"e2.medium","zone_id":1,"subnet_id":42,"security_group_ids":[5],"allocate_public_ipv4":true,"ssh_pubkey":null,"root_volume_size_gib":20,"key_algorithm":"ecdsa-p256","kubernetes_version":"v1.35.3"}"#;

    fn v2_spec() -> Spec {
        Spec {
            placement: Placement {
                zone_id: 1,
                subnet_id: 42,
                security_group_ids: vec![5],
                allocate_public_ipv4: true,
                ssh_pubkey: None,
                root_volume_size_gib: 20,
            },
            control_plane: ControlPlaneMachine {
                image_id: 7,
                instance_type: "e2.medium".into(),
            },
            leaf_lifetime_days: 365,
            pod_network: PodNetwork::Cilium,
        }
    }

    #[test]
    fn version_1_rows_read_as_the_current_spec() {
        assert_eq!(Spec::from_stored(V1_OLDEST).unwrap(), v2_spec());
        let with_lifetime = V1_OLDEST.replace('}', r#","leaf_lifetime_days":30}"#);
        let spec = Spec::from_stored(&with_lifetime).unwrap();
        assert_eq!(spec.leaf_lifetime_days, 30);
        assert_eq!(spec.leaf_lifetime(), time::Duration::days(30));
    }

    #[test]
    fn the_current_version_round_trips_and_says_its_version() {
        let stored = v2_spec().to_stored();
        assert!(stored.starts_with(r#"{"version":2,"#), "{stored}");
        assert!(!stored.contains("kubernetes_version") && !stored.contains("name"));
        assert_eq!(Spec::from_stored(&stored).unwrap(), v2_spec());
        // A version-2 row written before the pod network was a choice runs Cilium.
        let before = stored.replace(r#","pod_network":"cilium""#, "");
        assert_ne!(before, stored);
        assert_eq!(Spec::from_stored(&before).unwrap(), v2_spec());
        for network in [PodNetwork::Flannel, PodNetwork::None] {
            let chosen = Spec {
                pod_network: network,
                ..v2_spec()
            };
            let stored = chosen.to_stored();
            let field = format!(r#""pod_network":"{}""#, network.as_str());
            assert!(stored.contains(&field), "{stored}");
            assert_eq!(Spec::from_stored(&stored).unwrap(), chosen);
            assert_eq!(network.as_str().parse::<PodNetwork>(), Ok(network));
        }
        let refused = "calico".parse::<PodNetwork>().unwrap_err();
        assert_eq!(
            refused,
            "pod_network must be `cilium`, `flannel` or `none`, got `calico`"
        );
    }

    #[test]
    fn what_cannot_be_used_is_refused_naming_why() {
        let newer = r#"{"version":3,"anything":true}"#;
        assert!(matches!(
            Spec::from_stored(newer),
            Err(SpecError::Unknown(3))
        ));
        let broken = Spec::from_stored(r#"{"version":2,"placement":{}}"#).unwrap_err();
        assert!(
            matches!(broken, SpecError::Malformed { version: 2, .. }),
            "{broken}"
        );
        assert!(matches!(
            Spec::from_stored("not json"),
            Err(SpecError::Malformed { version: 0, .. })
        ));
        let forever = V1_OLDEST.replace('}', r#","leaf_lifetime_days":99999}"#);
        assert!(matches!(
            Spec::from_stored(&forever),
            Err(SpecError::LeafLifetime(99999))
        ));
    }
}
