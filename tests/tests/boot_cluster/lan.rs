//! HTTPS from a machine's LAN made by the test itself, not by a `curl` process per request: the
//! calling thread enters the machine's network namespace while it connects (a socket belongs to
//! the namespace it was made in) and goes back to its own before returning, so nothing else the
//! thread does — the processes it starts above all — happens in the machine's namespace. The
//! samplers of a changing control plane ask several times a second for half an hour: a CI run's
//! booted clusters started about 16,000 curls, some 10 ms of CPU time each.
//!
//! Every request is a connection of its own, as each curl's was (no pool: a pooled connection
//! to `127.0.0.1:7445` made in one machine's namespace would answer for another's).

use std::fs::File;
use std::os::fd::AsFd as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

/// How long a request may take, connection and body included: what the kubelet's heartbeat
/// client gives the control plane (its node status update frequency, 10 s). On a two-core host
/// booting three clusters at once, an apiserver that has just restarted can take longer than
/// 5 s over a TLS handshake (seen in CI during a CA rotation, through HAProxy and the balancer
/// alike); a client of the control plane still gets its answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// What a server answered: its status and body, whatever the status.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: u16,
    pub body: String,
}

/// How the request trusts the server.
pub(crate) enum Trust<'a> {
    /// Any certificate (curl's `-k`): the handshake's signatures are checked, the chain is not.
    Any,
    /// A private CA's, presenting a client identity (PEM files).
    Mutual {
        ca: &'a Path,
        cert: &'a Path,
        key: &'a Path,
    },
}

impl Trust<'_> {
    fn config(&self) -> Result<Arc<rustls::ClientConfig>, String> {
        match self {
            Trust::Any => exk8s_agent::http::loopback_tls().map_err(|e| e.to_string()),
            Trust::Mutual { ca, cert, key } => {
                let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
                exk8s_agent::http::mutual_tls(&read(ca)?, &read(cert)?, &read(key)?)
                    .map_err(|e| e.to_string())
            }
        }
    }
}

/// `GET url` (or `POST` of the JSON `body`) from the network namespace `netns` (a machine's LAN,
/// [`exk8s_tests::machine::Machine::netns`]): the answer, or why there was none (the connection, the handshake or the
/// timeout).
pub(crate) fn https(
    netns: &str,
    trust: &Trust<'_>,
    url: &str,
    body: Option<&str>,
) -> Result<Answer, String> {
    let tls = trust.config()?;
    in_netns(netns, || {
        let agent = ureq::AgentBuilder::new()
            .tls_config(tls)
            .timeout(REQUEST_TIMEOUT)
            .max_idle_connections(0)
            .redirects(0)
            .build();
        let answered = match body {
            Some(json) => agent
                .post(url)
                .set("Content-Type", "application/json")
                .send_string(json),
            None => agent.get(url).call(),
        };
        match answered {
            Ok(response) | Err(ureq::Error::Status(_, response)) => {
                let status = response.status();
                let body = response.into_string().map_err(|e| e.to_string())?;
                Ok(Answer { status, body })
            }
            Err(e) => Err(e.to_string()),
        }
    })?
}

/// Runs `f` with the calling thread in the network namespace `/run/netns/<netns>`, then puts the
/// thread back in its own (also when `f` panics).
fn in_netns<T>(netns: &str, f: impl FnOnce() -> T) -> Result<T, String> {
    struct Back(File);
    impl Drop for Back {
        fn drop(&mut self) {
            move_into_link_name_space(self.0.as_fd(), Some(LinkNameSpaceType::Network))
                .expect("back to the thread's own network namespace");
        }
    }
    let own = File::open("/proc/thread-self/ns/net")
        .map_err(|e| format!("the thread's own network namespace: {e}"))?;
    let path = Path::new("/run/netns").join(netns);
    let target = File::open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    move_into_link_name_space(target.as_fd(), Some(LinkNameSpaceType::Network))
        .map_err(|e| format!("entering {}: {e}", path.display()))?;
    let _back = Back(own);
    Ok(f())
}

#[cfg(test)]
mod tests {
    use std::process::{Command, Stdio};

    use exk8s_tests::netns::Netns;
    use exk8s_tests::procs::{Proc, wait_until};

    use super::*;

    fn own_netns() -> u64 {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata("/proc/thread-self/ns/net").unwrap())
    }

    /// A server only the namespace can reach answers; the thread is back in its own namespace
    /// after the request, where the same address has no server.
    #[test]
    fn a_request_is_made_in_the_namespace_and_the_thread_comes_back() {
        let dir = tempfile::tempdir().unwrap();
        let netns = Netns::new("lan");
        exk8s_tests::tls::self_signed(dir.path(), "/CN=lan", 1, "key.pem", "cert.pem");
        let port = exk8s_tests::procs::free_port();
        let _server = Proc(
            Command::new("ip")
                .args([
                    "netns",
                    "exec",
                    &netns.name,
                    "openssl",
                    "s_server",
                    "-www",
                    "-quiet",
                ])
                .args(["-accept", &format!("127.0.0.1:{port}")])
                .args(["-cert", "cert.pem", "-key", "key.pem"])
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        );
        let url = format!("https://127.0.0.1:{port}/");
        let before = own_netns();
        wait_until(
            "the server in the namespace",
            Duration::from_secs(30),
            || https(&netns.name, &Trust::Any, &url, None).is_ok(),
        );
        let answer = https(&netns.name, &Trust::Any, &url, None).unwrap();
        assert_eq!(answer.status, 200);
        assert!(answer.body.contains("s_server"), "{}", answer.body);
        assert_eq!(
            own_netns(),
            before,
            "the thread is back in its own namespace"
        );
        let outside = ureq::AgentBuilder::new()
            .tls_config(Trust::Any.config().unwrap())
            .build()
            .get(&url)
            .call();
        assert!(
            outside.is_err(),
            "the host's loopback has no server at {url}"
        );
        let missing = https("exk8s-test-no-such-namespace", &Trust::Any, &url, None);
        assert!(missing.unwrap_err().contains("no-such-namespace"));
        assert_eq!(own_netns(), before);
    }
}
