//! Calls to the exk8s API with the operator's token: JSON in and out, a busy API waited out
//! ([`retry`]), and every error body (`{"error": {"code", "message", "field"}}`) turned into a
//! [`CliError::Api`].

#![allow(
    clippy::result_large_err,
    reason = "ureq::Error as ureq returns it: boxing it per request gains nothing"
)]

use std::time::Duration;

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::Session;
use crate::error::CliError;
use crate::retry;

/// The largest answer read (a cluster list of hundreds of clusters fits many times).
const MAX_BODY: u64 = 64 * 1024 * 1024;

/// How long one event stream is read before it is reopened where it stopped.
const STREAM_FOR: Duration = Duration::from_secs(600);

pub(crate) struct Api {
    session: Session,
    agent: ureq::Agent,
}

impl Api {
    /// A cluster named by id or by name.
    pub(crate) fn cluster_id(&self, cluster: &str) -> Result<i64, CliError> {
        if let Ok(id) = cluster.parse::<i64>() {
            return Ok(id);
        }
        let list: Vec<exk8s_api_types::ClusterView> = self.get_all("/clusters")?;
        list.iter()
            .find(|c| c.name == cluster)
            .map(|c| c.id)
            .ok_or_else(|| CliError::Failed(format!("no cluster named `{cluster}`")))
    }

    /// The API's base URL.
    pub(crate) fn base(&self) -> &str {
        &self.session.api
    }

    pub(crate) fn new(session: Session) -> Self {
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(10))
            .timeout(Duration::from_secs(300))
            .user_agent(concat!("exk8s-cli/", env!("CARGO_PKG_VERSION")))
            .build();
        Self { session, agent }
    }

    fn request(&self, method: &str, path: &str) -> ureq::Request {
        self.agent
            .request(method, &format!("{}{path}", self.session.api))
            .set(
                "Authorization",
                &format!("Bearer {}", self.session.token.expose()),
            )
    }

    /// `GET path`, its JSON read as `T`.
    pub(crate) fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T, CliError> {
        let response = self.call("GET", false, || self.request("GET", path).call())?;
        json(path, response)
    }

    /// Every page of a paged list (`GET path`, then each `Link: <…>; rel="next"`), joined.
    pub(crate) fn get_all<T: DeserializeOwned>(&self, path: &str) -> Result<Vec<T>, CliError> {
        let mut all = Vec::new();
        let mut next = Some(path.to_owned());
        while let Some(path) = next.take() {
            let response = self.call("GET", false, || self.request("GET", &path).call())?;
            next = response.header("link").and_then(next_page);
            all.extend(json::<Vec<T>>(&path, response)?);
        }
        Ok(all)
    }

    /// `GET path` as text (a kubeconfig).
    pub(crate) fn get_text(&self, path: &str) -> Result<zeroize::Zeroizing<String>, CliError> {
        let response = self.call("GET", false, || self.request("GET", path).call())?;
        read(response).map(zeroize::Zeroizing::new)
    }

    /// `GET path`'s body written to a new file `to` (mode 0600; removed again on failure);
    /// its SHA-256 in hex.
    pub(crate) fn download(&self, path: &str, to: &std::path::Path) -> Result<String, CliError> {
        use sha2::Digest as _;
        use std::io::{Read as _, Write as _};
        use std::os::unix::fs::OpenOptionsExt as _;
        let response = self.call("GET", false, || {
            self.request("GET", path)
                .timeout(Duration::from_secs(6 * 3600))
                .call()
        })?;
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(to)
            .map_err(|e| CliError::io(format!("creating {}", to.display()), e))?;
        let mut body = response.into_reader();
        let mut digest = sha2::Sha256::new();
        let mut buffer = vec![0u8; 1 << 16];
        let copied = loop {
            match body.read(&mut buffer) {
                Ok(0) => break file.sync_all(),
                Ok(n) => {
                    digest.update(&buffer[..n]);
                    if let Err(e) = file.write_all(&buffer[..n]) {
                        break Err(e);
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if let Err(e) = copied {
            let _ = std::fs::remove_file(to);
            return Err(CliError::io(format!("downloading to {}", to.display()), e));
        }
        Ok(digest
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect())
    }

    /// `GET path` as a Server-Sent Event stream, resumed after `last_event_id`: its body, read
    /// as it arrives (a stream lives at most `STREAM_FOR`; the caller resumes it).
    pub(crate) fn events(
        &self,
        path: &str,
        last_event_id: Option<i64>,
    ) -> Result<Box<dyn std::io::Read + Send + Sync>, CliError> {
        let response = self.call("GET", false, || {
            let request = self
                .request("GET", path)
                .timeout(STREAM_FOR)
                .set("Accept", "text/event-stream");
            match last_event_id {
                Some(id) => request.set("Last-Event-ID", &id.to_string()),
                None => request,
            }
            .call()
        })?;
        Ok(response.into_reader())
    }

    /// `method path` with an optional JSON body and Idempotency-Key; the answer read as `T`,
    /// `None` when it has none (204).
    pub(crate) fn send<T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&(impl Serialize + ?Sized)>,
        idempotency_key: Option<&str>,
    ) -> Result<Option<T>, CliError> {
        let response = self.call(method, idempotency_key.is_some(), || {
            let mut request = self.request(method, path);
            if let Some(key) = idempotency_key {
                request = request.set("Idempotency-Key", key);
            }
            match body {
                Some(body) => request.send_json(body),
                None => request.call(),
            }
        })?;
        if response.status() == 204 {
            return Ok(None);
        }
        json(path, response).map(Some)
    }

    /// Sends (`send`, a `method` request; `keyed`: with an `Idempotency-Key`), waiting out a
    /// busy API as [`retry`] allows; an error answer read as the operator should read it.
    fn call(
        &self,
        method: &str,
        keyed: bool,
        send: impl FnMut() -> Result<ureq::Response, ureq::Error>,
    ) -> Result<ureq::Response, CliError> {
        let tell = |status: u16, wait: Duration, n: u32| {
            eprintln!(
                "exk8s: the API asks to wait ({status}): sending {method} again in {} s ({n} of at most {})",
                wait.as_secs(),
                retry::MAX_WAITS
            );
        };
        match retry::send_while_busy(method, keyed, send, std::thread::sleep, tell) {
            Ok(response) => Ok(response),
            Err(ureq::Error::Status(status, response)) => Err(refusal(status, response)),
            Err(ureq::Error::Transport(t)) => Err(CliError::Unreachable {
                url: self.session.api.clone(),
                reason: t.to_string(),
            }),
        }
    }
}

/// The path of a `Link` header's `rel="next"` target.
fn next_page(link: &str) -> Option<String> {
    link.split(',').find_map(|part| {
        let (target, params) = part.trim().split_once(';')?;
        params
            .split(';')
            .any(|p| p.trim() == "rel=\"next\"")
            .then(|| {
                target
                    .trim()
                    .trim_start_matches('<')
                    .trim_end_matches('>')
                    .to_owned()
            })
    })
}

fn read(response: ureq::Response) -> Result<String, CliError> {
    use std::io::Read as _;
    let mut text = String::new();
    response
        .into_reader()
        .take(MAX_BODY)
        .read_to_string(&mut text)
        .map_err(|e| CliError::Unexpected(format!("reading the answer: {e}")))?;
    Ok(text)
}

fn json<T: DeserializeOwned>(path: &str, response: ureq::Response) -> Result<T, CliError> {
    let status = response.status();
    let text = read(response)?;
    serde_json::from_str(&text).map_err(|e| {
        CliError::Unexpected(format!(
            "the answer of {path} (status {status}) is not what this CLI reads: {e}"
        ))
    })
}

/// An error answer as the operator should read it.
fn refusal(status: u16, response: ureq::Response) -> CliError {
    let body = read(response).ok();
    let error = body
        .as_deref()
        .and_then(|t| serde_json::from_str::<exk8s_api_types::ErrorBody>(t).ok());
    match error {
        Some(exk8s_api_types::ErrorBody { error }) => CliError::Api {
            status,
            field: error.field,
            message: error.message,
        },
        None => CliError::Api {
            status,
            field: None,
            message: "the answer carried no error body".into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::next_page;

    #[test]
    fn the_next_page_is_read_from_a_link_header() {
        assert_eq!(
            next_page("</clusters?limit=2&cursor=c2>; rel=\"next\"").as_deref(),
            Some("/clusters?limit=2&cursor=c2")
        );
        assert_eq!(
            next_page("</a>; rel=\"prev\", </b>; rel=\"next\"").as_deref(),
            Some("/b")
        );
        assert_eq!(next_page("</a>; rel=\"prev\""), None);
    }
}
