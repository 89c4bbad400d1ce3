//! The README's real local cluster works as written: its code block (read with a CommonMark
//! parser) run shell by shell — `scripts/dev-cluster.sh` in the first, as root, and, once its
//! stack answers, the second: login, `clusters create shop … --wait`, a pool of one worker,
//! `exk8s nodes`, and kubectl on the control-plane machine with the admin kubeconfig its agent
//! wrote. With the suite's own builds standing in for what the script would build (`--bin-dir`
//! and `--agent`: the workspace's programs instead of `target/release/` and the static agent;
//! the node image, packages, Kubernetes and the registry from the suite's caches, which the
//! script takes from the environment) and two substitutions: the stack listens on a free port
//! instead of 8080, and its data lives in the test's directory. Then the same kubectl command,
//! as the reader would run it again, lists both nodes Ready. Ctrl-C (SIGINT to the script's
//! process group) stops the stack and powers its machines off.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use exk8s_tests::procs::{binary, free_port, wait_until};
use exk8s_tests::readme::{self, Group, code_blocks, shells};
use exk8s_tests::timeline::mark;

/// A port whose next two are free too (the script serves its mirror and registry there).
fn three_free_ports() -> u16 {
    loop {
        let port = free_port();
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if port < u16::MAX - 2 && free(port + 1) && free(port + 2) {
            return port;
        }
    }
}

pub(crate) fn run() {
    let block = code_blocks(&readme::text())
        .into_iter()
        .find(|b| b.contains("scripts/dev-cluster.sh"))
        .expect("the real local cluster's quick start");
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let data = dir.join("exk8s-dev-machines");
    let bin_dir = binary("exk8s").parent().unwrap().to_owned();
    let port = three_free_ports();
    let block = block
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{port}"))
        .replace("./exk8s-dev-machines", &data.display().to_string())
        .replace(" exk8s-dev-machines/", &format!(" {}/", data.display()))
        .replace("$PWD/target/release", &bin_dir.display().to_string())
        .replace(
            "scripts/dev-cluster.sh",
            &format!(
                "scripts/dev-cluster.sh --port {port} --bin-dir {} --agent {}",
                bin_dir.display(),
                binary("exk8s-agent").display()
            ),
        );
    let shells = shells(&block);
    assert_eq!(shells.len(), 2, "two shells: {shells:?}");
    // The tests run as root: `sudo` is the command itself.
    let root = |script: &str| format!("sudo() {{ \"$@\"; }}\n{script}");
    let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");

    let first_log = dir.join("shell-1.log");
    let mut first = readme::bash(&repository, &root(&shells[0]), &first_log);
    // Its machines' LAN is the script's default, not one a caller chose for another test.
    first.env_remove("EXK8S_SIM_CIDR");
    let stack = Group {
        child: first.spawn().unwrap(),
        signal: "INT",
        grace: Duration::from_secs(180),
    };
    let log = |path: &Path| std::fs::read_to_string(path).unwrap_or_default();
    wait_until("dev-cluster.sh's stack", Duration::from_secs(900), || {
        assert!(
            Command::new("kill")
                .args(["-0", &stack.child.id().to_string()])
                .status()
                .unwrap()
                .success(),
            "dev-cluster.sh ended: {}",
            log(&first_log)
        );
        data.join("operator.token").is_file()
            && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });

    mark("dev-cluster.sh's stack serves; the second shell");
    let second_log = dir.join("shell-2.log");
    let second = readme::bash(dir, &root(&shells[1]), &second_log)
        .status()
        .unwrap();
    let said = log(&second_log);
    assert!(
        second.success(),
        "the second shell failed: {said}\n--- dev-cluster.sh:\n{}",
        log(&first_log)
    );
    assert!(said.contains("logged in"), "{said}");
    // kubectl already lists the control-plane node; run again, as a reader would, it lists
    // the worker too once it has booted.
    let kubectl = shells[1]
        .lines()
        .skip_while(|l| !l.contains("nsenter"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(kubectl.contains("get nodes"), "{kubectl}");
    mark("waiting for both nodes Ready");
    wait_until("both nodes Ready", Duration::from_secs(900), || {
        let out = readme::bash(dir, &root(&kubectl), &dir.join("kubectl.log"))
            .status()
            .unwrap();
        let nodes = log(&dir.join("kubectl.log"));
        let ready = nodes.lines().filter(|l| l.contains(" Ready ")).count();
        out.success() && ready == 2
    });
    eprintln!(
        "the README's real local cluster:\n{}",
        log(&dir.join("kubectl.log"))
    );
    mark("Ctrl-C");
    drop(stack);
    // Ctrl-C powered the machines off: no machine booted from the stack's image is left.
    let left = Command::new("pgrep")
        .args(["-af", &format!("systemd-nspawn.*{}", data.display())])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "machines left running after Ctrl-C: {}",
        String::from_utf8_lossy(&left.stdout)
    );
}
