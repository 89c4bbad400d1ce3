//! Connections passed through, bytes untouched: each accepted connection goes to the first
//! apiserver of [`Pool::candidates`] that takes it (a refused or timed-out connect marks that
//! one not ready and tries the next), then its bytes are copied both ways until either side
//! ends — which ends both: neither an HTTP client nor an apiserver half-closes.

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

use super::BalancerError;
use super::pool::Pool;
use crate::log::{log_info, log_warn};

/// How long a connect to an apiserver may take before the next one is tried.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the accept loop looks at the stop flag.
const STOP_POLL: Timespec = Timespec {
    tv_sec: 0,
    tv_nsec: 200_000_000,
};

/// Accepts connections on `listener` until `stop` is set, each passed on by a thread of its own.
pub(super) fn serve(
    listener: &TcpListener,
    pool: &Arc<Pool>,
    stop: &AtomicBool,
) -> Result<(), BalancerError> {
    listener
        .set_nonblocking(true)
        .map_err(BalancerError::Accept)?;
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [PollFd::new(listener, PollFlags::IN)];
        match rustix::event::poll(&mut fds, Some(&STOP_POLL)) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(BalancerError::Accept(e.into())),
        }
        loop {
            match listener.accept() {
                Ok((client, _)) => {
                    let pool = Arc::clone(pool);
                    let spawned = std::thread::Builder::new()
                        .name("connection".to_owned())
                        .spawn(move || pass(client, &pool));
                    if let Err(e) = spawned {
                        log_warn!("a connection dropped: no thread for it: {e}");
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Out of descriptors, say: the connection waits in the queue for the next try.
                Err(e) => {
                    log_warn!("accepting a connection: {e}");
                    break;
                }
            }
        }
    }
    Ok(())
}

/// Waits until no connection is open, or `grace` has passed.
pub(super) fn drain(pool: &Pool, grace: Duration) {
    let deadline = Instant::now() + grace;
    while pool.connections() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    match pool.connections() {
        0 => log_info!("stopped: no connection open"),
        left => log_info!("stopped: {left} connections cut (their clients reconnect)"),
    }
}

/// Passes `client` to the first candidate apiserver that takes it.
fn pass(client: TcpStream, pool: &Arc<Pool>) {
    if let Err(e) = client.set_nonblocking(false) {
        log_warn!("a connection dropped: {e}");
        return;
    }
    for addr in pool.candidates() {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(upstream) => {
                let _open = pool.open(addr);
                splice(&client, &upstream);
                return;
            }
            Err(e) => {
                log_warn!("apiserver {addr}: connect: {e}; trying the next");
                pool.failed(addr, format!("connect: {e}"));
            }
        }
    }
    log_warn!("no apiserver took a connection: closing it");
}

/// Copies both ways until either side ends, then closes both.
fn splice(client: &TcpStream, upstream: &TcpStream) {
    for stream in [client, upstream] {
        // Latency over batching: requests and watch events are small.
        let _ = stream.set_nodelay(true);
    }
    std::thread::scope(|s| {
        s.spawn(|| copy_then_close(upstream, client));
        copy_then_close(client, upstream);
    });
}

fn copy_then_close(mut from: &TcpStream, mut to: &TcpStream) {
    let _ = io::copy(&mut from, &mut to);
    for stream in [from, to] {
        let _ = stream.shutdown(Shutdown::Both);
    }
}
