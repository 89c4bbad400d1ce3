//! The agent's etcd membership client against real etcd (built from its Go module), over mutual TLS through
//! the v3 JSON gateway: a one-member cluster holding 1,000 keys takes a second member as a
//! learner (a second learner, and promoting one that has not started, are refused with etcd's
//! words), the learner starts with `--initial-cluster-state=existing` and is promoted once it
//! has caught up; leadership moves off the first member, which is then removed (once etcd's quorum
//! protection allows it) — and the one
//! member left serves every key; a join retried finds its learner, and a learner whose etcd
//! never starts is withdrawn at its deadline (through the first voter that answers; a dead
//! endpoint listed first is passed over). A step outlasts an answer slower than its client's
//! timeout and a dead first endpoint (promotion and removal each meet both), and a call made
//! again after its answer was lost finds it done. Certificates come from openssl, not from
//! exk8s: this proves the client, not the rendering.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use std::io::{Read as _, Write as _};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use exk8s_agent::etcd_members::{
    Etcd, EtcdError, JoinError, join, move_leadership, promote_or_withdraw, promote_when_caught_up,
    remove_when_safe,
};
use exk8s_tests::etcd::{etcdctl, put_keys};
use exk8s_tests::procs::Proc;
use exk8s_tests::tls::{openssl, self_signed};

const PKI: &str = "etc/exk8s/pki";
const CLIENT: (&str, &str) = ("/etc/exk8s/pki/client.pem", "/etc/exk8s/pki/client-key.pem");

/// A CA, a server+peer certificate per member IP, and a client certificate, under
/// `root/etc/exk8s/pki`.
fn certificates(root: &Path, ips: &[&str]) -> PathBuf {
    let pki = root.join(PKI);
    std::fs::create_dir_all(&pki).unwrap();
    self_signed(
        &pki,
        "/CN=membership-test-ca",
        2,
        "etcd-ca-key.pem",
        "etcd-ca.pem",
    );
    let leaf = |name: &str, cn: &str, ext: &str| {
        std::fs::write(pki.join(format!("{name}.ext")), ext).unwrap();
        openssl(
            &pki,
            &[
                "req",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-nodes",
                "-keyout",
                &format!("{name}-key.pem"),
                "-out",
                &format!("{name}.csr"),
                "-subj",
                &format!("/CN={cn}"),
            ],
        );
        openssl(
            &pki,
            &[
                "x509",
                "-req",
                "-in",
                &format!("{name}.csr"),
                "-CA",
                "etcd-ca.pem",
                "-CAkey",
                "etcd-ca-key.pem",
                "-CAcreateserial",
                "-days",
                "2",
                "-out",
                &format!("{name}.pem"),
                "-extfile",
                &format!("{name}.ext"),
            ],
        );
    };
    for (i, ip) in ips.iter().enumerate() {
        leaf(
            &format!("member-{}", i + 1),
            &format!("m{}", i + 1),
            &format!(
                "subjectAltName=IP:{ip},IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"
            ),
        );
    }
    leaf("client", "agent", "extendedKeyUsage=clientAuth\n");
    pki
}

/// Member `n` (1-based) on `ip`, in `initial_cluster`, new or joining an existing cluster.
fn member(root: &Path, n: usize, ip: &str, initial_cluster: &str, state: &str) -> Proc {
    let pki = root.join(PKI);
    let file = |name: &str| pki.join(name).display().to_string();
    let cert = file(&format!("member-{n}.pem"));
    let key = file(&format!("member-{n}-key.pem"));
    let log = std::fs::File::create(root.join(format!("etcd-{n}.log"))).unwrap();
    Proc(
        Command::new(exk8s_tests::bins::etcd("etcd"))
            .args([
                &format!("--name=m{n}"),
                &format!("--data-dir={}", root.join(format!("data-{n}")).display()),
                &format!("--listen-client-urls=https://{ip}:2379"),
                &format!("--advertise-client-urls=https://{ip}:2379"),
                &format!("--listen-peer-urls=https://{ip}:2380"),
                &format!("--initial-advertise-peer-urls=https://{ip}:2380"),
                &format!("--initial-cluster={initial_cluster}"),
                &format!("--initial-cluster-state={state}"),
                "--initial-cluster-token=membership-test",
                "--client-cert-auth",
                &format!("--trusted-ca-file={}", file("etcd-ca.pem")),
                &format!("--cert-file={cert}"),
                &format!("--key-file={key}"),
                "--peer-client-cert-auth",
                &format!("--peer-trusted-ca-file={}", file("etcd-ca.pem")),
                &format!("--peer-cert-file={cert}"),
                &format!("--peer-key-file={key}"),
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("etcd must be installed (scripts/test.sh installs etcd-server)"),
    )
}

fn client(root: &Path, ip: &str) -> Etcd {
    let read = |name: &str| std::fs::read(root.join(PKI).join(name)).unwrap();
    Etcd::new(
        &format!("https://{ip}:2379"),
        &read("etcd-ca.pem"),
        &read("client.pem"),
        &read("client-key.pem"),
    )
    .unwrap()
}

/// A TCP proxy from `listen` to `target` that, once armed, holds the next bytes etcd sends back
/// (a TLS handshake's or an answer's) for `delay`: the call of a client with a shorter timeout
/// fails as a slow etcd's would. Disarmed again after that once.
struct SlowOnce {
    armed: Arc<AtomicBool>,
}

impl SlowOnce {
    fn start(listen: &str, target: &str, delay: Duration) -> Self {
        let armed = Arc::new(AtomicBool::new(false));
        let listener = std::net::TcpListener::bind(listen).unwrap();
        let (target, held) = (target.to_owned(), Arc::clone(&armed));
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(mut client) = client else { return };
                let Ok(mut server) = std::net::TcpStream::connect(&target) else {
                    continue;
                };
                let (mut client_in, mut server_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || std::io::copy(&mut client_in, &mut server_out));
                let held = Arc::clone(&held);
                std::thread::spawn(move || {
                    let mut buffer = [0u8; 16 * 1024];
                    while let Ok(n @ 1..) = server.read(&mut buffer) {
                        if held.swap(false, Ordering::SeqCst) {
                            std::thread::sleep(delay);
                        }
                        if client.write_all(&buffer[..n]).is_err() {
                            break;
                        }
                    }
                    let _ = client.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Self { armed }
    }

    fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    fn met(&self) -> bool {
        !self.armed.load(Ordering::SeqCst)
    }
}

/// A client of `endpoint` whose calls give up after one second.
fn impatient_client(root: &Path, endpoint: &str) -> Etcd {
    let read = |name: &str| std::fs::read(root.join(PKI).join(name)).unwrap();
    Etcd::with_timeout(
        endpoint,
        &read("etcd-ca.pem"),
        &read("client.pem"),
        &read("client-key.pem"),
        Duration::from_secs(1),
    )
    .unwrap()
}

fn until<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_learner_joins_is_promoted_and_the_first_member_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let (ip1, ip2, ip3) = ("127.0.19.1", "127.0.19.2", "127.0.19.3");
    certificates(root, &[ip1, ip2, ip3]);
    let one = format!("m1=https://{ip1}:2380");
    let _m1 = member(root, 1, ip1, &one, "new");
    let first = client(root, ip1);
    until("the first member", || first.members().ok());
    put_keys(
        root,
        &format!("https://{ip1}:2379"),
        CLIENT.0,
        CLIENT.1,
        1000,
    );

    let peer2 = format!("https://{ip2}:2380");
    let learner = join(std::slice::from_ref(&first), &peer2).unwrap();
    assert_eq!(
        join(std::slice::from_ref(&first), &peer2).unwrap(),
        learner,
        "a retried join finds its learner"
    );
    let members = first.members().unwrap();
    assert_eq!(members.len(), 2);
    assert!(
        members
            .iter()
            .any(|m| m.id == learner && m.is_learner && m.name.is_empty())
    );
    match first.add_learner(&format!("https://{ip3}:2380")) {
        Err(EtcdError::Refused { message, .. }) => {
            assert!(message.contains("too many learner members"), "{message}")
        }
        other => panic!("a second learner: {other:?}"),
    }
    match first.promote(learner) {
        Err(EtcdError::Refused { message, .. }) => {
            assert!(message.contains("in sync with leader"), "{message}")
        }
        other => panic!("promoting a learner that has not started: {other:?}"),
    }

    let two = format!("{one},m2=https://{ip2}:2380");
    let _m2 = member(root, 2, ip2, &two, "existing");
    // The endpoint named first is down, the second answers slower than the client waits once:
    // the step goes on within its deadline.
    let dead = "https://127.0.19.250:2379";
    let slow_first = SlowOnce::start(
        &format!("{ip1}:23790"),
        &format!("{ip1}:2379"),
        Duration::from_secs(3),
    );
    slow_first.arm();
    promote_or_withdraw(
        &[
            impatient_client(root, dead),
            impatient_client(root, &format!("https://{ip1}:23790")),
        ],
        &peer2,
        Duration::from_millis(500),
        Duration::from_secs(60),
    )
    .unwrap();
    assert!(slow_first.met(), "the slow answer came during the step");
    // A promotion made again (its first answer lost) finds a voter: done.
    promote_when_caught_up(
        std::slice::from_ref(&first),
        learner,
        Duration::from_millis(500),
        Duration::ZERO,
    )
    .unwrap();
    let members = first.members().unwrap();
    assert!(members.iter().all(|m| !m.is_learner), "{members:?}");
    assert_eq!(members.len(), 2);

    // The first member leaves: leadership moves off it first, then it is removed. The first
    // answer to the move comes too late for the client: the step looks at who leads and goes
    // on (moving it again when it had not moved).
    let (me, leader) = first.status().unwrap();
    if leader == me {
        let slow_move = SlowOnce::start(
            &format!("{ip1}:23791"),
            &format!("{ip1}:2379"),
            Duration::from_secs(3),
        );
        slow_move.arm();
        move_leadership(
            &impatient_client(root, &format!("https://{ip1}:23791")),
            me,
            learner,
            Duration::from_millis(500),
            Duration::from_secs(60),
        )
        .unwrap();
        assert!(slow_move.met(), "the slow answer came during the move");
    }
    let second = client(root, ip2);
    until("the second member leads", || {
        second.status().ok().filter(|(me, leader)| me == leader)
    });
    // etcd refuses while the survivor has been connected for under five seconds; the first
    // endpoint is down and the second answers too slowly once, meanwhile.
    let slow_second = SlowOnce::start(
        &format!("{ip2}:23790"),
        &format!("{ip2}:2379"),
        Duration::from_secs(3),
    );
    slow_second.arm();
    remove_when_safe(
        &[
            impatient_client(root, dead),
            impatient_client(root, &format!("https://{ip2}:23790")),
        ],
        me,
        Duration::from_millis(500),
        Duration::from_secs(30),
    )
    .unwrap();
    assert!(slow_second.met(), "the slow answer came during the step");
    // A removal made again (its first answer lost) finds the member gone: done.
    remove_when_safe(
        std::slice::from_ref(&second),
        me,
        Duration::from_millis(500),
        Duration::ZERO,
    )
    .unwrap();
    let left = second.members().unwrap();
    assert_eq!(left.len(), 1);
    assert_eq!(left[0].id, learner);
    let e2 = format!("https://{ip2}:2379");
    let (ok, out) = etcdctl(
        root,
        &e2,
        CLIENT.0,
        CLIENT.1,
        &["get", "/k/", "--prefix", "--keys-only"],
    );
    let keys = out.lines().filter(|l| l.starts_with("/k/")).count();
    assert!(ok && keys == 1000, "{keys} keys: {out}");
    let (ok, out) = etcdctl(root, &e2, CLIENT.0, CLIENT.1, &["put", "/after", "ok"]);
    assert!(ok, "the member left alone has quorum: {out}");

    // A join whose etcd never starts: withdrawn at the deadline; the cluster never noticed.
    let peer3 = format!("https://{ip3}:2380");
    let voters = [client(root, "127.0.19.250"), client(root, ip2)];
    join(&voters, &peer3).unwrap();
    match promote_or_withdraw(
        &voters,
        &peer3,
        Duration::from_millis(500),
        Duration::from_secs(3),
    ) {
        Err(JoinError::Withdrawn { removal, secs, .. }) => {
            assert_eq!(removal, "it was removed");
            assert_eq!(secs, 3);
        }
        other => panic!("a learner that never started: {other:?}"),
    }
    assert_eq!(second.members().unwrap().len(), 1);
    let (ok, out) = etcdctl(
        root,
        &e2,
        CLIENT.0,
        CLIENT.1,
        &["put", "/after-withdrawal", "ok"],
    );
    assert!(ok, "{out}");
}
