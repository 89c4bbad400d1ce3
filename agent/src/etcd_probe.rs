//! How this node reaches its own etcd member: the endpoint, the client identity it presents
//! and how long to wait. The waits, the snapshots and the restore all reach it this way; it
//! sits below them all.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct EtcdProbe {
    pub endpoint: String,
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub timeout: Duration,
}
