//! [`ApiError`]: every failure the API answers with, mapped exhaustively to a status. The body
//! is always `{"error": {"code", "message", "field"}}`. Internal errors are logged with their
//! chain and answered with a generic message.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

use crate::db::DbError;
pub use exk8s_api_types::{ErrorBody, ErrorDetail};

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{message}")]
    Invalid {
        field: Option<String>,
        message: String,
    },
    #[error("{message}")]
    Unprocessable {
        field: Option<String>,
        message: String,
    },
    #[error("missing, invalid, expired or revoked credentials")]
    Unauthorized,
    #[error("{0}")]
    Forbidden(&'static str),
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Gone(String),
    /// The request is right but must wait for something else to finish (a rollout's turn).
    #[error("{message}")]
    Wait {
        message: String,
        retry_after_secs: u64,
    },
    #[error("the request body exceeds {0} bytes")]
    PayloadTooLarge(usize),
    #[error("the request body must be JSON (Content-Type: application/json)")]
    UnsupportedMediaType,
    /// The caller reads none of the formats the answer comes in (an agent and its bundle).
    #[error("{0}")]
    NotAcceptable(String),
    #[error("too many requests")]
    RateLimited { retry_after_secs: u64 },
    /// A per-org quota would be passed (409: it clears as the org deletes things).
    #[error("{0}")]
    QuotaExceeded(String),
    /// A bound on open streams was reached (per token or per server).
    #[error("{message}")]
    TooManyStreams {
        message: String,
        retry_after_secs: u64,
    },
    #[error("the service is temporarily unavailable")]
    Unavailable { retry_after_secs: u64 },
    #[error("{0}")]
    BadGateway(String),
    #[error("internal error")]
    Internal(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl ApiError {
    pub fn invalid(field: &str, message: impl Into<String>) -> Self {
        Self::Invalid {
            field: Some(field.to_owned()),
            message: message.into(),
        }
    }

    pub fn internal(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self::Internal(Box::new(e))
    }

    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::Invalid { .. } => StatusCode::BAD_REQUEST,
            Self::Unprocessable { .. } => StatusCode::UNPROCESSABLE_ENTITY,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden(_) => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::Conflict(_) => StatusCode::CONFLICT,
            Self::Gone(_) => StatusCode::GONE,
            Self::Wait { .. } => StatusCode::CONFLICT,
            Self::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            Self::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            Self::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::TooManyStreams { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::QuotaExceeded(_) => StatusCode::CONFLICT,
            Self::Unavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::BadGateway(_) => StatusCode::BAD_GATEWAY,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            Self::Invalid { .. } => "invalid_request",
            Self::Unprocessable { .. } => "unprocessable",
            Self::Unauthorized => "unauthorized",
            Self::Forbidden(_) => "forbidden",
            Self::NotFound => "not_found",
            Self::Conflict(_) => "conflict",
            Self::Gone(_) => "gone",
            Self::Wait { .. } => "wait",
            Self::PayloadTooLarge(_) => "payload_too_large",
            Self::UnsupportedMediaType => "unsupported_media_type",
            Self::NotAcceptable(_) => "not_acceptable",
            Self::RateLimited { .. } => "rate_limited",
            Self::TooManyStreams { .. } => "too_many_streams",
            Self::QuotaExceeded(_) => "quota_exceeded",
            Self::Unavailable { .. } => "unavailable",
            Self::BadGateway(_) => "upstream_failed",
            Self::Internal(_) => "internal",
        }
    }
}

impl From<DbError> for ApiError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::Unavailable(_) | DbError::WritesFailing { .. } => {
                tracing::warn!(error = %crate::error_chain(&e), "database unavailable");
                Self::Unavailable {
                    retry_after_secs: 5,
                }
            }
            DbError::Duplicate(_) => {
                Self::Conflict("the request collides with a record that already exists".into())
            }
            DbError::Query(_)
            | DbError::Migrate(_)
            | DbError::SchemaTooNew { .. }
            | DbError::UnsupportedUrl
            | DbError::Random => Self::internal(e),
        }
    }
}

impl From<crate::field::FieldError> for ApiError {
    fn from(e: crate::field::FieldError) -> Self {
        Self::Invalid {
            field: Some(e.field),
            message: e.message,
        }
    }
}

impl From<crate::quotas::QuotaError> for ApiError {
    fn from(e: crate::quotas::QuotaError) -> Self {
        match e {
            crate::quotas::QuotaError::Exceeded(e) => Self::QuotaExceeded(e.to_string()),
            crate::quotas::QuotaError::Db(db) => db.into(),
        }
    }
}

impl From<crate::founding::FoundingError> for ApiError {
    fn from(e: crate::founding::FoundingError) -> Self {
        use crate::founding::FoundingError as F;
        match e {
            F::Invalid(field) => field.into(),
            F::Unprocessable { field, message } => Self::Unprocessable {
                field: field.map(str::to_owned),
                message,
            },
            F::Upstream(message) => Self::BadGateway(message),
            F::Busy { retry_after_secs } => Self::Unavailable { retry_after_secs },
            e @ F::NameTaken(_) => Self::Conflict(e.to_string()),
            F::Quota(e) => Self::QuotaExceeded(e.to_string()),
            F::Db(db) => db.into(),
            F::Internal(source) => Self::Internal(source),
        }
    }
}

impl From<crate::issuance::IssuanceError> for ApiError {
    fn from(e: crate::issuance::IssuanceError) -> Self {
        use crate::issuance::{IssuanceError as I, Refused};
        match e {
            I::Refused(Refused::Unauthorized) => Self::Unauthorized,
            I::Refused(Refused::Forbidden(message)) => Self::Forbidden(message),
            I::Refused(Refused::Hidden) => Self::NotFound,
            I::Refused(Refused::NotYet { retry_after_secs }) => {
                Self::Unavailable { retry_after_secs }
            }
            I::Invalid(field) => field.into(),
            I::InvalidHeader { header, message } => Self::invalid(header, message),
            I::Sealed => Self::Gone(I::Sealed.to_string()),
            I::Busy { retry_after_secs } => Self::Unavailable { retry_after_secs },
            I::Db(db) => db.into(),
            e @ I::Corrupt { .. } => Self::internal(e),
            I::Internal(source) => Self::Internal(source),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if let Self::Internal(source) = &self {
            tracing::error!(error = %crate::error_chain(source.as_ref()), "internal error");
        }
        let field = match &self {
            Self::Invalid { field, .. } | Self::Unprocessable { field, .. } => field.clone(),
            _ => None,
        };
        let body = ErrorBody {
            error: ErrorDetail {
                code: self.code().to_owned(),
                message: self.to_string(),
                field,
            },
        };
        let mut response = (self.status_code(), axum::Json(body)).into_response();
        if let Self::RateLimited { retry_after_secs }
        | Self::Unavailable { retry_after_secs }
        | Self::TooManyStreams {
            retry_after_secs, ..
        }
        | Self::Wait {
            retry_after_secs, ..
        } = self
        {
            if let Ok(value) = HeaderValue::from_str(&retry_after_secs.to_string()) {
                response.headers_mut().insert(header::RETRY_AFTER, value);
            }
        }
        response
    }
}
