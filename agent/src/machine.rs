//! What the subcommands and `sync` share on this machine: the clock, the trusted keys, the API
//! and instance-metadata clients, and applying a verified bundle with the host it needs.

use std::path::Path;
use std::time::Duration;

use exk8s_common::{Keyring, VerifiedBundle};

use crate::apply::host::{RecordingHost, SystemHost};
use crate::apply::{self, Options};
use crate::config::NetConfig;
use crate::error::AgentError;
use crate::http;
use crate::report::Reporter;

pub fn load_keyring(dir: &Path) -> Result<Keyring, AgentError> {
    Keyring::load_dir(dir).map_err(|e| AgentError::Config(crate::error::chain(&e)))
}

/// The API client (TLS pinned to `api_ca_file` when set) and the instance-metadata client.
pub fn clients(net: &NetConfig) -> Result<(ureq::Agent, ureq::Agent), AgentError> {
    let pinned = match &net.api_ca_file {
        Some(path) => Some(std::fs::read(path).map_err(|source| AgentError::ReadInput {
            path: path.clone(),
            source,
        })?),
        None => None,
    };
    let request_timeout = Duration::from_secs(net.request_timeout_secs);
    Ok((
        http::agent(http::api_tls(pinned.as_deref())?, request_timeout),
        http::agent(http::api_tls(None)?, request_timeout),
    ))
}

/// Applies a verified bundle on this machine, or under `--root` with host actions recorded.
pub fn apply_verified(
    bundle: &VerifiedBundle,
    root: Option<&Path>,
    options: Options,
    request_timeout: Duration,
    reporter: &Reporter<'_>,
) -> Result<(), AgentError> {
    let options = Options {
        strict_owner: root.is_none(),
        ..options
    };
    if root.is_some() {
        let mut host = RecordingHost::new(&options.root, true);
        apply::apply(bundle.payload(), &options, &mut host, reporter)?;
    } else {
        let mut host = SystemHost::new(options.root.clone(), request_timeout);
        apply::apply(bundle.payload(), &options, &mut host, reporter)?;
    }
    Ok(())
}
