//! Extractors: a JSON body that answers with our error format and names the failing field, and
//! the operator's identity from a bearer token.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header;
use axum::http::request::Parts;
use bytes::Bytes;
use serde::de::DeserializeOwned;

use super::error::ApiError;
use crate::app::AppState;
use crate::db;
use crate::tokens::{self, Scope};

/// Largest accepted request body.
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A JSON body; bad JSON, wrong types and unknown fields answer 400 naming the field.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let json = req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(ApiError::UnsupportedMediaType);
        }
        let bytes = Bytes::from_request(req, state)
            .await
            .map_err(|_| ApiError::PayloadTooLarge(MAX_BODY_BYTES))?;
        decode_json(&bytes).map(Self)
    }
}

/// Decodes a JSON request body; an error names the failing field's path. The one parser behind
/// [`ApiJson`] (and the `create_cluster_body` fuzz target).
///
/// The body must be a JSON object: serde would otherwise accept a struct in its sequence form
/// (`[1, 1, "dev.small", …]`), which no client means and no schema documents.
pub fn decode_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::Invalid {
            field: None,
            message: "invalid JSON body: the body must be a JSON object".into(),
        });
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let field = (path != ".").then_some(path);
        ApiError::Invalid {
            field,
            message: format!("invalid JSON body: {inner}"),
        }
    })
}

/// A path parameter; one that does not parse answers 400 in our error format, naming it.
pub struct ApiPath<T>(pub T);

impl<T, S> FromRequestParts<S> for ApiPath<T>
where
    T: DeserializeOwned + Send,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match axum::extract::Path::<T>::from_request_parts(parts, state).await {
            Ok(axum::extract::Path(value)) => Ok(Self(value)),
            Err(rejection) => Err(ApiError::Invalid {
                field: None,
                message: format!("invalid path: {}", rejection.body_text()),
            }),
        }
    }
}

/// The bearer token of a request, if any.
pub fn bearer(parts: &Parts) -> Option<&str> {
    let value = parts.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let token = value.strip_prefix("Bearer ")?.trim();
    (!token.is_empty() && token.len() <= 256).then_some(token)
}

/// An authenticated operator: the org comes from the token, never from the body.
#[derive(Debug, Clone)]
pub struct Operator {
    pub org_id: i64,
    pub principal: String,
    /// The token's row: streams are bounded per token and end when it is revoked.
    pub token_id: i64,
    /// When the token expires (unix seconds).
    pub expires_at: i64,
}

impl Operator {
    /// The operator `token` is: unknown, expired or revoked is 401, another scope 403.
    pub async fn of_token(state: &AppState, token: &str) -> Result<Self, ApiError> {
        let record = db::tokens::find_api_token(&state.db.pool, &tokens::hash(token))
            .await?
            .ok_or(ApiError::Unauthorized)?;
        if record.revoked || record.expires_at <= db::now() {
            tracing::info!(
                token_id = record.id,
                revoked = record.revoked,
                "expired or revoked operator token"
            );
            return Err(ApiError::Unauthorized);
        }
        if record.scope != Scope::Operator {
            return Err(ApiError::Forbidden(
                "this token's scope does not allow operator calls",
            ));
        }
        Ok(Self {
            org_id: record.org_id,
            principal: record.principal,
            token_id: record.id,
            expires_at: record.expires_at,
        })
    }
}

impl FromRequestParts<AppState> for Operator {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        state: &AppState,
    ) -> Result<Self, Self::Rejection> {
        let token = bearer(parts).ok_or(ApiError::Unauthorized)?;
        Self::of_token(state, token).await
    }
}
