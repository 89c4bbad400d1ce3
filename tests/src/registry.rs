//! The registry booted machines pull their images from, as an air-gapped cluster pulls from its
//! own mirror of `registry.k8s.io` and `ghcr.io`: distribution's `registry`, serving read-only
//! the storage `scripts/node-registry.sh` filled once per machine (pause, the control plane's
//! and the addons' images, built from their Go modules). `scripts/test.sh`
//! exports where both are (`EXK8S_NODE_REGISTRY`, `EXK8S_NODE_REGISTRY_STORE`).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::procs::{Proc, free_port, wait_until};

/// A registry on the machine's loopback: serving from [`Registry::serve`], away between
/// [`Registry::stop`] and [`Registry::start`] (a mirror an air-gapped site lost), on one port.
pub struct Registry {
    pub port: u16,
    config: PathBuf,
    log: PathBuf,
    server: Option<Proc>,
}

fn env_path(name: &str) -> PathBuf {
    let path = std::env::var_os(name)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("{name} is not set: run `scripts/node-registry.sh` (scripts/test.sh does)")
        });
    assert!(path.exists(), "{name}: {} is missing", path.display());
    path
}

impl Registry {
    /// Serves the node registry's storage on `127.0.0.1:<free port>`, its configuration and
    /// log in `dir`.
    pub fn serve(dir: &Path) -> Self {
        let store = env_path("EXK8S_NODE_REGISTRY_STORE");
        let port = free_port();
        let config = dir.join("registry.yml");
        // Read-only: a test never changes the cached images.
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    \
                 rootdirectory: {}\n  maintenance:\n    readonly:\n      enabled: true\n\
                 http:\n  addr: 127.0.0.1:{port}\n",
                store.display()
            ),
        )
        .unwrap();
        let mut registry = Self {
            port,
            config,
            log: dir.join("registry.log"),
            server: None,
        };
        registry.start();
        registry
    }

    /// Serves again on the same port (a no-op while serving); returns once it answers.
    pub fn start(&mut self) {
        if self.server.is_some() {
            return;
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let server = Command::new(env_path("EXK8S_NODE_REGISTRY"))
            .arg("serve")
            .arg(&self.config)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.server = Some(Proc(server));
        let port = self.port;
        wait_until("the node registry", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// Stops serving: nothing answers at the port until [`Self::start`].
    pub fn stop(&mut self) {
        drop(self.server.take());
    }

    /// The registries whose images this one serves under the same names: the control plane's
    /// and CoreDNS's (`registry.k8s.io`), flannel's (`ghcr.io`), the workloads' test images.
    pub const MIRRORED: [&str; 2] = ["registry.k8s.io", "ghcr.io"];

    /// containerd's `hosts.toml` that makes this registry, reached at `127.0.0.1:port` from
    /// inside a machine, the mirror of `upstream` (one of [`Self::MIRRORED`]).
    pub fn hosts_toml(&self, upstream: &str) -> String {
        format!(
            "server = \"https://{upstream}\"\n\n[host.\"http://127.0.0.1:{}\"]\n  \
             capabilities = [\"pull\", \"resolve\"]\n",
            self.port
        )
    }
}
