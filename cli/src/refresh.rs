//! `exk8s kubeconfig [CLUSTER] --refresh`: each exk8s identity merged into the kubeconfig
//! (contexts `exk8s-admin@<cluster>`) is fetched again when it is past two thirds of its life,
//! expired, or trusts other CAs than the cluster's apiservers are trusted with now (compared as
//! sets: a rotation of the cluster CA dropped the old one, or ended with a new standby); the
//! others are kept. One line each says which and why.

use base64::Engine as _;
use exk8s_api_types::ClusterTrust;

use crate::client::Api;
use crate::error::CliError;

/// The context prefix of the API's operator kubeconfigs.
const CONTEXT_PREFIX: &str = "exk8s-admin@";

/// Why an entry is fetched again, if it is.
fn stale(
    cert: Option<(i64, i64)>,
    ca_data: Option<&str>,
    trusted: &str,
    now: i64,
) -> Option<String> {
    let Some((not_before, not_after)) = cert else {
        return Some("its certificate does not parse".into());
    };
    if now >= not_after {
        return Some("its certificate expired".into());
    }
    if now >= not_before + (not_after - not_before) * 2 / 3 {
        return Some("its certificate is past two thirds of its life".into());
    }
    let ca = ca_data
        .and_then(|d| base64::engine::general_purpose::STANDARD.decode(d).ok())
        .map(|pem| String::from_utf8_lossy(&pem).into_owned());
    if ca.is_none_or(|ca| !same_certificates(&ca, trusted)) {
        return Some("the cluster's apiservers are trusted with another CA now".into());
    }
    None
}

/// Whether two PEM texts hold the same certificates, in whatever order.
fn same_certificates(a: &str, b: &str) -> bool {
    let sorted = |pem: &str| {
        let mut ders = crate::credential::ders(pem);
        ders.sort();
        ders
    };
    let a = sorted(a);
    !a.is_empty() && a == sorted(b)
}

/// A base64 PEM certificate's validity (Unix seconds).
fn validity(data: &str) -> Option<(i64, i64)> {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let v = cert.validity();
    Some((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// Refreshes the exk8s entries of the kubeconfig (only `only`'s, when given).
pub(crate) fn run(api: &Api, only: Option<&str>) -> Result<(), CliError> {
    let file = crate::kubeconfig::target()?;
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(&file)
            .map_err(|e| CliError::io(format!("reading {}", file.display()), e))?,
    );
    let doc: yaml_serde::Value = yaml_serde::from_str(&text)
        .map_err(|e| CliError::Failed(format!("{} is not a kubeconfig: {e}", file.display())))?;
    let entry = |list: &str, name: &str| {
        doc[list]
            .as_sequence()
            .into_iter()
            .flatten()
            .find(|e| e["name"].as_str() == Some(name))
            .cloned()
    };
    let now = crate::output::now();
    let mut seen = 0;
    for context in doc["contexts"].as_sequence().into_iter().flatten() {
        let Some(name) = context["name"].as_str() else {
            continue;
        };
        let Some(cluster) = name.strip_prefix(CONTEXT_PREFIX) else {
            continue;
        };
        if only.is_some_and(|o| o != cluster) {
            continue;
        }
        seen += 1;
        let user = context["context"]["user"]
            .as_str()
            .and_then(|u| entry("users", u));
        let server = context["context"]["cluster"]
            .as_str()
            .and_then(|c| entry("clusters", c));
        let cert = user
            .as_ref()
            .and_then(|u| u["user"]["client-certificate-data"].as_str())
            .and_then(validity);
        let ca = server.as_ref().and_then(|c| {
            c["cluster"]["certificate-authority-data"]
                .as_str()
                .map(str::to_owned)
        });
        let id = api.cluster_id(cluster)?;
        let trust: ClusterTrust = api.get(&format!("/clusters/{id}/trust"))?;
        match stale(cert, ca.as_deref(), &trust.certificate_authority_pem, now) {
            Some(why) => {
                let fresh = api.get_text(&format!("/clusters/{id}/kubeconfig"))?;
                let current = doc["current-context"].as_str().map(str::to_owned);
                crate::kubeconfig::merge_into(&file, &fresh)?;
                if let Some(current) = current.filter(|c| c != name) {
                    crate::kubeconfig::set_current(&file, &current)?;
                }
                eprintln!("refreshed {name}: {why}");
            }
            None => {
                let until = cert.map_or_else(String::new, |(_, t)| crate::output::date(t));
                eprintln!("kept {name}: valid until {until}, trusting the cluster's CA");
            }
        }
    }
    if seen == 0 {
        return Err(CliError::Failed(format!(
            "{} holds no exk8s context{} (`exk8s kubeconfig CLUSTER --merge` adds one)",
            file.display(),
            only.map_or_else(String::new, |c| format!(" of cluster {c}"))
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_is_fetched_again_late_in_its_life_or_under_another_ca() {
        let ca = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        let data = base64::engine::general_purpose::STANDARD.encode(ca);
        let cert = Some((0, 300));
        assert_eq!(stale(cert, Some(&data), ca, 100), None);
        assert!(
            stale(cert, Some(&data), ca, 200)
                .unwrap()
                .contains("two thirds")
        );
        assert!(
            stale(cert, Some(&data), ca, 300)
                .unwrap()
                .contains("expired")
        );
        let rotating = format!("{ca}{ca}");
        assert!(
            stale(cert, Some(&data), &rotating, 100)
                .unwrap()
                .contains("another CA")
        );
        // The same CAs in another order are the same trust; one more or one less is not.
        let other = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";
        let both = base64::engine::general_purpose::STANDARD.encode(format!("{ca}{other}"));
        assert_eq!(stale(cert, Some(&both), &format!("{other}{ca}"), 100), None);
        assert!(stale(cert, Some(&both), other, 100).is_some());
        assert!(stale(cert, Some(&data), &format!("{ca}{other}"), 100).is_some());
        assert!(stale(cert, Some("not base64"), ca, 100).is_some());
        assert!(
            stale(None, Some(&data), ca, 100)
                .unwrap()
                .contains("does not parse")
        );
    }
}
