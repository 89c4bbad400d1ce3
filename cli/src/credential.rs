//! `exk8s credential CLUSTER`, client-go's exec credential plugin, and `exk8s kubeconfig
//! CLUSTER --exec`, the kubeconfig that runs it. kubectl (any client-go client) then always
//! presents a current certificate, the way cloud CLIs hand out credentials (`aws eks
//! get-token`, `gke-gcloud-auth-plugin`):
//!
//! - each run fetches what the cluster's apiservers are trusted with now (`GET
//!   /clusters/{id}/trust`) and writes it to the file the kubeconfig's `certificate-authority`
//!   names, so a client started after it trusts the CA a rotation brings in;
//! - the certificate (`POST /clusters/{id}/credentials`, eight hours) is cached, private, and
//!   reused until two thirds of its life have passed or its issuer is no longer trusted (the
//!   last phase of a cluster-CA rotation): then a new one is minted.
//!
//! kubectl reads the trust file before it runs the plugin, so what it trusts is what the last
//! run wrote. That trust carries the standby CA the cluster CA's next rotation will take, so a
//! client whose trust file predates a rotation it did not see still verifies the apiservers'
//! new certificates. Only one whose file predates two rotations (or a cluster founded before
//! standbys existed) fails once with an unknown authority; the plugin it ran meanwhile wrote
//! the new trust, and the next one works.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use exk8s_api_types::{ClusterTrust, ClusterView, OperatorCredential};
use serde_json::json;
use sha2::{Digest as _, Sha256};
use zeroize::Zeroizing;

use crate::client::Api;
use crate::error::CliError;

/// The version of client-go's exec credential protocol spoken.
const EXEC_API_VERSION: &str = "client.authentication.k8s.io/v1";

/// Where a cluster's cached credential and trust file live.
struct Cache {
    credential: PathBuf,
    trust: PathBuf,
}

impl Cache {
    /// Under `$XDG_CACHE_HOME/exk8s/credentials` (or `~/.cache/...`), per API and cluster.
    fn of(api: &str, id: i64) -> Result<Self, CliError> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| {
                std::env::var_os("HOME")
                    .filter(|v| !v.is_empty())
                    .map(|h| PathBuf::from(h).join(".cache"))
            })
            .ok_or_else(|| {
                CliError::Config(
                    "neither XDG_CACHE_HOME nor HOME is set: no cache directory".into(),
                )
            })?;
        let digest = Sha256::digest(api.as_bytes());
        let stem = format!("{}-{id}", hex(&digest[..6]));
        let dir = base.join("exk8s").join("credentials");
        Ok(Self {
            credential: dir.join(format!("{stem}.json")),
            trust: dir.join(format!("{stem}-ca.pem")),
        })
    }

    /// The cached credential, if one is there and reads.
    fn cached(&self) -> Option<OperatorCredential> {
        let text = Zeroizing::new(std::fs::read_to_string(&self.credential).ok()?);
        serde_json::from_str(&text).ok()
    }
}

/// Runs the plugin: prints an `ExecCredential` for `cluster` on stdout.
pub(crate) fn run(api: &Api, cluster: &str) -> Result<(), CliError> {
    let id = api.cluster_id(cluster)?;
    let cache = Cache::of(api.base(), id)?;
    let trust: ClusterTrust = api.get(&format!("/clusters/{id}/trust"))?;
    write_trust(&cache.trust, &trust.certificate_authority_pem)?;
    let now = crate::output::now();
    let credential = match cache.cached() {
        Some(cached) if usable(&cached, &trust, now)? => cached,
        _ => {
            let minted: OperatorCredential = api
                .send(
                    "POST",
                    &format!("/clusters/{id}/credentials"),
                    None::<&()>,
                    None,
                )?
                .ok_or_else(|| CliError::Unexpected("a credential without a body".into()))?;
            let text = Zeroizing::new(
                serde_json::to_string(&minted)
                    .map_err(|e| CliError::Failed(format!("encoding the credential: {e}")))?,
            );
            crate::kubeconfig::write_private(&cache.credential, text.as_bytes())?;
            minted
        }
    };
    let (not_before, not_after) = validity(&credential.client_certificate_pem)?;
    let refresh = rfc3339(refresh_at(not_before, not_after))?;
    let out = Zeroizing::new(
        json!({
            "apiVersion": EXEC_API_VERSION,
            "kind": "ExecCredential",
            "status": {
                "expirationTimestamp": refresh,
                "clientCertificateData": credential.client_certificate_pem,
                "clientKeyData": credential.client_key_pem.expose(),
            },
        })
        .to_string(),
    );
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", out.as_str()).map_err(|e| CliError::io("writing to stdout", e))
}

/// The kubeconfig whose user runs `exk8s credential` for `cluster` (its trust file written
/// first, so its first use works).
pub(crate) fn kubeconfig(api: &Api, cluster: &str) -> Result<String, CliError> {
    let id = api.cluster_id(cluster)?;
    let view: ClusterView = api.get(&format!("/clusters/{id}"))?;
    let cache = Cache::of(api.base(), id)?;
    let trust: ClusterTrust = api.get(&format!("/clusters/{id}/trust"))?;
    write_trust(&cache.trust, &trust.certificate_authority_pem)?;
    let name = format!("exk8s-admin@{}", view.name);
    let doc = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{
            "name": view.name,
            "cluster": {
                "server": trust.server,
                "certificate-authority": cache.trust.display().to_string(),
            },
        }],
        "users": [{
            "name": name,
            "user": {
                "exec": {
                    "apiVersion": EXEC_API_VERSION,
                    "command": "exk8s",
                    "args": ["credential", id.to_string()],
                    "env": [{"name": "EXK8S_API", "value": api.base()}],
                    "interactiveMode": "Never",
                    "provideClusterInfo": false,
                    "installHint": "exk8s credential needs the exk8s CLI on PATH and a login \
                                    (`exk8s login`, or EXK8S_TOKEN)",
                },
            },
        }],
        "contexts": [{"name": name, "context": {"cluster": view.name, "user": name}}],
        "current-context": name,
        "preferences": {},
    });
    yaml_serde::to_string(&doc)
        .map_err(|e| CliError::Failed(format!("encoding the kubeconfig: {e}")))
}

/// Writes the trust file when it changed (readable by the user only, like the kubeconfig).
fn write_trust(file: &Path, pem: &str) -> Result<(), CliError> {
    if std::fs::read_to_string(file).is_ok_and(|old| old == pem) {
        return Ok(());
    }
    crate::kubeconfig::write_private(file, pem.as_bytes())
}

/// Whether `cached` may still be presented at `now`: within the first two thirds of its life,
/// and signed by a CA the cluster's apiservers trust now.
fn usable(cached: &OperatorCredential, trust: &ClusterTrust, now: i64) -> Result<bool, CliError> {
    let Ok((not_before, not_after)) = validity(&cached.client_certificate_pem) else {
        return Ok(false);
    };
    if now >= refresh_at(not_before, not_after) {
        return Ok(false);
    }
    let issuer = ders(&cached.issuer_pem);
    Ok(!issuer.is_empty()
        && ders(&trust.certificate_authority_pem)
            .iter()
            .any(|der| issuer.contains(der)))
}

/// When a certificate valid from `not_before` to `not_after` is replaced: two thirds in.
fn refresh_at(not_before: i64, not_after: i64) -> i64 {
    not_before + (not_after - not_before) * 2 / 3
}

/// The DER of each `CERTIFICATE` block of `pem`, in order.
pub(crate) fn ders(pem: &str) -> Vec<Vec<u8>> {
    x509_parser::pem::Pem::iter_from_buffer(pem.as_bytes())
        .filter_map(Result::ok)
        .filter(|p| p.label == "CERTIFICATE")
        .map(|p| p.contents)
        .collect()
}

/// The first certificate's validity, Unix seconds.
fn validity(pem: &str) -> Result<(i64, i64), CliError> {
    let der = ders(pem)
        .into_iter()
        .next()
        .ok_or_else(|| CliError::Unexpected("a credential without a certificate".into()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der)
        .map_err(|e| CliError::Unexpected(format!("a credential's certificate: {e}")))?;
    let validity = cert.validity();
    Ok((
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    ))
}

fn rfc3339(unix: i64) -> Result<String, CliError> {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .ok_or_else(|| CliError::Unexpected(format!("a time out of range: {unix}")))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_is_replaced_two_thirds_into_its_life() {
        assert_eq!(refresh_at(0, 3 * 3600), 2 * 3600);
        assert_eq!(refresh_at(1_000, 1_000 + 8 * 3600), 1_000 + 16 * 1200);
    }

    #[test]
    fn only_certificate_blocks_count_as_trusted() {
        let pem = "-----BEGIN CERTIFICATE-----\nAAEC\n-----END CERTIFICATE-----\n\
                   -----BEGIN PRIVATE KEY-----\nAwQF\n-----END PRIVATE KEY-----\n";
        assert_eq!(ders(pem), vec![vec![0, 1, 2]]);
        assert!(ders("not a pem").is_empty());
    }
}
