//! The instance-metadata service: a session token, then this VM's identity and its bootstrap
//! access token. Tokens are [`Secret`]s: never logged, never in `Debug`.

use std::time::Duration;

use serde::Deserialize;

use crate::error::AgentError;
use crate::http::{Attempt, classify, read_capped, retry};

/// Header carrying the IMDS session token (to IMDS itself and to the bootstrap API).
pub use exk8s_common::contract::IMDS_TOKEN_HEADER;
/// IMDS answers are small; anything larger is refused.
const MAX_IMDS_BODY: u64 = 64 * 1024;

/// A credential. Prints as `[redacted]`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Self(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Who this VM is, with the two credentials the bootstrap API requires.
#[derive(Debug, Clone)]
pub struct Identity {
    pub vm_id: u64,
    pub imds_token: Secret,
    pub access_token: Secret,
}

#[derive(Deserialize)]
struct NodeIdentity {
    node_id: u64,
}

#[derive(Deserialize)]
struct AccessToken {
    access_token: String,
}

/// This VM's id and an IMDS session token: all a node's signed day-2 requests need from
/// instance metadata.
#[derive(Debug, Clone)]
pub struct Session {
    pub vm_id: u64,
    pub imds_token: Secret,
}

/// Fetches the session token (retrying until `deadline`, as a VM's metadata service may come
/// up after the agent), then the VM's identity.
pub fn session(agent: &ureq::Agent, base: &str, deadline: Duration) -> Result<Session, AgentError> {
    let base = base.trim_end_matches('/');
    let token = retry("fetching the IMDS session token", deadline, || {
        let response = match classify("IMDS token", agent.get(&format!("{base}/token")).call()) {
            Ok(r) => r,
            Err(attempt) => return relay(attempt),
        };
        match read_capped(response, MAX_IMDS_BODY) {
            Ok(body) => match String::from_utf8(body) {
                Ok(text) if !text.trim().is_empty() => {
                    Attempt::Done(Secret::new(text.trim().to_owned()))
                }
                _ => Attempt::Retry {
                    reason: "empty or non-UTF-8 token".into(),
                    after: None,
                },
            },
            Err(reason) => Attempt::Retry {
                reason,
                after: None,
            },
        }
    })?;
    let node: NodeIdentity = get_json(
        agent,
        base,
        "latest/identity/node-identity",
        &token,
        deadline,
    )?;
    Ok(Session {
        vm_id: node.node_id,
        imds_token: token,
    })
}

/// The session, then the bootstrap access token (the first fetch's second credential).
pub fn identity(
    agent: &ureq::Agent,
    base: &str,
    deadline: Duration,
) -> Result<Identity, AgentError> {
    let session = session(agent, base, deadline)?;
    let access: AccessToken = get_json(
        agent,
        base.trim_end_matches('/'),
        "latest/identity/access-token",
        &session.imds_token,
        deadline,
    )?;
    if access.access_token.trim().is_empty() {
        return Err(AgentError::Rejected {
            what: "IMDS access token",
            status: 200,
            body: "empty access token".into(),
        });
    }
    Ok(Identity {
        vm_id: session.vm_id,
        imds_token: session.imds_token,
        access_token: Secret::new(access.access_token),
    })
}

fn get_json<T: for<'de> Deserialize<'de>>(
    agent: &ureq::Agent,
    base: &str,
    path: &'static str,
    token: &Secret,
    deadline: Duration,
) -> Result<T, AgentError> {
    retry(path, deadline, || {
        let request = agent
            .get(&format!("{base}/{path}"))
            .set(IMDS_TOKEN_HEADER, token.expose());
        let response = match classify(path, request.call()) {
            Ok(r) => r,
            Err(attempt) => return relay(attempt),
        };
        match read_capped(response, MAX_IMDS_BODY).map(|b| serde_json::from_slice::<T>(&b)) {
            Ok(Ok(value)) => Attempt::Done(value),
            Ok(Err(e)) => Attempt::Fatal(AgentError::Rejected {
                what: path,
                status: 200,
                body: format!("unexpected JSON: {e}"),
            }),
            Err(reason) => Attempt::Retry {
                reason,
                after: None,
            },
        }
    })
}

/// Re-types a non-success attempt.
pub fn relay<T>(attempt: Attempt<std::convert::Infallible>) -> Attempt<T> {
    match attempt {
        Attempt::Retry { reason, after } => Attempt::Retry { reason, after },
        Attempt::Fatal(e) => Attempt::Fatal(e),
        Attempt::Done(never) => match never {},
    }
}
