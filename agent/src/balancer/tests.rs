//! The balancer against stand-in apiservers on loopback: each a real TLS server with a
//! certificate for 127.0.0.1 from a test CA, answering `/readyz` as told and `/who` with its
//! name. Clients speak TLS through the balancer to them, as a kubelet does. Rounds of checks
//! are asked for by the tests, never waited for.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test")]

use std::collections::BTreeSet;
use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};

use super::{Balancer, Endpoint, Readiness, readyz};

/// A CA (its PEM) and a TLS server configuration for 127.0.0.1 it signed.
fn ca_and_server() -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &issuer)
        .unwrap();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from_pem_slice(cert.pem().as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).unwrap(),
    )
    .unwrap();
    (ca.pem(), Arc::new(config))
}

/// [`ca_and_server`], with the CA's PEM written to a file (kept while the directory is).
fn ca_in_a_file() -> (
    String,
    Arc<rustls::ServerConfig>,
    tempfile::TempDir,
    std::path::PathBuf,
) {
    let (ca, server) = ca_and_server();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    (ca, server, dir, ca_file)
}

/// A stand-in apiserver: its address, and whether its `/readyz` says ok.
struct Apiserver {
    addr: SocketAddr,
    ready: Arc<AtomicBool>,
}

fn apiserver(name: &'static str, tls: &Arc<rustls::ServerConfig>) -> Apiserver {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    let ready = Arc::new(AtomicBool::new(true));
    let (said, tls) = (Arc::clone(&ready), Arc::clone(tls));
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (said, tls) = (Arc::clone(&said), Arc::clone(&tls));
            std::thread::spawn(move || answer(stream, tls, &said, name));
        }
    });
    Apiserver { addr, ready }
}

fn answer(stream: TcpStream, tls: Arc<rustls::ServerConfig>, ready: &AtomicBool, name: &str) {
    let mut tls = rustls::StreamOwned::new(rustls::ServerConnection::new(tls).unwrap(), stream);
    let (mut head, mut chunk) = (Vec::new(), [0_u8; 1024]);
    let path = loop {
        match tls.read(&mut chunk) {
            Ok(0) | Err(_) => return,
            Ok(read) => head.extend_from_slice(&chunk[..read]),
        }
        let mut headers = [httparse::EMPTY_HEADER; 16];
        let mut request = httparse::Request::new(&mut headers);
        if let Ok(httparse::Status::Complete(_)) = request.parse(&head) {
            break request.path.unwrap_or_default().to_owned();
        }
    };
    let (status, body) = match path.as_str() {
        "/readyz" if ready.load(Ordering::Relaxed) => ("200 OK", "ok"),
        "/readyz" => ("500 Internal Server Error", "[-]shutdown failed"),
        "/who" => ("200 OK", name),
        _ => ("404 Not Found", ""),
    };
    let _ = write!(
        tls,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    tls.conn.send_close_notify();
    let _ = tls.flush();
}

/// `GET /who` over TLS through `balancer`: the name of the apiserver that answered.
fn who(balancer: SocketAddr, tls: &Arc<rustls::ClientConfig>) -> String {
    let tcp = TcpStream::connect(balancer).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let name = ServerName::IpAddress(std::net::IpAddr::from(Ipv4Addr::LOCALHOST).into());
    let conn = rustls::ClientConnection::new(Arc::clone(tls), name).unwrap();
    let mut stream = rustls::StreamOwned::new(conn, tcp);
    stream
        .write_all(b"GET /who HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200 "), "{answer}");
    answer.split("\r\n\r\n").nth(1).unwrap().to_owned()
}

/// A port nothing listens on.
fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    listener.local_addr().unwrap()
}

#[test]
fn connections_go_to_ready_apiservers_and_follow_the_name() {
    let (ca, server, _dir, ca_file) = ca_in_a_file();
    let (a, b) = (apiserver("a", &server), apiserver("b", &server));
    let listed = Mutex::new(vec![a.addr, b.addr]);
    let balancer = Balancer::new(|| Ok(listed.lock().unwrap().clone()), ca_file);
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let at = listener.local_addr().unwrap();
    let client = readyz::tls(ca.as_bytes()).unwrap();
    let stop = AtomicBool::new(false);
    let names = |n: usize| -> BTreeSet<String> { (0..n).map(|_| who(at, &client)).collect() };

    std::thread::scope(|s| {
        // Rounds only when the test asks: the serving loop's own wait is an hour.
        let served = s.spawn(|| balancer.serve(&listener, Duration::from_secs(3600), &stop));
        // Its first round ran before the first accept: both ready, both take connections.
        assert_eq!(names(6), BTreeSet::from(["a".to_owned(), "b".to_owned()]));

        // a starts to stop: its /readyz fails, and after the next round it takes nothing new.
        a.ready.store(false, Ordering::Relaxed);
        balancer.round();
        let views = balancer.pool().backends();
        assert_eq!(
            views[usize::from(views[0].addr != a.addr)].readiness,
            Readiness::NotReady("/readyz answered HTTP 500".to_owned())
        );
        assert_eq!(names(6), BTreeSet::from(["b".to_owned()]));
        a.ready.store(true, Ordering::Relaxed);
        balancer.round();
        assert_eq!(names(6).len(), 2);

        // An apiserver believed ready that refuses connections: every connection still
        // lands, on the other one, and the refusing one is marked at once.
        let gone = closed_port();
        balancer
            .pool()
            .update(vec![(a.addr, Readiness::Ready), (gone, Readiness::Ready)]);
        assert_eq!(names(6), BTreeSet::from(["a".to_owned()]));
        let marked = balancer.pool().backends();
        let gone_view = marked.iter().find(|v| v.addr == gone).unwrap();
        assert!(
            matches!(&gone_view.readiness, Readiness::NotReady(why) if why.starts_with("connect: ")),
            "{gone_view:?}"
        );

        // The name no longer lists b (a member replaced): b takes nothing new.
        *listed.lock().unwrap() = vec![a.addr];
        balancer.round();
        let known: Vec<SocketAddr> = balancer.pool().backends().iter().map(|v| v.addr).collect();
        assert_eq!(known, [a.addr]);
        assert_eq!(names(4), BTreeSet::from(["a".to_owned()]));

        stop.store(true, Ordering::Relaxed);
        served.join().unwrap().unwrap();
    });
    assert_eq!(balancer.pool().connections(), 0);
}

#[test]
fn a_stopping_apiserver_is_marked_before_the_rounds_slowest_check_ends() {
    let (_, server, _dir, ca_file) = ca_in_a_file();
    let a = apiserver("a", &server);
    // A member that does not answer: connections complete into its backlog, never a byte back,
    // so its check takes the whole timeout (a lost machine's does too).
    let silent = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let balancer = Balancer::new(|| Ok(vec![a.addr, silent_addr]), ca_file);
    balancer.pool().update(vec![
        (a.addr, Readiness::Ready),
        (silent_addr, Readiness::Ready),
    ]);
    a.ready.store(false, Ordering::Relaxed);
    let readiness_of_a = || {
        let views = balancer.pool().backends();
        views
            .iter()
            .find(|v| v.addr == a.addr)
            .unwrap()
            .readiness
            .clone()
    };
    std::thread::scope(|s| {
        let round = s.spawn(|| balancer.round());
        while readiness_of_a() == Readiness::Ready && !round.is_finished() {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            !round.is_finished(),
            "a was marked only when the round ended, after the silent member's whole timeout"
        );
        assert_eq!(
            readiness_of_a(),
            Readiness::NotReady("/readyz answered HTTP 500".to_owned())
        );
        round.join().unwrap();
    });
    drop(silent);
}

#[test]
fn checks_trust_only_the_cluster_ca_and_name_what_failed() {
    let (ca, _) = ca_and_server();
    let (_, other_server) = ca_and_server();
    let stranger = apiserver("stranger", &other_server);
    let tls = readyz::tls(ca.as_bytes()).unwrap();
    let said = readyz::check(stranger.addr, &tls, Duration::from_secs(5));
    assert!(
        matches!(&said, Readiness::NotReady(why) if why.contains("certificate") || why.contains("UnknownIssuer")),
        "{said:?}"
    );
    let refused = readyz::check(closed_port(), &tls, Duration::from_secs(5));
    assert!(
        matches!(&refused, Readiness::NotReady(why) if why.starts_with("connect: ")),
        "{refused:?}"
    );
    // A CA file that cannot be read makes every apiserver not ready, naming the file.
    let (_, server) = ca_and_server();
    let known = apiserver("known", &server);
    let balancer = Balancer::new(|| Ok(vec![known.addr]), "/nonexistent/ca.pem".into());
    balancer.round();
    let views = balancer.pool().backends();
    assert!(
        matches!(&views[0].readiness, Readiness::NotReady(why) if why.starts_with("/nonexistent/ca.pem: ")),
        "{views:?}"
    );
    assert!(readyz::tls(b"not a certificate").is_err());
}

#[test]
fn while_the_name_does_not_resolve_the_known_apiservers_stay() {
    let (_, server, _dir, ca_file) = ca_in_a_file();
    let a = apiserver("a", &server);
    let resolves = AtomicBool::new(true);
    let balancer = Balancer::new(
        || {
            if resolves.load(Ordering::Relaxed) {
                Ok(vec![a.addr])
            } else {
                Err(std::io::Error::other("no such host"))
            }
        },
        ca_file,
    );
    balancer.round();
    resolves.store(false, Ordering::Relaxed);
    balancer.round();
    balancer.round();
    let views = balancer.pool().backends();
    assert_eq!(views.len(), 1);
    assert!(views[0].listed);
    assert_eq!(views[0].readiness, Readiness::Ready);
}

#[test]
fn until_the_name_first_resolves_the_bundles_members_stand_in() {
    let (_, server, dir, ca_file) = ca_in_a_file();
    let (a, b) = (apiserver("a", &server), apiserver("b", &server));
    let seeds = dir.path().join("apiservers");
    std::fs::write(&seeds, format!("# the bundle's members\n{}\n", a.addr)).unwrap();
    let resolves = AtomicBool::new(false);
    let balancer = Balancer::new(
        || {
            if resolves.load(Ordering::Relaxed) {
                Ok(vec![b.addr])
            } else {
                Err(std::io::Error::other("no such host"))
            }
        },
        ca_file,
    )
    .with_seeds(seeds.clone());
    balancer.round();
    assert_eq!(listed(&balancer), [a.addr], "the bundle's member");
    // A newer bundle's list is read at the next round.
    std::fs::write(&seeds, format!("{}\n{}\n", a.addr, b.addr)).unwrap();
    balancer.round();
    let mut both = vec![a.addr, b.addr];
    both.sort();
    assert_eq!(listed(&balancer), both);
    // Once the name resolves it wins, and its last answer outlives a later failure.
    resolves.store(true, Ordering::Relaxed);
    balancer.round();
    assert_eq!(listed(&balancer), [b.addr], "the name's answer");
    resolves.store(false, Ordering::Relaxed);
    balancer.round();
    assert_eq!(listed(&balancer), [b.addr], "kept, not the seeds");

    // No list, or an unreadable one: nothing to balance over, said in the log.
    let unseeded = Balancer::new(
        || Err(std::io::Error::other("no such host")),
        dir.path().join("ca.pem"),
    )
    .with_seeds(dir.path().join("missing"));
    unseeded.round();
    assert!(listed(&unseeded).is_empty());
}

/// The apiservers `balancer` lists and finds ready, in order.
fn listed<R>(balancer: &Balancer<R>) -> Vec<SocketAddr>
where
    R: Fn() -> std::io::Result<Vec<SocketAddr>> + Sync,
{
    let mut listed: Vec<SocketAddr> = balancer
        .pool()
        .backends()
        .iter()
        .filter(|v| v.listed && v.readiness == Readiness::Ready)
        .map(|v| v.addr)
        .collect();
    listed.sort();
    listed
}

#[test]
fn an_endpoint_is_a_host_and_a_port() {
    let parsed: Endpoint = "cp.example.com:6443".parse().unwrap();
    assert_eq!(
        parsed,
        Endpoint {
            host: "cp.example.com".to_owned(),
            port: 6443
        }
    );
    let v6: Endpoint = "[::1]:6443".parse().unwrap();
    assert_eq!(v6.host, "::1");
    assert_eq!(
        "127.0.0.1:6443"
            .parse::<Endpoint>()
            .unwrap()
            .resolve()
            .unwrap(),
        [SocketAddr::from((Ipv4Addr::LOCALHOST, 6443))]
    );
    for (bad, says) in [
        ("cp.example.com", "is not HOST:PORT"),
        ("cp.example.com:0", "the port must be 1-65535"),
        ("cp.example.com:https", "the port must be 1-65535"),
        (":6443", "the host is empty"),
        ("cp example:6443", "has a space"),
    ] {
        let refused = bad.parse::<Endpoint>().unwrap_err();
        assert!(refused.contains(says), "{bad}: {refused}");
    }
}
