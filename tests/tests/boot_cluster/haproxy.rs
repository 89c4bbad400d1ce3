//! The load balancer `docs/apiserver-endpoint.md` shows outside clients, run as the page
//! writes it: its `haproxy` blocks (read with a CommonMark parser) with `CA_FILE` holding what
//! the page says — the operator kubeconfig's CA data, the cluster CA and its standby
//! ([`trust_file`]) — the static form with one `server` line per member ([`Haproxy::listing`], sampled by
//! [`super::day2`]), or the form that follows the control plane's name through a DNS server
//! ([`Haproxy::following`], sampled by [`super::scale`]) — checked by `haproxy -c` and run by
//! Debian's HAProxy in the first machine's network namespace. The DNS server is Debian's
//! dnsmasq answering from the dev stack's DNS records ([`DnsServer`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use exk8s_tests::machine::Machine;
use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

/// The page's `haproxy` code blocks, in order.
fn documented() -> Vec<String> {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/apiserver-endpoint.md");
    let text = std::fs::read_to_string(&page).unwrap();
    let (mut blocks, mut inside) = (Vec::new(), false);
    for event in Parser::new(&text) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang))) if &*lang == "haproxy" => {
                inside = true;
                blocks.push(String::new());
            }
            Event::Text(t) if inside => blocks.last_mut().unwrap().push_str(&t),
            Event::End(TagEnd::CodeBlock) => inside = false,
            _ => {}
        }
    }
    assert_eq!(
        blocks.len(),
        2,
        "{}: the static configuration and the backend that follows the name",
        page.display()
    );
    blocks
}

/// The file the page names `CA_FILE`, written under `dir`: the `certificate-authority-data` of
/// the operator kubeconfig `cluster` has now, base64-decoded (the cluster CA and its standby, so
/// a cluster-CA rotation keeps every member passing its checks).
pub(crate) fn trust_file(stack: &exk8s_tests::dev::Stack, cluster: i64, dir: &Path) -> PathBuf {
    use base64::Engine as _;
    let text = exk8s_tests::cluster::operator_kubeconfig(stack, cluster);
    let doc: yaml_serde::Value = yaml_serde::from_str(&text).unwrap();
    let data = doc["clusters"][0]["cluster"]["certificate-authority-data"]
        .as_str()
        .expect("the operator kubeconfig carries its CA data");
    let pem = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&pem)
            .matches("BEGIN CERTIFICATE")
            .count(),
        2,
        "the cluster CA and its standby"
    );
    let file = dir.join("haproxy-ca.pem");
    std::fs::write(&file, pem).unwrap();
    file
}

/// HAProxy running a documented configuration, until dropped.
pub(crate) struct Haproxy {
    child: Child,
    log: PathBuf,
}

impl Haproxy {
    /// The page's static configuration in front of `members`, `CA_FILE` being `ca`
    /// ([`trust_file`]), in `on`'s network namespace with its files under `dir`; once a request
    /// through it is answered.
    pub(crate) fn listing(on: &Machine, members: &[String], ca: &Path, dir: &Path) -> Self {
        let block = &documented()[0];
        // Each example `server` line (a checked one and a fallback one per member) is the
        // first of its kind: made again for each member.
        let mut config = String::new();
        let mut examples = 0;
        for line in block.lines() {
            let Some(server) = line.trim_start().strip_prefix("server ") else {
                config.push_str(line);
                config.push('\n');
                continue;
            };
            examples += 1;
            let (name, rest) = server.split_once(' ').unwrap();
            let (kind, number) = name.rsplit_once('-').unwrap();
            let (_, options) = rest.split_once(' ').unwrap_or((rest, ""));
            if number == "1" {
                for (i, ip) in members.iter().enumerate() {
                    config.push_str(&format!(
                        "    server {kind}-{} {ip}:6443 {options}\n",
                        i + 1
                    ));
                }
            }
        }
        assert_eq!(
            examples, 6,
            "the page shows a checked and a fallback server line per member: {block}"
        );
        Self::run(on, &config, ca, dir)
    }

    /// The page's configuration with its backend replaced by the one that follows `name`
    /// through the DNS server at `dns` (`IP:PORT`), as the page says to.
    pub(crate) fn following(on: &Machine, name: &str, dns: &str, ca: &Path, dir: &Path) -> Self {
        let blocks = documented();
        let (front, backend) = (&blocks[0], &blocks[1]);
        // Up to the backend section (a line of its own; `default_backend` names it too).
        let front = &front[..=front
            .find("\nbackend apiservers")
            .expect("the static configuration has a backend")];
        assert!(
            backend.contains("DNS_SERVER:53") && backend.contains("CONTROL_PLANE_NAME:6443"),
            "{backend}"
        );
        let backend = backend
            .replace("DNS_SERVER:53", dns)
            .replace("CONTROL_PLANE_NAME", name);
        Self::run(on, &format!("{front}{backend}"), ca, dir)
    }

    fn run(on: &Machine, config: &str, ca: &Path, dir: &Path) -> Self {
        let mut filled = String::new();
        for line in config.lines() {
            filled.push_str(&line.replace("CA_FILE", &ca.display().to_string()));
            filled.push('\n');
            // Beyond the page: a log of every connection and check, to read when a sample fails.
            match line.trim() {
                "global" => filled.push_str("    log stderr format iso local0\n"),
                "defaults" => filled.push_str("    log global\n    option tcplog\n"),
                _ => {}
            }
        }
        let file = dir.join("haproxy.cfg");
        std::fs::write(&file, &filled).unwrap();
        let checked = Command::new("haproxy")
            .args(["-c", "-f"])
            .arg(&file)
            .output()
            .expect("haproxy (Debian's package; scripts/test.sh installs it)");
        assert!(
            checked.status.success(),
            "haproxy -c: {}{}\n{filled}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        );
        let log = dir.join("haproxy.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = on
            .on_lan("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let haproxy = Self { child, log };
        exk8s_tests::procs::wait_until("HAProxy's first answer", Duration::from_secs(30), || {
            let out = on
                .on_lan("curl")
                .args(["-sSk", "--max-time", "2", "https://127.0.0.1:8443/version"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).contains("\"gitVersion\"")
        });
        haproxy
    }
}

impl Haproxy {
    /// How many checks its log says failed at TLS (`Layer6`: the handshake, the member's
    /// certificate not verified with the CA file): what a trust file missing the CA a member
    /// serves under shows as. A member whose `/readyz` answered 500 or not in time (its etcd
    /// check, a loaded host) fails at `Layer7`, and a handshake that did not end within the
    /// check's timeout (`Layer6 timeout`: a member slow on a loaded host — seen once, 1,035 ms
    /// in the middle of a rotation's phase) is no verdict on the trust either.
    pub(crate) fn tls_check_failures(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                (l.contains("is DOWN, reason: Layer6") && !l.contains("reason: Layer6 timeout"))
                    || l.contains("SSL handshake")
            })
            .count()
    }
}

impl Drop for Haproxy {
    /// Stops it; when a check failed (a panic unwinds through it), prints what its log holds
    /// besides connections that ended normally (`--` termination flags): the checks' verdicts,
    /// what the name resolved to, and connections refused, retried or cut.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let unusual: String = log
                .lines()
                .filter(|l| !l.contains(" -- "))
                .map(|l| l.to_owned() + "\n")
                .collect();
            eprintln!("HAProxy's log, but for connections that ended normally:\n{unusual}");
        }
    }
}

/// The cloud's DNS as a server: dnsmasq in `on`'s network namespace on `127.0.0.1:PORT`,
/// answering from the hosts file the dev stack keeps of its DNS records (`<data
/// dir>/machines/dns`, read again whenever it changes) and from nothing else.
pub(crate) struct DnsServer {
    child: Child,
    pub(crate) address: String,
}

impl DnsServer {
    pub(crate) fn start(on: &Machine, data_dir: &Path, port: u16, log: &Path) -> Self {
        let zone = data_dir.join("machines/dns");
        assert!(
            zone.join("hosts").is_file(),
            "the dev stack keeps its DNS records in {}",
            zone.display()
        );
        let out = std::fs::File::create(log).unwrap();
        let child = on
            .on_lan("dnsmasq")
            .args([
                "--keep-in-foreground",
                "--no-daemon",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                &format!("--port={port}"),
                "--no-resolv",
                "--no-hosts",
                "--log-facility=-",
            ])
            .arg(format!("--hostsdir={}", zone.display()))
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("dnsmasq (Debian's dnsmasq-base; scripts/test.sh installs it)");
        Self {
            child,
            address: format!("127.0.0.1:{port}"),
        }
    }
}

impl Drop for DnsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
