//! A control-plane node's etcd membership steps, as the machine's host performs them (under
//! `--root` they are only recorded): [`join`] before its etcd starts, [`promote`] once it runs,
//! [`remove`] for a leaving member — through the voters the bundle names, with the client
//! identity in the bundle's files ([`crate::etcd_members`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::etcd_members::{self, Etcd};

/// How often a promotion is retried while the learner catches up.
const PROMOTE_EVERY: Duration = Duration::from_secs(2);

/// The voters to go through, this node's peer URL and the client identity's files.
#[derive(Debug, Clone)]
pub struct Membership {
    pub voters: Vec<String>,
    pub peer_url: String,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// How long a promotion may wait for the learner to catch up.
    pub timeout: Duration,
}

fn clients(root: &Path, m: &Membership) -> Result<Vec<Etcd>, String> {
    clients_of(root, m, &m.voters)
}

fn clients_of(root: &Path, m: &Membership, endpoints: &[String]) -> Result<Vec<Etcd>, String> {
    let read = |path: &Path| {
        let full = root.join(path.strip_prefix("/").unwrap_or(path));
        std::fs::read(&full).map_err(|e| format!("reading {}: {e}", full.display()))
    };
    let (ca, cert, key) = (read(&m.ca_file)?, read(&m.cert_file)?, read(&m.key_file)?);
    endpoints
        .iter()
        .map(|endpoint| Etcd::new(endpoint, &ca, &cert, &key))
        .collect()
}

pub(super) fn join(root: &Path, m: &Membership) -> Result<(), String> {
    etcd_members::join(&clients(root, m)?, &m.peer_url)
        .map(drop)
        .map_err(|e| e.to_string())
}

/// Removes a leaving member (`leaving`: its client URL; `m.peer_url`: its peer URL).
pub(super) fn remove(root: &Path, m: &Membership, leaving: &str) -> Result<(), String> {
    let clients = clients(root, m)?;
    let leaving = clients_of(root, m, &[leaving.to_owned()])?
        .pop()
        .ok_or_else(|| "no client for the leaving member".to_owned())?;
    etcd_members::remove_member(&clients, &leaving, &m.peer_url, PROMOTE_EVERY, m.timeout)
        .map_err(|e| e.to_string())
}

pub(super) fn promote(root: &Path, m: &Membership) -> Result<(), String> {
    etcd_members::promote_or_withdraw(&clients(root, m)?, &m.peer_url, PROMOTE_EVERY, m.timeout)
        .map_err(|e| e.to_string())
}
