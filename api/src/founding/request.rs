//! The `POST /clusters` contract: shape and placement only. The org comes from the token; the
//! PKI, ids and node records are the API's to make. Every field is checked here with a message
//! naming it, before anything expensive or external happens.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};

pub use exk8s_api_types::{CreateClusterRequest, SuppliedCaRequest, SuppliedCasRequest};

use crate::cluster::spec::{
    ControlPlaneMachine, DEFAULT_LEAF_LIFETIME_DAYS, LEAF_LIFETIME_DAYS, Placement, PodNetwork,
    Spec,
};
use crate::field::FieldError;
use crate::pki::KeyAlgorithm;

/// A request that passed every check, with defaults applied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSpecRequest {
    /// The name asked for; `None`: the API names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub control_plane_count: i64,
    pub control_plane_image_id: i64,
    pub control_plane_instance_type: String,
    pub zone_id: i64,
    pub subnet_id: i64,
    pub security_group_ids: Vec<i64>,
    pub allocate_public_ipv4: bool,
    pub ssh_pubkey: Option<String>,
    pub root_volume_size_gib: i64,
    pub key_algorithm: KeyAlgorithm,
    pub kubernetes_version: String,
    /// Stored clusters made before the setting existed have the default.
    #[serde(default = "default_leaf_lifetime_days")]
    pub leaf_lifetime_days: i64,
    /// Stored requests made before the choice existed run Cilium.
    #[serde(default)]
    pub pod_network: PodNetwork,
}

fn default_leaf_lifetime_days() -> i64 {
    DEFAULT_LEAF_LIFETIME_DAYS
}

const MAX_SECURITY_GROUPS: usize = 5;
const ROOT_VOLUME_GIB: std::ops::RangeInclusive<i64> = 10..=2048;

fn positive(field: &str, value: Option<i64>, default: Option<i64>) -> Result<i64, FieldError> {
    match value.or(default) {
        None => Err(FieldError::new(field, format!("{field} is required"))),
        Some(v) if v <= 0 => Err(FieldError::new(
            field,
            format!("{field} must be a positive integer, got {v}"),
        )),
        Some(v) => Ok(v),
    }
}

/// Key types OpenSSH accepts in `authorized_keys`.
const SSH_KEY_TYPES: &[&str] = &[
    "ssh-ed25519",
    "ssh-rsa",
    "ecdsa-sha2-nistp256",
    "ecdsa-sha2-nistp384",
    "ecdsa-sha2-nistp521",
    "sk-ssh-ed25519@openssh.com",
    "sk-ecdsa-sha2-nistp256@openssh.com",
];

/// Checks an OpenSSH public key line: a known type, base64 whose decoded blob starts with the
/// same length-prefixed type name, an optional comment, no control characters.
pub fn validate_ssh_pubkey(line: &str) -> Result<(), String> {
    if line.len() > 8192 {
        return Err("is longer than 8192 bytes".into());
    }
    if line.chars().any(|c| c.is_control()) {
        return Err("contains a control character or line break".into());
    }
    let mut words = line.split(' ');
    let kind = words.next().unwrap_or_default();
    if !SSH_KEY_TYPES.contains(&kind) {
        return Err(format!(
            "does not start with a known key type ({})",
            SSH_KEY_TYPES.join(", ")
        ));
    }
    let blob = BASE64
        .decode(words.next().unwrap_or_default())
        .map_err(|_| "the key data is not valid base64".to_owned())?;
    let declared = blob
        .get(..4)
        .map(|n| u32::from_be_bytes([n[0], n[1], n[2], n[3]]) as usize)
        .and_then(|n| blob.get(4..4 + n))
        .ok_or_else(|| "the key data is truncated".to_owned())?;
    if declared != kind.as_bytes() {
        return Err("the key data does not match its key type".into());
    }
    if blob.len() < 4 + kind.len() + 16 {
        return Err("the key data is too short to hold a key".into());
    }
    Ok(())
}

/// Checks a cluster name the operator asks for (see [`CreateClusterRequest::name`]).
pub fn validate_name(name: &str) -> Result<(), FieldError> {
    let refuse = |why: &str| {
        Err(FieldError::new(
            "name",
            format!("name `{}` {why}", name.chars().take(60).collect::<String>()),
        ))
    };
    if name.is_empty() || name.len() > MAX_NAME {
        return refuse(&format!("must be 1–{MAX_NAME} characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return refuse("may hold only a-z, 0-9 and '-'");
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) || name.ends_with('-') {
        return refuse("must start with a letter and not end with '-'");
    }
    if name.starts_with(GENERATED_PREFIX) {
        return refuse(&format!(
            "starts with `{GENERATED_PREFIX}`, kept for the names the API gives"
        ));
    }
    Ok(())
}

const MAX_NAME: usize = 40;
/// Names the API gives start with it (`exk8s-<org>-<id hex>`).
pub const GENERATED_PREFIX: &str = "exk8s-";

/// Checks a founding request against the versions this API offers.
pub trait ValidateCluster {
    /// Applies defaults and checks every field; `versions` is the configured allow-list.
    fn validate(self, versions: &[String]) -> Result<ClusterSpecRequest, FieldError>;
}

impl ValidateCluster for CreateClusterRequest {
    fn validate(self, versions: &[String]) -> Result<ClusterSpecRequest, FieldError> {
        if let Some(name) = &self.name {
            validate_name(name)?;
        }
        let count = self.control_plane_count.unwrap_or(1);
        if !(1..=3).contains(&count) {
            return Err(FieldError::new(
                "control_plane_count",
                format!("control_plane_count must be 1 or 3, got {count}"),
            ));
        }
        if count % 2 == 0 {
            return Err(FieldError::new(
                "control_plane_count",
                "control_plane_count must be odd: etcd needs a majority, so 2 members tolerate no more failures than 1",
            ));
        }
        let image = positive("control_plane_image_id", self.control_plane_image_id, None)?;
        let instance_type = match self.control_plane_instance_type {
            None => {
                return Err(FieldError::new(
                    "control_plane_instance_type",
                    "control_plane_instance_type is required",
                ));
            }
            Some(t) => t,
        };
        let sane = (1..=64).contains(&instance_type.len())
            && instance_type
                .bytes()
                .next()
                .is_some_and(|b| b.is_ascii_alphanumeric())
            && instance_type
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
        if !sane {
            return Err(FieldError::new(
                "control_plane_instance_type",
                "control_plane_instance_type must be 1–64 of A-Z, a-z, 0-9, '.', '-', '_', starting alphanumeric",
            ));
        }
        let zone = positive("zone_id", self.zone_id, Some(1))?;
        let subnet = positive("subnet_id", self.subnet_id, None)?;
        let groups = self.security_group_ids.unwrap_or_default();
        if groups.len() > MAX_SECURITY_GROUPS {
            return Err(FieldError::new(
                "security_group_ids",
                format!("at most {MAX_SECURITY_GROUPS} security groups"),
            ));
        }
        if let Some(bad) = groups.iter().find(|g| **g <= 0) {
            return Err(FieldError::new(
                "security_group_ids",
                format!("security group ids must be positive, got {bad}"),
            ));
        }
        let mut unique = groups.clone();
        unique.sort_unstable();
        unique.dedup();
        if unique.len() != groups.len() {
            return Err(FieldError::new(
                "security_group_ids",
                "security group ids must not repeat",
            ));
        }
        if let Some(key) = &self.ssh_pubkey {
            validate_ssh_pubkey(key.trim_end()).map_err(|why| {
                FieldError::new(
                    "ssh_pubkey",
                    format!("ssh_pubkey is not an OpenSSH public key: it {why}"),
                )
            })?;
        }
        let volume = self.root_volume_size_gib.unwrap_or(20);
        if !ROOT_VOLUME_GIB.contains(&volume) {
            return Err(FieldError::new(
                "root_volume_size_gib",
                format!(
                    "root_volume_size_gib must be between {} and {}, got {volume}",
                    ROOT_VOLUME_GIB.start(),
                    ROOT_VOLUME_GIB.end()
                ),
            ));
        }
        let algorithm = match self.key_algorithm.as_deref() {
            None => KeyAlgorithm::default(),
            Some(text) => text.parse().map_err(|e: crate::pki::PkiError| {
                FieldError::new("key_algorithm", e.to_string())
            })?,
        };
        let version = match self.kubernetes_version {
            None => versions
                .first()
                .cloned()
                .ok_or_else(|| FieldError::new("kubernetes_version", "no version is configured"))?,
            Some(v) if versions.contains(&v) => v,
            Some(v) => {
                return Err(FieldError::new(
                    "kubernetes_version",
                    format!(
                        "kubernetes_version `{}` is not offered (offered: {})",
                        v.chars().take(40).collect::<String>(),
                        versions.join(", ")
                    ),
                ));
            }
        };
        let leaf_days = self
            .leaf_lifetime_days
            .unwrap_or(DEFAULT_LEAF_LIFETIME_DAYS);
        if !LEAF_LIFETIME_DAYS.contains(&leaf_days) {
            return Err(FieldError::new(
                "leaf_lifetime_days",
                format!(
                    "leaf_lifetime_days must be between {} and {}, got {leaf_days}",
                    LEAF_LIFETIME_DAYS.start(),
                    LEAF_LIFETIME_DAYS.end()
                ),
            ));
        }
        let pod_network = match self.pod_network.as_deref() {
            None => PodNetwork::default(),
            Some(text) => text
                .parse()
                .map_err(|e: String| FieldError::new("pod_network", e))?,
        };
        Ok(ClusterSpecRequest {
            name: self.name,
            leaf_lifetime_days: leaf_days,
            pod_network,
            control_plane_count: count,
            control_plane_image_id: image,
            control_plane_instance_type: instance_type,
            zone_id: zone,
            subnet_id: subnet,
            security_group_ids: groups,
            allocate_public_ipv4: self.allocate_public_ipv4.unwrap_or(false),
            ssh_pubkey: self.ssh_pubkey.map(|k| k.trim_end().to_owned()),
            root_volume_size_gib: volume,
            key_algorithm: algorithm,
            kubernetes_version: version,
        })
    }
}

impl From<&ClusterSpecRequest> for Spec {
    fn from(r: &ClusterSpecRequest) -> Self {
        Self {
            placement: Placement {
                zone_id: r.zone_id,
                subnet_id: r.subnet_id,
                security_group_ids: r.security_group_ids.clone(),
                allocate_public_ipv4: r.allocate_public_ipv4,
                ssh_pubkey: r.ssh_pubkey.clone(),
                root_volume_size_gib: r.root_volume_size_gib,
            },
            control_plane: ControlPlaneMachine {
                image_id: r.control_plane_image_id,
                instance_type: r.control_plane_instance_type.clone(),
            },
            leaf_lifetime_days: r.leaf_lifetime_days,
            pod_network: r.pod_network,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_lowercase_labels_that_cannot_pass_for_an_id_or_a_given_name() {
        for good in ["prod", "a", "eu-west-1", "a1b2", &"x".repeat(40)] {
            validate_name(good).unwrap();
        }
        for bad in [
            "",
            "Prod",
            "1prod",
            "42",
            "prod-",
            "-prod",
            "pro_d",
            "pro d",
            "exk8s-7-1f",
            "ünïcode",
            &"x".repeat(41),
        ] {
            let e = validate_name(bad).unwrap_err();
            assert_eq!(e.field, "name", "{bad}");
        }
    }

    fn ed25519_line() -> String {
        let mut blob = Vec::new();
        blob.extend_from_slice(&11u32.to_be_bytes());
        blob.extend_from_slice(b"ssh-ed25519");
        blob.extend_from_slice(&32u32.to_be_bytes());
        blob.extend_from_slice(&[7u8; 32]);
        format!("ssh-ed25519 {} alice@laptop", BASE64.encode(blob))
    }

    #[test]
    fn openssh_keys_are_checked_structurally() {
        assert!(validate_ssh_pubkey(&ed25519_line()).is_ok());
        let swapped = ed25519_line().replacen("ssh-ed25519", "ssh-rsa", 1);
        assert!(
            validate_ssh_pubkey(&swapped)
                .unwrap_err()
                .contains("does not match")
        );
        assert!(validate_ssh_pubkey("ssh-ed25519 AAAA").is_err());
        assert!(validate_ssh_pubkey("ssh-dss AAAA").is_err());
        assert!(validate_ssh_pubkey(&format!("{}\nssh-ed25519 x", ed25519_line())).is_err());
    }
}
