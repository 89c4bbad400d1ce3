//! The load balancer `docs/apiserver-endpoint.md` shows outside clients, run as the page
//! writes it: its `haproxy` block (read with a CommonMark parser), the cluster CA and one
//! `server` line per member filled in, checked by `haproxy -c` and run by Debian's HAProxy in
//! the first machine's network namespace, where the samples of [`super::day2`] go through it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use exk8s_tests::machine::Machine;
use pulldown_cmark::{CodeBlockKind, Event, Parser, Tag, TagEnd};

/// The page's `haproxy` code block.
fn documented() -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/apiserver-endpoint.md");
    let text = std::fs::read_to_string(&page).unwrap();
    let (mut inside, mut block) = (false, String::new());
    for event in Parser::new(&text) {
        match event {
            Event::Start(Tag::CodeBlock(CodeBlockKind::Fenced(lang))) if &*lang == "haproxy" => {
                inside = true;
            }
            Event::Text(t) if inside => block.push_str(&t),
            Event::End(TagEnd::CodeBlock) if inside => return block,
            _ => {}
        }
    }
    panic!("no haproxy block in {}", page.display())
}

/// HAProxy running the documented configuration in front of `members`, until dropped.
pub(crate) struct Haproxy {
    child: Child,
    log: PathBuf,
}

impl Haproxy {
    /// Starts it in `on`'s network namespace with its files under `dir`, and waits until a
    /// request through it is answered.
    pub(crate) fn start(on: &Machine, members: &[String], dir: &Path) -> Self {
        let block = documented();
        let examples = block
            .lines()
            .filter(|l| l.trim_start().starts_with("server member-"))
            .count();
        assert_eq!(
            examples, 3,
            "the page shows one server line per member: {block}"
        );
        let ca = on.root.join("etc/exk8s/pki/ca.pem");
        let mut config = String::new();
        let mut servers_written = false;
        for line in block.lines() {
            if line.trim_start().starts_with("server member-") {
                if !servers_written {
                    for (i, ip) in members.iter().enumerate() {
                        config.push_str(&format!("    server member-{} {ip}:6443\n", i + 1));
                    }
                    servers_written = true;
                }
                continue;
            }
            config.push_str(&line.replace("CA_FILE", &ca.display().to_string()));
            config.push('\n');
            // Beyond the page: a log of every connection and check, to read when a sample fails.
            match line.trim() {
                "global" => config.push_str("    log stderr format iso local0\n"),
                "defaults" => config.push_str("    log global\n    option tcplog\n"),
                _ => {}
            }
        }
        let file = dir.join("haproxy.cfg");
        std::fs::write(&file, &config).unwrap();
        let checked = Command::new("haproxy")
            .args(["-c", "-f"])
            .arg(&file)
            .output()
            .expect("haproxy (Debian's package; scripts/test.sh installs it)");
        assert!(
            checked.status.success(),
            "haproxy -c: {}{}\n{config}",
            String::from_utf8_lossy(&checked.stdout),
            String::from_utf8_lossy(&checked.stderr)
        );
        let log = std::fs::File::create(dir.join("haproxy.log")).unwrap();
        let child = on
            .on_lan("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let haproxy = Self {
            child,
            log: dir.join("haproxy.log"),
        };
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

impl Drop for Haproxy {
    /// Stops it; when a check failed (a panic unwinds through it), prints what its log holds
    /// besides connections that ended normally (`--` termination flags): the checks' verdicts,
    /// and connections refused, retried or cut.
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
