//! The local mirror of everything a booted machine downloads, laid out by
//! `scripts/node-mirror.sh` as upstream lays it out (Debian's packages, the release's kubelet
//! and kubectl, etcd's and helm's tarballs, every binary the Go-built one) with the artifact
//! catalog that pins each download by its digest, and served by `python3 -m http.server` on the
//! machine's loopback.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::procs::{Proc, free_port, wait_until};

/// A mirror, served or away.
pub struct Mirror {
    pub root: PathBuf,
    pub port: u16,
    /// `python3 -m http.server`, while it serves.
    server: Option<Proc>,
}

impl Mirror {
    /// Lays the mirror out in `dir` for its port, without serving it yet: nothing answers
    /// there until [`Self::start`] (a mirror that is away).
    pub fn lay_out(dir: &Path) -> Self {
        let port = free_port();
        let out = Command::new("bash")
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/node-mirror.sh"))
            .arg(dir)
            .arg(port.to_string())
            .output()
            .unwrap();
        assert!(out.status.success(), "node-mirror.sh: {out:?}");
        Self {
            root: dir.to_owned(),
            port,
            server: None,
        }
    }

    /// Serves the mirror on its port; returns once it answers.
    pub fn start(&mut self) {
        let port = self.port;
        let server = Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .arg("--directory")
            .arg(&self.root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.server = Some(Proc(server));
        wait_until("the mirror", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// The artifact catalog pinning every download of the mirror (`node-mirror.sh` wrote it).
    pub fn catalog(&self) -> PathBuf {
        self.root.join("artifacts.toml")
    }

    /// The apt source line of the mirror's Debian packages.
    pub fn apt_source(&self) -> String {
        format!(
            "deb [trusted=yes] http://127.0.0.1:{}/debian ./\n",
            self.port
        )
    }
}
