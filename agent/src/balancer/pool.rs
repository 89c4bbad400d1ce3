//! The apiservers a balancer knows: each with what its last `/readyz` said and how many
//! connections it carries, and the order in which a new connection tries them.
//!
//! An apiserver is *listed* while the control plane's name resolves to it. One that is no
//! longer listed takes no new connection; its open ones run on, and it is forgotten when the
//! last one closes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// What an apiserver's last check said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// Not checked yet.
    Unknown,
    /// `/readyz` answered 200.
    Ready,
    /// Why it is not ready: its `/readyz` answer, or what failed on the way to it.
    NotReady(String),
}

#[derive(Debug)]
struct Backend {
    listed: bool,
    readiness: Readiness,
    connections: usize,
}

#[derive(Debug, Default)]
struct Inner {
    backends: BTreeMap<SocketAddr, Backend>,
    /// Rotates the start among equally loaded apiservers.
    turn: usize,
}

/// The shared state of one balancer.
#[derive(Debug, Default)]
pub struct Pool {
    inner: Mutex<Inner>,
}

/// One apiserver as [`Pool::backends`] shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendView {
    pub addr: SocketAddr,
    pub listed: bool,
    pub readiness: Readiness,
    pub connections: usize,
}

impl Pool {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // The state stays consistent whatever a panicking holder did: counts and flags only.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one round's results: `checked` is every apiserver the name resolves to now, with
    /// what its `/readyz` said. Returns what changed, one line each, for the log.
    pub fn update(&self, checked: Vec<(SocketAddr, Readiness)>) -> Vec<String> {
        let mut inner = self.lock();
        let mut changes = Vec::new();
        for backend in inner.backends.values_mut() {
            backend.listed = false;
        }
        for (addr, readiness) in checked {
            let backend = inner.backends.entry(addr).or_insert_with(|| {
                changes.push(format!("apiserver {addr} listed"));
                Backend {
                    listed: true,
                    readiness: Readiness::Unknown,
                    connections: 0,
                }
            });
            backend.listed = true;
            if backend.readiness != readiness {
                changes.push(match &readiness {
                    Readiness::Ready => format!("apiserver {addr} ready"),
                    Readiness::NotReady(why) => format!("apiserver {addr} not ready: {why}"),
                    Readiness::Unknown => format!("apiserver {addr} unknown"),
                });
                backend.readiness = readiness;
            }
        }
        inner.backends.retain(|addr, backend| {
            if !backend.listed && backend.readiness != Readiness::Unknown {
                changes.push(format!(
                    "apiserver {addr} no longer listed ({} connections left)",
                    backend.connections
                ));
                // Said once: an unlisted one kept for its connections reads as unknown.
                backend.readiness = Readiness::Unknown;
            }
            backend.listed || backend.connections > 0
        });
        changes
    }

    /// Marks `addr` not ready until the next round says otherwise (a connect to it failed, or
    /// its check did before the round ended); the change, when it is one, to log.
    pub fn failed(&self, addr: SocketAddr, why: String) -> Option<String> {
        let mut inner = self.lock();
        let backend = inner.backends.get_mut(&addr)?;
        if matches!(&backend.readiness, Readiness::NotReady(was) if *was == why) {
            return None;
        }
        let change = format!("apiserver {addr} not ready: {why}");
        backend.readiness = Readiness::NotReady(why);
        Some(change)
    }

    /// The apiservers a new connection tries, in order: the ready ones, fewest connections
    /// first (equal ones in turn). Only when none is ready, every listed one — at the first
    /// member's first boot nothing is ready yet, and a try costs nothing.
    pub fn candidates(&self) -> Vec<SocketAddr> {
        let mut inner = self.lock();
        inner.turn = inner.turn.wrapping_add(1);
        let listed: Vec<(&SocketAddr, &Backend)> =
            inner.backends.iter().filter(|(_, b)| b.listed).collect();
        let ready: Vec<(&SocketAddr, &Backend)> = listed
            .iter()
            .copied()
            .filter(|(_, b)| b.readiness == Readiness::Ready)
            .collect();
        let mut chosen = if ready.is_empty() { listed } else { ready };
        if !chosen.is_empty() {
            let by = inner.turn % chosen.len();
            chosen.rotate_left(by);
        }
        // Stable: among equal counts the rotated order stands.
        chosen.sort_by_key(|(_, b)| b.connections);
        chosen.into_iter().map(|(addr, _)| *addr).collect()
    }

    /// Counts a connection to `addr` until the returned guard drops.
    pub fn open(self: &Arc<Self>, addr: SocketAddr) -> Open {
        if let Some(backend) = self.lock().backends.get_mut(&addr) {
            backend.connections += 1;
        }
        Open {
            pool: Arc::clone(self),
            addr,
        }
    }

    /// Every apiserver known, in address order.
    pub fn backends(&self) -> Vec<BackendView> {
        self.lock()
            .backends
            .iter()
            .map(|(addr, b)| BackendView {
                addr: *addr,
                listed: b.listed,
                readiness: b.readiness.clone(),
                connections: b.connections,
            })
            .collect()
    }

    /// Connections open through the balancer.
    pub fn connections(&self) -> usize {
        self.lock().backends.values().map(|b| b.connections).sum()
    }
}

/// One open connection to an apiserver, counted while it lives.
#[derive(Debug)]
pub struct Open {
    pool: Arc<Pool>,
    addr: SocketAddr,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut inner = self.pool.lock();
        if let Some(backend) = inner.backends.get_mut(&self.addr) {
            backend.connections = backend.connections.saturating_sub(1);
            if !backend.listed && backend.connections == 0 {
                inner.backends.remove(&self.addr);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "a test")]

    use super::*;

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 6443))
    }

    fn not_ready() -> Readiness {
        Readiness::NotReady("HTTP 500".to_owned())
    }

    #[test]
    fn only_ready_apiservers_take_connections_fewest_first() {
        let pool = Arc::new(Pool::default());
        let changes = pool.update(vec![
            (addr(1), Readiness::Ready),
            (addr(2), not_ready()),
            (addr(3), Readiness::Ready),
        ]);
        assert_eq!(
            changes,
            [
                "apiserver 10.0.0.1:6443 listed",
                "apiserver 10.0.0.1:6443 ready",
                "apiserver 10.0.0.2:6443 listed",
                "apiserver 10.0.0.2:6443 not ready: HTTP 500",
                "apiserver 10.0.0.3:6443 listed",
                "apiserver 10.0.0.3:6443 ready",
            ]
        );
        let first = pool.candidates();
        assert_eq!(first.len(), 2, "{first:?}");
        assert!(!first.contains(&addr(2)));
        let _open = pool.open(first[0]);
        // The other ready one now carries fewer connections: it comes first, every time.
        for _ in 0..3 {
            assert_eq!(pool.candidates(), [first[1], first[0]]);
        }
        // Equal loads take turns.
        let mut firsts = std::collections::BTreeSet::new();
        let _other = pool.open(first[1]);
        for _ in 0..4 {
            firsts.insert(pool.candidates()[0]);
        }
        assert_eq!(firsts.len(), 2, "{firsts:?}");
    }

    #[test]
    fn with_none_ready_every_listed_apiserver_is_tried() {
        let pool = Pool::default();
        assert!(pool.candidates().is_empty());
        pool.update(vec![(addr(1), Readiness::Unknown), (addr(2), not_ready())]);
        let mut tried = pool.candidates();
        tried.sort();
        assert_eq!(tried, [addr(1), addr(2)]);
    }

    #[test]
    fn a_failed_connect_counts_until_the_next_round() {
        let pool = Pool::default();
        pool.update(vec![
            (addr(1), Readiness::Ready),
            (addr(2), Readiness::Ready),
        ]);
        pool.failed(addr(1), "connect: refused".to_owned());
        assert_eq!(pool.candidates(), [addr(2)]);
        let changes = pool.update(vec![
            (addr(1), Readiness::Ready),
            (addr(2), Readiness::Ready),
        ]);
        assert_eq!(changes, ["apiserver 10.0.0.1:6443 ready"]);
        assert_eq!(pool.candidates().len(), 2);
    }

    #[test]
    fn an_unlisted_apiserver_takes_no_new_connection_and_is_forgotten_when_idle() {
        let pool = Arc::new(Pool::default());
        pool.update(vec![
            (addr(1), Readiness::Ready),
            (addr(2), Readiness::Ready),
        ]);
        let open = pool.open(addr(2));
        let changes = pool.update(vec![(addr(1), Readiness::Ready)]);
        assert_eq!(
            changes,
            ["apiserver 10.0.0.2:6443 no longer listed (1 connections left)"]
        );
        assert_eq!(pool.candidates(), [addr(1)]);
        assert_eq!(pool.connections(), 1);
        // Said once, not every round.
        assert!(pool.update(vec![(addr(1), Readiness::Ready)]).is_empty());
        drop(open);
        assert_eq!(pool.connections(), 0);
        let known: Vec<SocketAddr> = pool.backends().iter().map(|b| b.addr).collect();
        assert_eq!(known, [addr(1)]);
        // Listed again, it starts afresh.
        let changes = pool.update(vec![
            (addr(1), Readiness::Ready),
            (addr(2), Readiness::Ready),
        ]);
        assert_eq!(
            changes,
            [
                "apiserver 10.0.0.2:6443 listed",
                "apiserver 10.0.0.2:6443 ready"
            ]
        );
    }
}
