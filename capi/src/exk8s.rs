//! The exk8s API as the provider calls it: founding, a cluster's view, its trust and kubeconfig,
//! a change of its control plane and its delete, and its worker pools — with an org's operator
//! token, which no `Debug` output or error shows.

use std::time::Duration;

use exk8s_api_types::{
    ClusterPatch, ClusterTrust, ClusterView, CreateClusterRequest, CreatePoolRequest, ErrorBody,
    KubernetesVersionView, PoolView, UpdatePoolRequest,
};
use reqwest::header::{AUTHORIZATION, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

/// What calling the exk8s API can end in.
#[derive(Debug, thiserror::Error)]
pub enum Exk8sError {
    #[error("the exk8s API at {url} cannot be reached: {detail}")]
    Unreachable { url: String, detail: String },
    /// The API refused: its status, error code and message.
    #[error("the exk8s API answered {status} ({code}): {message}")]
    Refused {
        status: u16,
        code: String,
        message: String,
        /// How long the API asked to wait before trying again (`Retry-After`, in seconds).
        retry_after: Option<Duration>,
    },
    #[error("the exk8s API's answer to {what} could not be read: {detail}")]
    Unreadable { what: String, detail: String },
    #[error("the credentials are unusable: {0}")]
    Credentials(String),
}

impl Exk8sError {
    /// The API answered `status`.
    pub fn is_status(&self, status: StatusCode) -> bool {
        matches!(self, Self::Refused { status: s, .. } if *s == status.as_u16())
    }

    /// How long the API asked to wait before this is tried again, when it said.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Refused { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

/// How a delete stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deletion {
    /// The cluster (or pool) is gone, or was already.
    Gone,
    /// The API goes on deleting it (202), or it cannot be deleted yet (409: still founding).
    Pending,
}

/// A client of one exk8s API with one org's token.
#[derive(Clone)]
pub struct Exk8s {
    http: reqwest::Client,
    base: String,
    authorization: HeaderValue,
}

impl std::fmt::Debug for Exk8s {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exk8s")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

impl Exk8s {
    /// A client of `url` with `token`, trusting `ca_pem` beside the public roots when given.
    pub fn new(url: &str, token: &str, ca_pem: Option<&[u8]>) -> Result<Self, Exk8sError> {
        let base = url.trim().trim_end_matches('/').to_owned();
        if !(base.starts_with("https://") || base.starts_with("http://")) {
            return Err(Exk8sError::Credentials(format!(
                "url must be an http(s) URL, got {base:?}"
            )));
        }
        let mut authorization = HeaderValue::from_str(&format!("Bearer {}", token.trim()))
            .map_err(|_| {
                Exk8sError::Credentials("token holds characters a header cannot".into())
            })?;
        authorization.set_sensitive(true);
        let mut builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(60))
            .user_agent(concat!("exk8s-capi/", env!("CARGO_PKG_VERSION")));
        if let Some(pem) = ca_pem {
            for cert in reqwest::Certificate::from_pem_bundle(pem).map_err(|e| {
                Exk8sError::Credentials(format!("ca.crt is not PEM certificates: {e}"))
            })? {
                builder = builder.add_root_certificate(cert);
            }
        }
        let http = builder
            .build()
            .map_err(|e| Exk8sError::Credentials(format!("no HTTP client: {e}")))?;
        Ok(Self {
            http,
            base,
            authorization,
        })
    }

    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<reqwest::Response, Exk8sError> {
        self.send_keyed(method, path, body, None).await
    }

    /// [`Self::send`] with an `Idempotency-Key`: a retry of a request whose answer was lost
    /// gets the first answer instead of doing it twice.
    async fn send_keyed(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
        idempotency_key: Option<&str>,
    ) -> Result<reqwest::Response, Exk8sError> {
        let url = format!("{}{path}", self.base);
        let mut request = self
            .http
            .request(method, &url)
            .header(AUTHORIZATION, self.authorization.clone());
        if let Some(key) = idempotency_key {
            request = request.header("Idempotency-Key", key);
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await.map_err(|e| Exk8sError::Unreachable {
            url: url.clone(),
            detail: error_chain(&e),
        })?;
        if response.status().is_success() {
            return Ok(response);
        }
        let status = response.status();
        // Delta-seconds, as the exk8s API sends it.
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response.text().await.unwrap_or_default();
        let (code, message) = match serde_json::from_str::<ErrorBody>(&text) {
            Ok(body) => (body.error.code, body.error.message),
            Err(_) => (
                status.canonical_reason().unwrap_or("error").to_owned(),
                text.chars().take(300).collect(),
            ),
        };
        Err(Exk8sError::Refused {
            status: status.as_u16(),
            code,
            message,
            retry_after,
        })
    }

    async fn json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&impl serde::Serialize>,
    ) -> Result<T, Exk8sError> {
        let response = self.send(method.clone(), path, body).await?;
        let bytes = response
            .bytes()
            .await
            .map_err(|e| Exk8sError::Unreachable {
                url: format!("{}{path}", self.base),
                detail: error_chain(&e),
            })?;
        serde_json::from_slice(&bytes).map_err(|e| Exk8sError::Unreadable {
            what: format!("{method} {path}"),
            detail: e.to_string(),
        })
    }

    /// The Kubernetes versions the API installs: proves the URL and token work.
    pub async fn versions(&self) -> Result<Vec<KubernetesVersionView>, Exk8sError> {
        self.json(Method::GET, "/kubernetes-versions", None::<&()>)
            .await
    }

    /// Founds a cluster; its id.
    pub async fn found(&self, request: &CreateClusterRequest) -> Result<i64, Exk8sError> {
        let answer: serde_json::Value = self.json(Method::POST, "/clusters", Some(request)).await?;
        // 202 answers the cluster's view (`id`), 201 what founding made (`cluster_id`).
        answer["id"]
            .as_i64()
            .or_else(|| answer["cluster_id"].as_i64())
            .ok_or_else(|| Exk8sError::Unreadable {
                what: "POST /clusters".into(),
                detail: "no cluster id in the answer".into(),
            })
    }

    /// The org's cluster named `name`, if any (every page read).
    pub async fn find(&self, name: &str) -> Result<Option<ClusterView>, Exk8sError> {
        let mut path = "/clusters?limit=500".to_owned();
        loop {
            let response = self.send(Method::GET, &path, None::<&()>).await?;
            let next = response
                .headers()
                .get(reqwest::header::LINK)
                .and_then(|l| l.to_str().ok())
                .and_then(next_link);
            let page: Vec<ClusterView> =
                response.json().await.map_err(|e| Exk8sError::Unreadable {
                    what: "GET /clusters".into(),
                    detail: error_chain(&e),
                })?;
            if let Some(found) = page.into_iter().find(|c| c.name == name) {
                return Ok(Some(found));
            }
            match next {
                Some(next) => path = next,
                None => return Ok(None),
            }
        }
    }

    /// Cluster `id`'s view; `None` once it is gone.
    pub async fn cluster(&self, id: i64) -> Result<Option<ClusterView>, Exk8sError> {
        match self
            .json(Method::GET, &format!("/clusters/{id}"), None::<&()>)
            .await
        {
            Err(e) if e.is_status(StatusCode::NOT_FOUND) => Ok(None),
            other => other.map(Some),
        }
    }

    /// What a client of cluster `id`'s apiservers trusts now.
    pub async fn trust(&self, id: i64) -> Result<ClusterTrust, Exk8sError> {
        self.json(Method::GET, &format!("/clusters/{id}/trust"), None::<&()>)
            .await
    }

    /// A fresh admin kubeconfig of cluster `id` (a new client certificate).
    pub async fn kubeconfig(&self, id: i64) -> Result<String, Exk8sError> {
        let path = format!("/clusters/{id}/kubeconfig");
        self.send(Method::GET, &path, None::<&()>)
            .await?
            .text()
            .await
            .map_err(|e| Exk8sError::Unreachable {
                url: format!("{}{path}", self.base),
                detail: error_chain(&e),
            })
    }

    /// Asks for one change of cluster `id`'s control plane.
    pub async fn change(&self, id: i64, patch: &ClusterPatch) -> Result<(), Exk8sError> {
        self.send(Method::PATCH, &format!("/clusters/{id}"), Some(patch))
            .await
            .map(drop)
    }

    /// Deletes cluster `id`.
    pub async fn delete(&self, id: i64) -> Result<Deletion, Exk8sError> {
        self.delete_path(&format!("/clusters/{id}")).await
    }

    /// Cluster `id`'s worker pools.
    pub async fn pools(&self, id: i64) -> Result<Vec<PoolView>, Exk8sError> {
        self.json(
            Method::GET,
            &format!("/clusters/{id}/node-pools"),
            None::<&()>,
        )
        .await
    }

    /// Pool `pool` of cluster `id`; `None` once it (or the cluster) is gone.
    pub async fn pool(&self, id: i64, pool: i64) -> Result<Option<PoolView>, Exk8sError> {
        let path = format!("/clusters/{id}/node-pools/{pool}");
        match self.json(Method::GET, &path, None::<&()>).await {
            Err(e) if e.is_status(StatusCode::NOT_FOUND) => Ok(None),
            other => other.map(Some),
        }
    }

    /// Adds a pool to cluster `id`, once per `idempotency_key`.
    pub async fn create_pool(
        &self,
        id: i64,
        request: &CreatePoolRequest,
        idempotency_key: &str,
    ) -> Result<PoolView, Exk8sError> {
        let path = format!("/clusters/{id}/node-pools");
        let response = self
            .send_keyed(Method::POST, &path, Some(request), Some(idempotency_key))
            .await?;
        response.json().await.map_err(|e| Exk8sError::Unreadable {
            what: format!("POST {path}"),
            detail: error_chain(&e),
        })
    }

    /// Changes pool `pool` of cluster `id`.
    pub async fn update_pool(
        &self,
        id: i64,
        pool: i64,
        change: &UpdatePoolRequest,
    ) -> Result<(), Exk8sError> {
        let path = format!("/clusters/{id}/node-pools/{pool}");
        self.send(Method::PATCH, &path, Some(change))
            .await
            .map(drop)
    }

    /// Deletes pool `pool` of cluster `id` (its workers drained and released first).
    pub async fn delete_pool(&self, id: i64, pool: i64) -> Result<Deletion, Exk8sError> {
        self.delete_path(&format!("/clusters/{id}/node-pools/{pool}"))
            .await
    }

    async fn delete_path(&self, path: &str) -> Result<Deletion, Exk8sError> {
        match self.send(Method::DELETE, path, None::<&()>).await {
            Ok(r) if r.status() == StatusCode::ACCEPTED => Ok(Deletion::Pending),
            Ok(_) => Ok(Deletion::Gone),
            Err(e) if e.is_status(StatusCode::NOT_FOUND) => Ok(Deletion::Gone),
            Err(e) if e.is_status(StatusCode::CONFLICT) => Ok(Deletion::Pending),
            Err(e) => Err(e),
        }
    }
}

/// The path of a `Link` header's `rel="next"` target.
fn next_link(header: &str) -> Option<String> {
    header.split(',').find_map(|part| {
        let (target, params) = part.split_once(';')?;
        params.contains("rel=\"next\"").then(|| {
            target
                .trim()
                .trim_start_matches('<')
                .trim_end_matches('>')
                .to_owned()
        })
    })
}

/// An error and its sources, one line.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_next_page_is_read_from_the_link_header() {
        assert_eq!(
            next_link("</clusters?limit=500&cursor=abc>; rel=\"next\"").as_deref(),
            Some("/clusters?limit=500&cursor=abc")
        );
        assert_eq!(next_link("</x>; rel=\"prev\""), None);
    }

    #[test]
    fn no_debug_output_shows_the_token() {
        let client = Exk8s::new("https://exk8s.example", "s3cr3t-token", None).unwrap();
        assert!(!format!("{client:?}").contains("s3cr3t"));
    }

    #[test]
    fn a_url_that_is_not_http_is_refused_by_name() {
        let error = Exk8s::new("exk8s.example", "t", None).unwrap_err();
        assert!(
            error.to_string().contains("url must be an http(s) URL"),
            "{error}"
        );
    }
}
