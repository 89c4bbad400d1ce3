//! `exk8s-agent balance`: the node-local apiserver load balancer every node runs
//! (`exk8s-apiserver-balancer.service`, which the bundle renders and its plan starts). A
//! node's kubelet and kube-proxy reach the control plane at `https://127.0.0.1:7445` — every
//! apiserver certificate exk8s signs names 127.0.0.1 — and the balancer passes each
//! connection, bytes untouched (TLS stays between the client and the apiserver), to an
//! apiserver that answers `/readyz`.
//!
//! It listens on the socket systemd holds for it (`exk8s-apiserver-balancer.socket`): while
//! the service restarts, new connections wait in that socket's queue instead of being refused.
//! The apiservers are the addresses the control plane's DNS name resolves to, resolved again
//! every round, so a member that joins, leaves or is replaced is followed as the cloud's DNS
//! follows it, with no restart of anything. Until the name first resolves (a record not yet
//! published, a DNS the operator has not pointed yet), the members the node's bundle lists
//! (`--seeds-file`, written with every bundle) stand in for it; once it resolves, a failure
//! keeps its last answer instead. Every round asks each apiserver's `/readyz`
//! ([`readyz`]), trusting the cluster CA file as it is then (two CAs during a rotation). A
//! member that starts to stop fails `/readyz` at once and keeps serving for its
//! `--shutdown-delay-duration`, so the balancer stops sending it connections before its
//! listener closes. A connection goes to the ready apiserver carrying the fewest ([`pool`]);
//! when a connect fails the next one is tried. On SIGTERM it stops accepting, gives its
//! connections a moment to end, and exits.

mod pool;
mod proxy;
mod readyz;
mod seeds;

use std::net::{SocketAddr, TcpListener, ToSocketAddrs as _};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

pub use pool::{BackendView, Pool, Readiness};

use crate::log::{log_info, log_warn};

/// Where a node's components reach the control plane.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:7445";
/// How long each step of a `/readyz` check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long open connections get to end after SIGTERM.
const DRAIN: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum BalancerError {
    #[error("listening on {addr}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the socket systemd passed (LISTEN_FDS)")]
    Activation(#[source] std::io::Error),
    #[error("handling SIGTERM")]
    Signal(#[source] std::io::Error),
    #[error("accepting connections")]
    Accept(#[source] std::io::Error),
}

/// The apiservers' name (or address) and port: `HOST:PORT`, `[IPv6]:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    host: String,
    port: u16,
}

impl FromStr for Endpoint {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| format!("{text:?} is not HOST:PORT"))?;
        let port = port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{text:?}: the port must be 1-65535"))?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if host.is_empty() || host.contains(char::is_whitespace) {
            return Err(format!("{text:?}: the host is empty or has a space"));
        }
        Ok(Self {
            host: host.to_owned(),
            port,
        })
    }
}

impl Endpoint {
    /// Every address the name resolves to now (the system's resolver: `/etc/hosts`, then
    /// DNS), each once, in order.
    pub fn resolve(&self) -> std::io::Result<Vec<SocketAddr>> {
        let mut addrs: Vec<SocketAddr> =
            (self.host.as_str(), self.port).to_socket_addrs()?.collect();
        addrs.sort();
        addrs.dedup();
        Ok(addrs)
    }
}

/// What `exk8s-agent balance` was asked.
#[derive(Debug, Clone)]
pub struct Options {
    pub apiserver: Endpoint,
    pub ca_file: PathBuf,
    /// The members the node's bundle lists, one `IP:PORT` per line: the apiservers until the
    /// name first resolves.
    pub seeds_file: Option<PathBuf>,
    /// Where to listen when systemd passes no socket.
    pub listen: SocketAddr,
    /// Between two rounds of checks.
    pub interval: Duration,
}

/// A balancer's knowledge: its pool, and how it learns and checks the apiservers.
pub struct Balancer<R> {
    pool: Arc<Pool>,
    resolve: R,
    ca_file: PathBuf,
    /// The last answer of a resolution that worked: kept while resolving fails.
    resolved: Mutex<Vec<SocketAddr>>,
    resolving_fails: AtomicBool,
    seeds_file: Option<PathBuf>,
}

impl<R> Balancer<R>
where
    R: Fn() -> std::io::Result<Vec<SocketAddr>> + Sync,
{
    /// A balancer whose apiservers are what `resolve` answers, checked against the CA
    /// certificates in `ca_file`.
    pub fn new(resolve: R, ca_file: PathBuf) -> Self {
        Self {
            pool: Arc::new(Pool::default()),
            resolve,
            ca_file,
            resolved: Mutex::new(Vec::new()),
            resolving_fails: AtomicBool::new(false),
            seeds_file: None,
        }
    }

    /// The apiservers until the name first resolves: those `file` lists (read again every
    /// round while they are needed, so a newer bundle's list is followed).
    #[must_use]
    pub fn with_seeds(mut self, file: PathBuf) -> Self {
        self.seeds_file = Some(file);
        self
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The apiservers now: resolved again, or the last answer while resolving fails.
    fn apiservers(&self) -> Vec<SocketAddr> {
        let mut last = self.resolved.lock().unwrap_or_else(PoisonError::into_inner);
        let why = match (self.resolve)() {
            Ok(addrs) if !addrs.is_empty() => {
                if self.resolving_fails.swap(false, Ordering::Relaxed) {
                    log_info!("the apiservers' name resolves again");
                }
                last.clone_from(&addrs);
                return addrs;
            }
            Ok(_) => "no address".to_owned(),
            Err(e) => e.to_string(),
        };
        let first_failure = !self.resolving_fails.swap(true, Ordering::Relaxed);
        if !last.is_empty() {
            if first_failure {
                log_warn!(
                    "resolving the apiservers' name: {why}; keeping the {} known",
                    last.len()
                );
            }
            return last.clone();
        }
        let seeds = self.seeds_file.as_deref().map(seeds::read);
        if first_failure {
            match &seeds {
                Some(Ok(seeds)) => log_warn!(
                    "resolving the apiservers' name: {why}; until it resolves, the {} members the bundle lists",
                    seeds.len()
                ),
                Some(Err(e)) => {
                    log_warn!("resolving the apiservers' name: {why}; and no bundle's list: {e}");
                }
                None => log_warn!("resolving the apiservers' name: {why}; no apiserver known"),
            }
        }
        seeds.and_then(Result::ok).unwrap_or_default()
    }

    /// One round: the apiservers resolved, each one's `/readyz` asked (all at once), the pool
    /// told; what changed is logged.
    pub fn round(&self) {
        let apiservers = self.apiservers();
        let tls = std::fs::read(&self.ca_file)
            .map_err(|e| format!("{}: {e}", self.ca_file.display()))
            .and_then(|pem| readyz::tls(&pem));
        let checked: Vec<(SocketAddr, Readiness)> = match tls {
            Ok(tls) => std::thread::scope(|s| {
                let asked: Vec<_> = apiservers
                    .iter()
                    .map(|addr| {
                        let tls = &tls;
                        s.spawn(move || {
                            let readiness = readyz::check(*addr, tls, CHECK_TIMEOUT);
                            // A member that starts to stop takes no new connection from here,
                            // not once the round's slowest check ends (an unreachable member
                            // holds a round for the whole timeout, which with the interval
                            // outlasted the apiservers' 3 s shutdown delay).
                            if let Readiness::NotReady(why) = &readiness
                                && let Some(change) = self.pool.failed(*addr, why.clone())
                            {
                                log_info!("{change}");
                            }
                            (*addr, readiness)
                        })
                    })
                    .collect();
                asked
                    .into_iter()
                    .zip(&apiservers)
                    .map(|(asked, addr)| {
                        asked.join().unwrap_or_else(|_| {
                            (*addr, Readiness::NotReady("its check panicked".to_owned()))
                        })
                    })
                    .collect()
            }),
            Err(why) => apiservers
                .iter()
                .map(|addr| (*addr, Readiness::NotReady(why.clone())))
                .collect(),
        };
        for change in self.pool.update(checked) {
            log_info!("{change}");
        }
    }

    /// Serves `listener` until `stop` is set, a round every `interval` meanwhile; then lets
    /// open connections end for a moment.
    pub fn serve(
        &self,
        listener: &TcpListener,
        interval: Duration,
        stop: &AtomicBool,
    ) -> Result<(), BalancerError> {
        let mut started = Instant::now();
        self.round();
        let served = std::thread::scope(|s| {
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // A round every `interval` from the last one's start: a slow round (a
                    // member that does not answer, checked up to CHECK_TIMEOUT) is not followed
                    // by a whole interval more.
                    let next = started + interval;
                    while !stop.load(Ordering::Relaxed) && Instant::now() < next {
                        std::thread::sleep(Duration::from_millis(50).min(interval));
                    }
                    if !stop.load(Ordering::Relaxed) {
                        started = Instant::now();
                        self.round();
                    }
                }
            });
            let served = proxy::serve(listener, &self.pool, stop);
            // An accept failure ends the rounds too.
            stop.store(true, Ordering::Relaxed);
            served
        });
        proxy::drain(&self.pool, DRAIN);
        served
    }
}

/// The listener: systemd's socket when it passed one, else a socket bound to `fallback`.
fn listener(fallback: SocketAddr) -> Result<TcpListener, BalancerError> {
    let mut passed = listenfd::ListenFd::from_env();
    if let Some(listener) = passed
        .take_tcp_listener(0)
        .map_err(BalancerError::Activation)?
    {
        let at = listener
            .local_addr()
            .map_or_else(|e| e.to_string(), |a| a.to_string());
        log_info!("listening on {at} (systemd's socket)");
        return Ok(listener);
    }
    let listener = TcpListener::bind(fallback).map_err(|source| BalancerError::Listen {
        addr: fallback,
        source,
    })?;
    log_info!("listening on {fallback}");
    Ok(listener)
}

/// `exk8s-agent balance`: runs until SIGTERM or SIGINT.
pub fn run(options: &Options) -> Result<(), BalancerError> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, Arc::clone(&stop)).map_err(BalancerError::Signal)?;
    }
    let listener = listener(options.listen)?;
    let endpoint = options.apiserver.clone();
    log_info!(
        "balancing {}:{} (checked against {})",
        endpoint.host,
        endpoint.port,
        options.ca_file.display()
    );
    let mut balancer = Balancer::new(move || endpoint.resolve(), options.ca_file.clone());
    if let Some(file) = &options.seeds_file {
        balancer = balancer.with_seeds(file.clone());
    }
    balancer.serve(&listener, options.interval, &stop)
}

#[cfg(test)]
mod tests;
