//! Validated newtypes for every value in a bundle that reaches a filesystem, a command line or
//! a certificate. Parsing is the only way to make one, so holding one means it was checked.
//!
//! Each type rejects with a typed reason ([`NameError`], [`PathError`], [`ModeError`]) that says
//! what is wrong without echoing unbounded attacker input.

mod digest;
mod ident;
mod mode;
mod path;

pub use digest::Sha256Digest;
pub use ident::{
    AccountName, ArchiveMember, ArtifactName, ChartRef, HttpUrl, K8sName, NameError, NodeName,
    Nonce, PackageName, UnitName, Version,
};
pub use mode::{FileMode, ModeError};
pub use path::{
    AllowList, AllowedPath, ArtifactDest, ArtifactRoots, BundlePath, FileRoots, PathError,
};

/// A bounded, escaped rendering of untrusted text for error messages.
pub(crate) fn shown(s: &str) -> String {
    shown_at_most(s, 96)
}

/// [`shown`] with a bound of `max` characters, counted AFTER escaping (a control character
/// escapes to as many as ten), plus the `…` that marks a cut.
pub(crate) fn shown_at_most(s: &str, max: usize) -> String {
    let mut out = String::new();
    let mut used = 0;
    for c in s.chars() {
        let escaped = c.escape_debug();
        if used + escaped.len() > max {
            out.push('…');
            break;
        }
        used += escaped.len();
        out.extend(escaped);
    }
    out
}

/// Where and why untrusted JSON failed to parse, bounded: serde's messages quote the offending
/// key or value, which an attacker chooses and may make as long as the size limit allows.
pub(crate) fn json_failure(e: serde_path_to_error::Error<serde_json::Error>) -> (String, String) {
    let at = shown_at_most(&e.path().to_string(), 160);
    let reason = shown_at_most(&e.into_inner().to_string(), 320);
    (at, reason)
}

/// Generates the plumbing shared by string newtypes: accessors, `Display`, serde (through
/// `TryFrom<String>` so deserialising validates), `FromStr`.
macro_rules! string_newtype {
    ($(#[$meta:meta])* $name:ident, $err:ty, $validate:path) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates `value`.
            pub fn new(value: impl Into<String>) -> Result<Self, $err> {
                let value = value.into();
                $validate(&value)?;
                Ok(Self(value))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl TryFrom<String> for $name {
            type Error = $err;
            fn try_from(value: String) -> Result<Self, Self::Error> {
                Self::new(value)
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = $err;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl std::fmt::Debug for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                write!(f, "{}({:?})", stringify!($name), self.0)
            }
        }
    };
}
pub(crate) use string_newtype;
