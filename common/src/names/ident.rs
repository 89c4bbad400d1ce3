//! Names that reach command lines, certificates or unit files: node names, package and unit
//! names, Kubernetes object names, versions, URLs, nonces. Every rule here also guarantees the
//! value can never be mistaken for a command-line option (none may start with `-`).

use super::{shown, string_newtype};

/// A value that broke its type's rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{what} `{value}` is invalid: must be {rule}")]
pub struct NameError {
    pub what: &'static str,
    pub value: String,
    pub rule: &'static str,
}

impl NameError {
    pub(crate) fn new(what: &'static str, value: &str, rule: &'static str) -> Self {
        Self {
            what,
            value: shown(value),
            rule,
        }
    }
}

const DNS_SUBDOMAIN_RULE: &str =
    "a lowercase RFC 1123 subdomain (labels of a-z, 0-9, '-', at most 63 each, 253 in all)";

fn is_dns_label(label: &str) -> bool {
    !label.is_empty()
        && label.len() <= 63
        && label
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 253 && s.split('.').all(is_dns_label)
}

fn check(what: &'static str, value: &str, rule: &'static str, ok: bool) -> Result<(), NameError> {
    if ok {
        Ok(())
    } else {
        Err(NameError::new(what, value, rule))
    }
}

fn validate_node_name(s: &str) -> Result<(), NameError> {
    // Uppercase is refused rather than lower-cased: the kubelet registers exactly this name and
    // its certificate CN must match it byte for byte (system:node:<name>).
    check("node name", s, DNS_SUBDOMAIN_RULE, is_dns_subdomain(s))
}

fn validate_k8s_name(s: &str) -> Result<(), NameError> {
    check(
        "Kubernetes object name",
        s,
        DNS_SUBDOMAIN_RULE,
        is_dns_subdomain(s),
    )
}

fn validate_artifact_name(s: &str) -> Result<(), NameError> {
    check(
        "artifact name",
        s,
        "a lowercase DNS label (a-z, 0-9, '-')",
        is_dns_label(s),
    )
}

fn validate_nonce(s: &str) -> Result<(), NameError> {
    let ok = (16..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    check(
        "nonce",
        s,
        "16 to 64 URL-safe characters (A-Z, a-z, 0-9, '-', '_')",
        ok,
    )
}

fn validate_account(s: &str) -> Result<(), NameError> {
    let mut bytes = s.bytes();
    let ok = s.len() <= 32
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    check(
        "account name",
        s,
        "a POSIX user or group name ([a-z_][a-z0-9_-]{0,31})",
        ok,
    )
}

fn validate_package(s: &str) -> Result<(), NameError> {
    let mut bytes = s.bytes();
    let ok = (2..=128).contains(&s.len())
        && bytes
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && bytes.all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'+' | b'-' | b'.')
        });
    check(
        "package name",
        s,
        "a Debian package name ([a-z0-9][a-z0-9+.-]+)",
        ok,
    )
}

fn validate_unit(s: &str) -> Result<(), NameError> {
    const SUFFIXES: [&str; 6] = [
        ".service", ".socket", ".target", ".timer", ".mount", ".path",
    ];
    let ok = s.len() <= 255
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b':' | b'_' | b'.' | b'@' | b'-'))
        && SUFFIXES
            .iter()
            .any(|suffix| s.len() > suffix.len() && s.ends_with(suffix));
    check(
        "systemd unit name",
        s,
        "a unit name like `etcd.service`",
        ok,
    )
}

fn validate_version(s: &str) -> Result<(), NameError> {
    let ok = (1..=64).contains(&s.len())
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+' | b'_'));
    check(
        "version",
        s,
        "1 to 64 of A-Z, a-z, 0-9, '.', '-', '+', '_'",
        ok,
    )
}

fn is_url_text(s: &str, schemes: &[&str]) -> bool {
    s.len() <= 2048
        && schemes
            .iter()
            .any(|scheme| s.strip_prefix(scheme).is_some_and(|rest| !rest.is_empty()))
        && !s.chars().any(|c| c.is_whitespace() || c.is_control())
}

fn validate_archive_member(s: &str) -> Result<(), NameError> {
    let ok = (1..=255).contains(&s.len())
        && s.split('/').all(|c| {
            !c.is_empty()
                && c != "."
                && c != ".."
                && c.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+' | b'_'))
        });
    check(
        "archive member",
        s,
        "a relative path of A-Z, a-z, 0-9, '.', '-', '+', '_' components, no `.` or `..`",
        ok,
    )
}

fn validate_chart(s: &str) -> Result<(), NameError> {
    let ok = is_url_text(s, &["oci://", "https://"]);
    check("chart reference", s, "an oci:// or https:// reference", ok)
}

fn validate_url(s: &str) -> Result<(), NameError> {
    let ok = is_url_text(s, &["https://", "http://"]);
    check(
        "artifact URL",
        s,
        "an https:// (or http://) URL without spaces",
        ok,
    )
}

string_newtype!(
    /// A node name: lowercase RFC 1123 subdomain, exactly as the kubelet registers it.
    NodeName, NameError, validate_node_name
);
string_newtype!(
    /// A Kubernetes object or namespace name (RFC 1123 subdomain).
    K8sName, NameError, validate_k8s_name
);
string_newtype!(
    /// An artifact's short name (`etcd`, `kubelet`).
    ArtifactName, NameError, validate_artifact_name
);
string_newtype!(
    /// The agent's per-request nonce, echoed in the payload.
    Nonce, NameError, validate_nonce
);
string_newtype!(
    /// A POSIX user or group name that owns a written file.
    AccountName, NameError, validate_account
);
string_newtype!(
    /// A Debian package name.
    PackageName, NameError, validate_package
);
string_newtype!(
    /// A systemd unit name.
    UnitName, NameError, validate_unit
);
string_newtype!(
    /// A software version string (`v1.35.3`).
    Version, NameError, validate_version
);
string_newtype!(
    /// A Helm chart reference (`oci://…`).
    ChartRef, NameError, validate_chart
);
string_newtype!(
    /// An http(s) URL: where an artifact is downloaded from, or an endpoint a plan step polls.
    HttpUrl, NameError, validate_url
);
string_newtype!(
    /// A file inside a downloaded `.tar.gz` artifact (`etcd-v3.6.10-linux-amd64/etcd`).
    ArchiveMember, NameError, validate_archive_member
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_names_are_lowercase_subdomains() {
        assert!(NodeName::new("cp-1.cluster-42.internal").is_ok());
        for bad in [
            "",
            "CP-1",
            "cp_1",
            "-cp",
            "cp-",
            "a..b",
            "cp 1",
            &"a".repeat(64),
        ] {
            assert!(NodeName::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn nonces_are_bounded_url_safe_text() {
        assert!(Nonce::new("abcdefghijklmnop").is_ok());
        assert!(Nonce::new("A-_9".repeat(16)).is_ok());
        for bad in [
            "short",
            "has space in it ok",
            "slash/slash/slash/",
            &"a".repeat(65),
        ] {
            assert!(Nonce::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn names_can_never_be_options() {
        assert!(PackageName::new("-oDebug::pkg").is_err());
        assert!(UnitName::new("-x.service").is_err());
        assert!(Version::new("--set").is_err());
        assert!(AccountName::new("-root").is_err());
        assert!(K8sName::new("-n").is_err());
        assert!(ChartRef::new("--repo").is_err());
    }

    #[test]
    fn accepts_the_values_the_api_renders() {
        assert!(PackageName::new("containerd").is_ok());
        assert!(PackageName::new("libc6-dev").is_ok());
        assert!(UnitName::new("etcd.service").is_ok());
        assert!(UnitName::new("service").is_err());
        assert!(Version::new("v1.35.3").is_ok());
        assert!(ChartRef::new("oci://quay.io/cilium/charts/cilium").is_ok());
        assert!(HttpUrl::new("https://dl.k8s.io/v1.35.3/bin/linux/amd64/kubelet").is_ok());
        assert!(HttpUrl::new("file:///etc/shadow").is_err());
        assert!(AccountName::new("root").is_ok());
        assert!(AccountName::new("etcd").is_ok());
        assert!(ArchiveMember::new("etcd-v3.6.10-linux-amd64/etcd").is_ok());
        for bad in ["/etc/passwd", "a/../b", "a//b", "./a", "a b"] {
            assert!(ArchiveMember::new(bad).is_err(), "{bad:?}");
        }
    }
}
