//! [`FieldError`]: a request field that failed validation, named for the caller. Domain
//! modules return it; the HTTP layer answers it as 400 with the field in the body.

/// A bad request field and a message that names the problem.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: &str, message: impl Into<String>) -> Self {
        Self {
            field: field.to_owned(),
            message: message.into(),
        }
    }
}

/// An operator's request checked field by field into what the domain takes: defaults applied,
/// every bad field named.
pub trait Validate {
    type Valid;
    fn validate(self) -> Result<Self::Valid, FieldError>;
}
