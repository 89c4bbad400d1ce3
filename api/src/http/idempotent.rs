//! `Idempotency-Key` on the routes that create: a retry with the same key and request gets
//! the first response (sealed at rest: a founding's holds a kubeconfig); the key with another
//! request — another body, or another route — is refused (422); a retry while the first is
//! still running is told to wait (409 `wait` with `Retry-After`). Keys are per org, kept a
//! day. A failure a retry may fix (5xx, 409, 429, 408) forgets the key; any other answer is
//! kept, exactly as it was given. Work that was done is answered even when the database will
//! not take that ending yet: the ending is retried in the background, and until it lands a
//! retry of the key is told to wait.

use std::future::Future;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::error::ApiError;
use crate::app::AppState;
use crate::db::{self, idempotency::Claim, idempotency::Ending};

/// The request's key, checked: 1–200 visible ASCII characters.
pub(super) fn key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| (1..=200).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic()));
    key.map(|k| Some(k.to_owned())).ok_or_else(|| {
        ApiError::invalid(
            "Idempotency-Key",
            "Idempotency-Key must be 1–200 visible ASCII characters",
        )
    })
}

/// The `Retry-After` of a refusal while the key's first request is in progress: a claim's
/// ending the database refused is tried again every second ([`END_RETRY_EVERY`]).
const IN_FLIGHT_RETRY_AFTER_SECS: u64 = 1;

/// What a request is, for comparing a retry with the first: `scope` names the route and its
/// target (empty for `POST /clusters`, whose stored hashes predate scopes), `body` the request.
pub(super) struct Request<'a> {
    pub(super) scope: &'a str,
    pub(super) body: &'a [u8],
    /// The `Location` an answer names, read from its status and body (a replay answers the
    /// same `Location` as the first).
    pub(super) locate: Option<Locate>,
}

/// Reads the `Location` of an answer from its status and body.
pub(super) type Locate = fn(StatusCode, &[u8]) -> Option<String>;

/// Whether an answer is final, the same whatever the retry: a server error, a conflict with
/// something in progress (409), a rate limit (429) or a timeout (408) is not, and is never kept
/// for the key.
fn is_final(status: StatusCode) -> bool {
    !(status.is_server_error()
        || matches!(
            status,
            StatusCode::CONFLICT | StatusCode::TOO_MANY_REQUESTS | StatusCode::REQUEST_TIMEOUT
        ))
}

/// Runs `work` once per key; without a key, every time.
pub(super) async fn run<F, Fut>(
    state: &AppState,
    org_id: i64,
    key: Option<String>,
    request: Request<'_>,
    work: F,
) -> Result<Response, ApiError>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<(StatusCode, Vec<u8>), ApiError>>,
{
    let locate = request.locate;
    let json = |(status, body): (StatusCode, Vec<u8>)| {
        let location = locate
            .and_then(|locate| locate(status, &body))
            .and_then(|l| header::HeaderValue::try_from(l).ok());
        let mut response =
            (status, [(header::CONTENT_TYPE, "application/json")], body).into_response();
        if let Some(location) = location {
            response.headers_mut().insert(header::LOCATION, location);
        }
        response
    };
    let Some(key) = key else {
        return work().await.map(json);
    };
    let mut hashed = request.scope.as_bytes().to_vec();
    hashed.extend_from_slice(request.body);
    let request_hash = exk8s_common::names::Sha256Digest::of(&hashed).to_hex();
    let aad = format!("idempotency/{org_id}/{key}");
    let claimed_at = db::now();
    let mut tx = state.db.begin().await?;
    let claim = db::idempotency::claim(&mut tx, org_id, &key, &request_hash, claimed_at).await?;
    tx.commit().await?;
    match claim {
        Claim::Mismatch => Err(ApiError::Unprocessable {
            field: Some("Idempotency-Key".into()),
            message: "this Idempotency-Key was used with a different request".into(),
        }),
        Claim::InFlight => Err(ApiError::Wait {
            message: "a request with this Idempotency-Key is still in progress: send it again \
                      after the Retry-After seconds"
                .into(),
            retry_after_secs: IN_FLIGHT_RETRY_AFTER_SECS,
        }),
        Claim::Done {
            status,
            response_sealed,
        } => {
            let body = state
                .keks
                .open(&aad, &response_sealed)
                .map_err(ApiError::internal)?;
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            Ok(json((status, body.to_vec())))
        }
        Claim::New => {
            let claim = Claimed {
                org_id,
                key,
                claimed_at,
            };
            match work().await {
                Ok((status, body)) => {
                    let sealed = state.keks.seal(&aad, &body).map_err(ApiError::internal)?;
                    // The work is done: its answer is the client's even if keeping it for a
                    // replay has to wait for the database.
                    claim
                        .end(
                            state,
                            Ending::Done {
                                status: status.as_u16(),
                                response_sealed: sealed,
                            },
                        )
                        .await;
                    Ok(json((status, body)))
                }
                Err(error) => {
                    let status = error.status_code();
                    if !is_final(status) {
                        // A retry may succeed: let it run.
                        claim.end(state, Ending::Released).await;
                        return Err(error);
                    }
                    // The answer is kept as the client saw it (its code and message), so
                    // that a replay says the same.
                    let (parts, body) = error.into_response().into_parts();
                    let body = axum::body::to_bytes(body, usize::MAX)
                        .await
                        .map_err(ApiError::internal)?;
                    let sealed = state.keks.seal(&aad, &body).map_err(ApiError::internal)?;
                    claim
                        .end(
                            state,
                            Ending::Done {
                                status: status.as_u16(),
                                response_sealed: sealed,
                            },
                        )
                        .await;
                    Ok(Response::from_parts(parts, axum::body::Body::from(body)))
                }
            }
        }
    }
}

/// A key this request claimed.
struct Claimed {
    org_id: i64,
    key: String,
    claimed_at: i64,
}

/// How often, and how many times, an ending the database refused is tried again: for a minute,
/// well inside the time after which a claim counts as abandoned.
const END_RETRY_EVERY: Duration = Duration::from_secs(1);
const END_TRIES: u32 = 60;

impl Claimed {
    /// Ends the claim. When the database refuses now (a burst has every connection, or it is
    /// down), the ending is tried again in the background: a claim left in flight would answer
    /// every retry of the key 409 until it counted as abandoned.
    async fn end(self, state: &AppState, ending: Ending) {
        if self.try_end(&state.db, &ending, 1).await {
            return;
        }
        let db = state.db.clone();
        tokio::spawn(async move {
            for attempt in 2..=END_TRIES {
                tokio::time::sleep(END_RETRY_EVERY).await;
                if self.try_end(&db, &ending, attempt).await {
                    return;
                }
            }
            tracing::error!(
                org_id = self.org_id,
                attempts = END_TRIES,
                "an Idempotency-Key's claim could not be ended; retries of it answer 409 until \
                 it counts as abandoned"
            );
        });
    }

    /// One attempt; true when nothing is left to do.
    async fn try_end(&self, db: &db::Db, ending: &Ending, attempt: u32) -> bool {
        match db::idempotency::end(&db.pool, self.org_id, &self.key, self.claimed_at, ending).await
        {
            Ok(_) => true,
            Err(e) => {
                tracing::warn!(
                    org_id = self.org_id,
                    attempt,
                    error = %crate::error_chain(&e),
                    "cannot end an Idempotency-Key's claim yet; trying again"
                );
                false
            }
        }
    }
}
