//! `exk8s doctor`: what stands between the operator and their clusters, each check one line —
//! the CLI's login, the API's reachability and readiness, the token, this machine's clock
//! against the API's (certificates and node signatures allow minutes, not more), and each
//! exk8s identity in the kubeconfig: expired, or past two thirds of its life (renew it with
//! `exk8s kubeconfig CLUSTER --merge`). Exits 1 when anything is wrong, saying what to do.

use std::time::Duration;

use base64::Engine as _;

use crate::client::Api;
use crate::config;
use crate::error::CliError;

/// The clock skew beyond which doctor complains.
const SKEW: i64 = 30;
/// The identity the API's kubeconfigs carry.
const OPERATOR_CN: &str = "exk8s-admin";

#[derive(Default)]
struct Report {
    problems: usize,
}

impl Report {
    fn ok(&mut self, what: &str) {
        eprintln!("ok       {what}");
    }

    fn warn(&mut self, what: &str) {
        eprintln!("warning  {what}");
    }

    fn problem(&mut self, what: &str) {
        self.problems += 1;
        eprintln!("problem  {what}");
    }
}

pub(crate) fn run(api_url: Option<String>, token: Option<String>) -> Result<(), CliError> {
    let mut report = Report::default();
    match config::session(api_url, token) {
        Err(e) => report.problem(&e.to_string()),
        Ok(session) => {
            let base = session.api.clone();
            report.ok(&format!("logged in to {base}"));
            check_api(&mut report, &base);
            let api = Api::new(session);
            match api.get::<serde_json::Value>("/clusters?limit=1") {
                Ok(_) => report.ok("the API accepts the token"),
                Err(e) => report.problem(&e.to_string()),
            }
        }
    }
    check_kubeconfig(&mut report);
    match report.problems {
        0 => Ok(()),
        n => Err(CliError::Failed(format!("{n} problem(s) found (above)"))),
    }
}

/// `/readyz`, and the API's clock (its `Date`) against this machine's.
fn check_api(report: &mut Report, base: &str) {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(10))
        .build();
    let answer = match agent.get(&format!("{base}/readyz")).call() {
        Ok(answer) => {
            report.ok("the API answers and is ready");
            answer
        }
        Err(ureq::Error::Status(status, answer)) => {
            report.problem(&format!(
                "the API answers but is not ready ({status}): see its log"
            ));
            answer
        }
        Err(e) => {
            report.problem(&format!("cannot reach the API at {base}: {e}"));
            return;
        }
    };
    let theirs = answer.header("date").and_then(|d| {
        time::OffsetDateTime::parse(d, &time::format_description::well_known::Rfc2822).ok()
    });
    match theirs {
        Some(theirs) => {
            let skew = (crate::output::now() - theirs.unix_timestamp()).abs();
            if skew > SKEW {
                report.problem(&format!(
                    "this machine's clock is {skew}s off the API's: certificates may look \
                     not yet valid or expired; sync it (NTP)"
                ));
            } else {
                report.ok(&format!(
                    "this machine's clock agrees with the API's ({skew}s)"
                ));
            }
        }
        None => report.warn("the API sent no Date header: the clock was not compared"),
    }
}

/// Each user of the kubeconfig whose client certificate is exk8s's operator identity.
fn check_kubeconfig(report: &mut Report) {
    let path = match crate::kubeconfig::target() {
        Ok(path) => path,
        Err(e) => return report.warn(&e.to_string()),
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(_) => {
            return report.warn(&format!(
                "no kubeconfig at {} (`exk8s kubeconfig CLUSTER --merge` writes one)",
                path.display()
            ));
        }
    };
    let Ok(doc) = yaml_serde::from_str::<yaml_serde::Value>(&text) else {
        return report.problem(&format!("{} is not valid YAML", path.display()));
    };
    let now = crate::output::now();
    let mut found = 0;
    for user in doc["users"].as_sequence().into_iter().flatten() {
        let name = user["name"].as_str().unwrap_or("?");
        let Some(data) = user["user"]["client-certificate-data"].as_str() else {
            continue;
        };
        let Some((cn, not_before, not_after)) = certificate(data) else {
            report.problem(&format!(
                "user {name} in {} has a client certificate that does not parse",
                path.display()
            ));
            continue;
        };
        if cn != OPERATOR_CN {
            continue;
        }
        found += 1;
        let until = crate::output::date(not_after);
        let renew = format!("renew it: exk8s kubeconfig CLUSTER --merge (user {name})");
        if now >= not_after {
            report.problem(&format!(
                "user {name}'s certificate expired at {until}: {renew}"
            ));
        } else if now >= not_before + (not_after - not_before) * 2 / 3 {
            report.warn(&format!(
                "user {name}'s certificate is past two thirds of its life (until {until}): {renew}"
            ));
        } else {
            report.ok(&format!("user {name}'s certificate is valid until {until}"));
        }
    }
    if found == 0 {
        report.warn(&format!(
            "{} holds no exk8s identity (`exk8s kubeconfig CLUSTER --merge` adds one)",
            path.display()
        ));
    }
}

/// A base64 PEM certificate's subject CN and validity (Unix seconds).
fn certificate(data: &str) -> Option<(String, i64, i64)> {
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .ok()?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&pem).ok()?;
    let cert = pem.parse_x509().ok()?;
    let cn = cert
        .subject()
        .iter_common_name()
        .next()
        .and_then(|c| c.as_str().ok())?
        .to_owned();
    let validity = cert.validity();
    Some((
        cn,
        validity.not_before.timestamp(),
        validity.not_after.timestamp(),
    ))
}
