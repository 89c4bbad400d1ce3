//! HTTP plumbing: a client with timeouts and an optional pinned TLS root, bodies read with a
//! hard size cap while streaming, and retries with exponential backoff and jitter under an
//! overall deadline. 4xx answers other than 429 are final; 429 honours `Retry-After`.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustls::ClientConfig;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};

use crate::error::AgentError;
use crate::log::log_warn;

/// First retry delay; doubles up to [`MAX_BACKOFF`].
const BASE_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// The most of a refusal body quoted in an error (a node report carries up to 1000).
const QUOTED_BODY: usize = 600;
/// What every request of this agent says it is (`User-Agent`): the API records the release.
const USER_AGENT: &str = concat!("exk8s-agent/", env!("CARGO_PKG_VERSION"));

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn tls_error(what: &str, e: impl std::fmt::Display) -> AgentError {
    AgentError::Config(format!("{what}: {e}"))
}

/// Root store from a PEM bundle.
pub fn roots_from_pem(pem: &[u8], what: &str) -> Result<rustls::RootCertStore, AgentError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| tls_error(what, e))?;
        roots.add(cert).map_err(|e| tls_error(what, e))?;
    }
    if roots.is_empty() {
        return Err(AgentError::Config(format!("{what}: no certificate found")));
    }
    Ok(roots)
}

/// TLS for the API: the pinned root when given, otherwise the public web PKI.
pub fn api_tls(pinned_root_pem: Option<&[u8]>) -> Result<Arc<ClientConfig>, AgentError> {
    match pinned_root_pem {
        Some(pem) => private_ca_tls(pem, "api_ca_file"),
        None => server_auth(rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        }),
    }
}

/// Server-authenticated TLS with a private CA (`what` names it in errors) and no client
/// certificate: the pinned API root, the balancer's anonymous `/readyz`.
pub fn private_ca_tls(ca_pem: &[u8], what: &str) -> Result<Arc<ClientConfig>, AgentError> {
    server_auth(roots_from_pem(ca_pem, what)?)
}

/// TLS that checks the server against `roots` and presents no client certificate.
fn server_auth(roots: rustls::RootCertStore) -> Result<Arc<ClientConfig>, AgentError> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("TLS", e))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Mutual TLS with a private CA (etcd health, apiserver readiness).
pub fn mutual_tls(
    ca_pem: &[u8],
    cert_pem: &[u8],
    key_pem: &[u8],
) -> Result<Arc<ClientConfig>, AgentError> {
    let roots = roots_from_pem(ca_pem, "CA bundle")?;
    let certs = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error("client certificate", e))?;
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| tls_error("client key", e))?;
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("TLS", e))?
        .with_root_certificates(roots)
        .with_client_auth_cert(certs, key)
        .map_err(|e| tls_error("client identity", e))?;
    Ok(Arc::new(config))
}

/// TLS to a control-plane component's own port on loopback, whose serving certificate it
/// signed itself at start: the chain is not checked (as the kubelet's probe does not check it),
/// the handshake's signatures are. Use only for `https://127.0.0.1:<port>/healthz`.
pub fn loopback_tls() -> Result<Arc<ClientConfig>, AgentError> {
    let provider = provider();
    let verifier = Arc::new(SelfSignedLoopback(Arc::clone(&provider)));
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("TLS", e))?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Accepts any server certificate chain; see [`loopback_tls`].
#[derive(Debug)]
struct SelfSignedLoopback(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for SelfSignedLoopback {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &rustls_pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls_pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// A blocking HTTP agent: no redirects (credentials never follow one), per-request timeout
/// covering the whole exchange including the body.
pub fn agent(tls: Arc<ClientConfig>, request_timeout: Duration) -> ureq::Agent {
    ureq::AgentBuilder::new()
        .user_agent(USER_AGENT)
        .tls_config(tls)
        .timeout_connect(request_timeout.min(Duration::from_secs(10)))
        .timeout(request_timeout)
        .redirects(0)
        .build()
}

/// Reads a response body, failing as soon as it exceeds `limit` bytes.
pub fn read_capped(response: ureq::Response, limit: u64) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    response
        .into_reader()
        .take(limit + 1)
        .read_to_end(&mut body)
        .map_err(|e| format!("reading the body: {e}"))?;
    if body.len() as u64 > limit {
        return Err(format!("the body exceeds the {limit}-byte limit"));
    }
    Ok(body)
}

/// The outcome of one attempt.
pub enum Attempt<T> {
    Done(T),
    /// Worth retrying; with the server's `Retry-After` when it gave one.
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    Fatal(AgentError),
}

/// Classifies a ureq result: 2xx → `Ok(response)`, otherwise the matching [`Attempt`].
pub fn classify(
    what: &'static str,
    result: Result<ureq::Response, ureq::Error>,
) -> Result<ureq::Response, Attempt<std::convert::Infallible>> {
    match result {
        Ok(response) => Ok(response),
        Err(ureq::Error::Status(429, response)) => Err(Attempt::Retry {
            reason: "HTTP 429 (rate limited)".into(),
            after: retry_after(&response),
        }),
        Err(ureq::Error::Status(status, response)) if status >= 500 => Err(Attempt::Retry {
            reason: format!("HTTP {status}"),
            after: retry_after(&response),
        }),
        Err(ureq::Error::Status(status, response)) => {
            let body = read_capped(response, 4096)
                .map(|b| refusal_text(&b))
                .unwrap_or_default();
            Err(Attempt::Fatal(AgentError::Rejected { what, status, body }))
        }
        Err(ureq::Error::Transport(t)) => Err(Attempt::Retry {
            reason: t.to_string(),
            after: None,
        }),
    }
}

/// What a refusal says: the API's `error.message` when the body is its error shape (the reason
/// a node reports), otherwise the body's text; at most [`QUOTED_BODY`] characters.
fn refusal_text(body: &[u8]) -> String {
    let message = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_owned));
    message
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned())
        .chars()
        .take(QUOTED_BODY)
        .collect()
}

fn retry_after(response: &ureq::Response) -> Option<Duration> {
    let secs: u64 = response.header("Retry-After")?.trim().parse().ok()?;
    Some(Duration::from_secs(secs.min(300)))
}

/// A uniformly random fraction in [0, 1) from the OS CSPRNG (jitter needs no more).
fn random_fraction() -> f64 {
    let mut bytes = [0u8; 4];
    if getrandom::fill(&mut bytes).is_err() {
        return 0.5;
    }
    f64::from(u32::from_le_bytes(bytes)) / (f64::from(u32::MAX) + 1.0)
}

/// Runs `op` until it is done, fatal, or `deadline` would pass before the next attempt.
/// Delays grow exponentially from 500 ms to 30 s with jitter (half to full delay); a
/// `Retry-After` is honoured when longer.
pub fn retry<T>(
    what: &'static str,
    deadline: Duration,
    op: impl FnMut() -> Attempt<T>,
) -> Result<T, AgentError> {
    retry_unless_abandoned(what, deadline, &AtomicBool::new(false), op)
}

/// [`retry`], given up as soon as `abandoned` is set (checked before each attempt and
/// throughout each pause): the work it serves is no longer wanted, because a step beside it
/// failed and the whole phase will be tried again.
pub fn retry_unless_abandoned<T>(
    what: &'static str,
    deadline: Duration,
    abandoned: &AtomicBool,
    mut op: impl FnMut() -> Attempt<T>,
) -> Result<T, AgentError> {
    let start = Instant::now();
    let mut attempts = 0u32;
    let mut backoff = BASE_BACKOFF;
    loop {
        if abandoned.load(Ordering::Relaxed) {
            return Err(AgentError::Abandoned {
                what: what.to_owned(),
            });
        }
        attempts += 1;
        let (reason, after) = match op() {
            Attempt::Done(value) => return Ok(value),
            Attempt::Fatal(err) => return Err(err),
            Attempt::Retry { reason, after } => (reason, after),
        };
        let jittered = backoff.mul_f64(0.5 + 0.5 * random_fraction());
        let delay = after.map_or(jittered, |a| a.max(jittered));
        if start.elapsed() + delay >= deadline {
            return Err(AgentError::NetworkExhausted {
                what,
                attempts,
                elapsed_secs: start.elapsed().as_secs(),
                last: reason,
            });
        }
        log_warn!(
            "{what}: attempt {attempts} failed ({reason}); retrying in {:.1}s",
            delay.as_secs_f64()
        );
        pause(delay, abandoned);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// Sleeps for `delay`, or until `abandoned` is set (looked at every tenth of a second).
fn pause(delay: Duration, abandoned: &AtomicBool) {
    const GLANCE: Duration = Duration::from_millis(100);
    let until = Instant::now() + delay;
    while !abandoned.load(Ordering::Relaxed) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        std::thread::sleep(left.min(GLANCE));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_quotes_the_apis_reason_or_the_body() {
        let api = br#"{"error":{"code":"not_acceptable","message":"this agent reads \"v9\"","field":null}}"#;
        assert_eq!(refusal_text(api), "this agent reads \"v9\"");
        assert_eq!(refusal_text(b"plain words"), "plain words");
        let long = "x".repeat(QUOTED_BODY * 2);
        assert_eq!(refusal_text(long.as_bytes()).len(), QUOTED_BODY);
    }
}
