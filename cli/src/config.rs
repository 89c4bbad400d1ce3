//! Where `exk8s login` keeps the API's URL and the operator token: `$EXK8S_CONFIG`, else
//! `$XDG_CONFIG_HOME/exk8s/config.toml`, else `~/.config/exk8s/config.toml`. The file is
//! written whole (a temporary file renamed over it) with mode 0600 in a 0700 directory, since
//! it holds a token. `EXK8S_API` and `EXK8S_TOKEN` (or `--api`, `--token`) override it.

use std::fmt;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::error::CliError;

/// An operator token: wiped from memory when dropped, never printed.
#[derive(Clone)]
pub(crate) struct Token(Zeroizing<String>);

impl Serialize for Token {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.expose())
    }
}

impl<'de> Deserialize<'de> for Token {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::new)
    }
}

impl Token {
    pub(crate) fn new(text: String) -> Self {
        Self(Zeroizing::new(text))
    }

    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// What `login` saved.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Config {
    /// The API's base URL, e.g. `https://exk8s.example.com`.
    pub(crate) api: String,
    pub(crate) token: Token,
}

/// The config file's path.
pub(crate) fn path() -> Result<PathBuf, CliError> {
    let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(file) = var("EXK8S_CONFIG") {
        return Ok(PathBuf::from(file));
    }
    let base = match var("XDG_CONFIG_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(var("HOME").ok_or_else(|| {
            CliError::Config("neither EXK8S_CONFIG, XDG_CONFIG_HOME nor HOME is set".into())
        })?)
        .join(".config"),
    };
    Ok(base.join("exk8s").join("config.toml"))
}

/// The saved config, if `login` ran.
pub(crate) fn load(file: &Path) -> Result<Option<Config>, CliError> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => Zeroizing::new(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(CliError::Config(format!(
                "cannot read {}: {e}",
                file.display()
            )));
        }
    };
    toml::from_str(&text).map(Some).map_err(|e| {
        CliError::Config(format!(
            "{} is not a valid config: {}",
            file.display(),
            e.message()
        ))
    })
}

/// Writes `config` to `file`: mode 0600, directory 0700, replaced whole or not at all.
pub(crate) fn save(file: &Path, config: &Config) -> Result<(), CliError> {
    let text = Zeroizing::new(
        toml::to_string(config).map_err(|e| CliError::Config(format!("cannot encode: {e}")))?,
    );
    crate::private_file::write(file, text.as_bytes())
        .map_err(|e| CliError::Config(format!("cannot write {}: {e}", file.display())))
}

/// Where and as whom to call the API: flags and environment first, then the saved config.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub(crate) api: String,
    pub(crate) token: Token,
}

pub(crate) fn session(api: Option<String>, token: Option<String>) -> Result<Session, CliError> {
    let file = path()?;
    let saved = load(&file)?;
    let api = api
        .or_else(|| saved.as_ref().map(|c| c.api.clone()))
        .ok_or_else(|| CliError::NotLoggedIn(file.clone()))?;
    let token = token
        .map(Token::new)
        .or_else(|| saved.map(|c| c.token))
        .ok_or(CliError::NotLoggedIn(file))?;
    Ok(Session {
        api: api.trim_end_matches('/').to_owned(),
        token,
    })
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[test]
    fn the_saved_file_is_private_and_reads_back() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let file = dir.path().join("exk8s").join("config.toml");
        let config = Config {
            api: "https://exk8s.example".into(),
            token: Token::new("exk8s_secret".into()),
        };
        save(&file, &config).unwrap_or_else(|e| panic!("{e}"));
        let mode = |p: &Path| std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777);
        assert_eq!(mode(&file).ok(), Some(0o600));
        assert_eq!(mode(file.parent().unwrap_or(dir.path())).ok(), Some(0o700));
        let back = load(&file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            back.map(|c| c.token.expose().to_owned()).as_deref(),
            Some("exk8s_secret")
        );
        assert!(!format!("{config:?}").contains("secret"));
    }
}
