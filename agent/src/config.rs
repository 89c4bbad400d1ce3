//! Agent configuration: `/etc/exk8s/agent.toml` (baked into the image and written by the VM's
//! userdata), overridden by `EXK8S_*` environment variables, overridden by flags.
//!
//! ```toml
//! api_url = "https://k8sapi.example.com"     # required for `run`
//! imds_url = "http://169.254.169.254"        # required for `run`
//! trusted_keys_dir = "/etc/exk8s/trusted-keys.d"
//! api_ca_file = "/etc/exk8s/api-ca.pem"      # optional: pin the API's TLS root
//! insecure_http = false                      # allow http:// API URLs (dev stack only)
//! imds_timeout_secs = 600
//! fetch_timeout_secs = 900
//! request_timeout_secs = 30
//! clock_skew_secs = 300
//! ```

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::AgentError;

pub const DEFAULT_CONFIG_PATH: &str = "/etc/exk8s/agent.toml";
pub const DEFAULT_KEYS_DIR: &str = "/etc/exk8s/trusted-keys.d";

/// The file's fields; every one optional so flags and environment can supply them.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub api_url: Option<String>,
    pub imds_url: Option<String>,
    pub trusted_keys_dir: Option<PathBuf>,
    pub api_ca_file: Option<PathBuf>,
    pub insecure_http: Option<bool>,
    pub imds_timeout_secs: Option<u64>,
    pub fetch_timeout_secs: Option<u64>,
    pub request_timeout_secs: Option<u64>,
    pub clock_skew_secs: Option<i64>,
}

impl ConfigFile {
    /// Reads `path`. A missing file is an empty configuration only when `optional`.
    pub fn load(path: &Path, optional: bool) -> Result<Self, AgentError> {
        match std::fs::read_to_string(path) {
            Ok(text) => toml::from_str(&text)
                .map_err(|e| AgentError::Config(format!("{}: {}", path.display(), e.message()))),
            Err(e) if optional && e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(AgentError::ReadInput {
                path: path.to_owned(),
                source,
            }),
        }
    }
}

/// Network settings for `run`, after merging.
#[derive(Debug, Clone)]
pub struct NetConfig {
    pub api_url: String,
    pub imds_url: String,
    pub api_ca_file: Option<PathBuf>,
    pub insecure_http: bool,
    pub imds_timeout_secs: u64,
    pub fetch_timeout_secs: u64,
    pub request_timeout_secs: u64,
}

impl NetConfig {
    /// Checks the URLs: HTTPS for the API unless `insecure_http` (SECURITY.md 19).
    pub fn validate(&self) -> Result<(), AgentError> {
        for (name, url) in [("api_url", &self.api_url), ("imds_url", &self.imds_url)] {
            if !(url.starts_with("https://") || url.starts_with("http://")) {
                return Err(AgentError::Config(format!(
                    "{name} `{url}` is not an http(s) URL"
                )));
            }
        }
        if self.api_url.starts_with("http://") && !self.insecure_http {
            return Err(AgentError::Config(format!(
                "api_url `{}` is plain HTTP; set insecure_http = true only for the dev stack",
                self.api_url
            )));
        }
        Ok(())
    }
}
