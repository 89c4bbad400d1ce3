//! Everything the CLI can fail with, worded for the operator: an API refusal shows its field
//! and message, never a raw body or a stack.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub(crate) enum CliError {
    #[error("not logged in: run `exk8s login --api URL` (or set EXK8S_API and EXK8S_TOKEN); no config at {}", .0.display())]
    NotLoggedIn(PathBuf),
    #[error("{0}")]
    Config(String),
    #[error("cannot reach the API at {url}: {reason}")]
    Unreachable { url: String, reason: String },
    /// The API answered with an error body.
    #[error("{}", api_message(*.status, .field.as_deref(), .message))]
    Api {
        status: u16,
        field: Option<String>,
        message: String,
    },
    #[error("the API answered something unexpected ({0})")]
    Unexpected(String),
    #[error("{0}")]
    Usage(String),
    #[error("{0}")]
    Failed(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn api_message(status: u16, field: Option<&str>, message: &str) -> String {
    let what = match status {
        401 => "the API refused the token (401): run `exk8s login` again".to_owned(),
        403 => "the token may not do this (403)".to_owned(),
        404 => "not found (404)".to_owned(),
        409 => "conflict (409)".to_owned(),
        422 => "refused (422)".to_owned(),
        429 | 503 => format!("the API is busy ({status}); try again shortly"),
        s if s >= 500 => format!("the API failed ({s})"),
        s => format!("refused ({s})"),
    };
    match field {
        Some(field) => format!("{what}: {field}: {message}"),
        None => format!("{what}: {message}"),
    }
}

impl CliError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Self::Io {
            what: what.into(),
            source,
        }
    }
}
