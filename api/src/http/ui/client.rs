//! The console's calls of the API, made in-process through the API's own route table ([`crate::http::api_router`]) with the
//! session's token as a `Bearer` token: every change the console makes is the API's request,
//! checked, authorised, journaled, audited and limited exactly as one from the CLI, and a
//! refusal is the API's own words ([`Answer::refusal`]). Nothing leaves the process.

use axum::body::Body;
use axum::http::{HeaderValue, Method, Request, StatusCode, header};
use serde::de::DeserializeOwned;
use tower::ServiceExt as _;

use super::session::Console;
use crate::app::AppState;
use crate::http::error::{ApiError, ErrorBody};

/// The largest answer the console reads (a page of 500 clusters fits).
const MAX_ANSWER_BYTES: usize = 8 * 1024 * 1024;

/// One call: what it asks for.
pub(super) struct Call<'a> {
    pub method: Method,
    pub path: String,
    pub body: Option<serde_json::Value>,
    /// The form's attempt, as `Idempotency-Key`: a form sent twice makes one change.
    pub attempt: Option<&'a str>,
}

impl Call<'_> {
    pub(super) fn get(path: String) -> Self {
        Self {
            method: Method::GET,
            path,
            body: None,
            attempt: None,
        }
    }
}

/// The API's answer.
pub(super) struct Answer {
    pub status: StatusCode,
    body: bytes::Bytes,
}

/// A refusal as the API worded it, and the field it names.
#[derive(Debug, serde::Serialize)]
pub(super) struct Refusal {
    pub message: String,
    pub field: Option<String>,
}

impl Answer {
    /// The answer's JSON as `T`, when the call succeeded.
    pub(super) fn json<T: DeserializeOwned>(&self) -> Result<T, ApiError> {
        if !self.status.is_success() {
            return Err(self.as_error());
        }
        serde_json::from_slice(&self.body).map_err(ApiError::internal)
    }

    /// Why the API refused, in its own words (its error body's message and field).
    pub(super) fn refusal(&self) -> Refusal {
        match serde_json::from_slice::<ErrorBody>(&self.body) {
            Ok(body) => Refusal {
                message: body.error.message,
                field: body.error.field,
            },
            Err(_) => Refusal {
                message: format!("the API answered {}", self.status),
                field: None,
            },
        }
    }

    /// A refusal as the console's error page shows it.
    fn as_error(&self) -> ApiError {
        let refusal = self.refusal();
        match self.status {
            StatusCode::NOT_FOUND => ApiError::NotFound,
            StatusCode::UNAUTHORIZED => ApiError::Unauthorized,
            StatusCode::CONFLICT => ApiError::Conflict(refusal.message),
            _ if self.status.is_client_error() => ApiError::Unprocessable {
                field: refusal.field,
                message: refusal.message,
            },
            _ => ApiError::Unavailable {
                retry_after_secs: 1,
            },
        }
    }
}

/// Makes `call` as `console`'s operator.
pub(super) async fn call(state: &AppState, console: &Console, call: Call<'_>) -> Answer {
    let mut request = Request::builder()
        .method(call.method)
        .uri(&call.path)
        .header(header::AUTHORIZATION, format!("Bearer {}", console.token()));
    if let Some(attempt) = call.attempt.and_then(|a| HeaderValue::from_str(a).ok()) {
        request = request.header("idempotency-key", attempt);
    }
    let body = match call.body {
        Some(json) => {
            request = request.header(header::CONTENT_TYPE, "application/json");
            Body::from(json.to_string())
        }
        None => Body::empty(),
    };
    let answered = match request.body(body) {
        Ok(request) => {
            crate::http::api_router(state.clone())
                .oneshot(request)
                .await
        }
        Err(e) => return failed(&e),
    };
    let response = match answered {
        Ok(response) => response,
        Err(infallible) => match infallible {},
    };
    let status = response.status();
    match axum::body::to_bytes(response.into_body(), MAX_ANSWER_BYTES).await {
        Ok(body) => Answer { status, body },
        Err(e) => failed(&e),
    }
}

/// A call that could not be made or read: logged, answered as the API answers its own faults.
fn failed(e: &dyn std::fmt::Display) -> Answer {
    tracing::error!(error = %e, "console: an API call could not be made");
    Answer {
        status: StatusCode::INTERNAL_SERVER_ERROR,
        body: bytes::Bytes::from_static(
            br#"{"error":{"code":"internal","message":"internal error"}}"#,
        ),
    }
}
