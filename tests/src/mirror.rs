//! The local mirror of everything a booted machine downloads, served by `python3 -m
//! http.server` on the machine's loopback and laid out as upstream lays it out: Debian's
//! packages (`/debian`, a flat repository made by `scripts/node-packages.sh`), the release's
//! kubelet and kubectl (`/release/<k8s>/bin/linux/amd64/`, as dl.k8s.io), etcd's tarball
//! (`/etcd-io/etcd/releases/download/<etcd>/`, as GitHub) and helm's (`/helm-<v>-linux-amd64.tar.gz`,
//! as get.helm.sh), every binary the Go-built one. [`Mirror::catalog`] writes the artifact
//! catalog that pins each download by its digest, for `exk8s-api dev --artifact-catalog`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use exk8s_common::names::Sha256Digest;

use crate::bins::{ETCD_VERSION, KUBERNETES_VERSION, etcd, kubernetes};
use crate::procs::{Proc, free_port, wait_until};

/// The helm release the renderer pins (api/src/render/input.rs) and
/// `scripts/node-registry.sh` builds.
pub const HELM_VERSION: &str = "v3.19.2";

/// A catalog entry: artifact name, version, path below the mirror's root.
type Entry = (&'static str, &'static str, String);

/// A running mirror.
pub struct Mirror {
    pub root: PathBuf,
    pub port: u16,
    entries: Vec<Entry>,
    /// `python3 -m http.server`, while it serves.
    server: Option<Proc>,
}

/// `tar czf dir/<name>` of `files` (source, path inside the archive).
fn tarball(dir: &Path, name: &str, files: &[(PathBuf, String)]) -> String {
    let staging = dir.join(format!("{name}.d"));
    for (source, inside) in files {
        let dest = staging.join(inside);
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(source, &dest).unwrap();
    }
    let top: Vec<String> = files
        .iter()
        .map(|(_, inside)| inside.split('/').next().unwrap().to_owned())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let out = Command::new("tar")
        .arg("-C")
        .arg(&staging)
        .arg("-czf")
        .arg(dir.join(name))
        .args(&top)
        .output()
        .unwrap();
    assert!(out.status.success(), "tar: {out:?}");
    std::fs::remove_dir_all(&staging).unwrap();
    name.to_owned()
}

impl Mirror {
    /// Lays the mirror out in `dir` and serves it. `control_plane`: etcd's tarball, kubectl
    /// and helm too (a worker installs the kubelet only).
    pub fn serve(dir: &Path, control_plane: bool) -> Self {
        let mut mirror = Self::lay_out(dir, control_plane);
        mirror.start();
        mirror
    }

    /// [`Self::serve`] without serving yet: its port is chosen, nothing answers there until
    /// [`Self::start`] (a mirror that is away).
    pub fn lay_out(dir: &Path, control_plane: bool) -> Self {
        let root = dir.to_owned();
        let mut entries: Vec<Entry> = Vec::new();
        let release = format!("release/{KUBERNETES_VERSION}/bin/linux/amd64");
        std::fs::create_dir_all(root.join(&release)).unwrap();
        let mut binaries = vec!["kubelet"];
        if control_plane {
            binaries.push("kubectl");
        }
        for name in binaries {
            std::os::unix::fs::symlink(kubernetes(name), root.join(&release).join(name)).unwrap();
            entries.push((name, KUBERNETES_VERSION, format!("{release}/{name}")));
        }
        if control_plane {
            let releases = format!("etcd-io/etcd/releases/download/{ETCD_VERSION}");
            std::fs::create_dir_all(root.join(&releases)).unwrap();
            let top = format!("etcd-{ETCD_VERSION}-linux-amd64");
            let files: Vec<(PathBuf, String)> = ["etcd", "etcdctl", "etcdutl"]
                .into_iter()
                .map(|b| (etcd(b), format!("{top}/{b}")))
                .collect();
            let name = tarball(&root.join(&releases), &format!("{top}.tar.gz"), &files);
            entries.push(("etcd", ETCD_VERSION, format!("{releases}/{name}")));
            let helm = std::env::var_os("EXK8S_NODE_HELM").map(PathBuf::from);
            let helm = helm.unwrap_or_else(|| {
                panic!("EXK8S_NODE_HELM is not set: run `scripts/node-registry.sh` (scripts/test.sh does)")
            });
            let name = tarball(
                &root,
                &format!("helm-{HELM_VERSION}-linux-amd64.tar.gz"),
                &[(helm, "linux-amd64/helm".into())],
            );
            entries.push(("helm", HELM_VERSION, name));
        }
        let packages = std::env::var_os("EXK8S_NODE_PACKAGES").unwrap_or_else(|| {
            panic!(
                "EXK8S_NODE_PACKAGES is not set: run `scripts/node-packages.sh` (scripts/test.sh does)"
            )
        });
        std::os::unix::fs::symlink(packages, root.join("debian")).unwrap();
        Self {
            root,
            port: free_port(),
            entries,
            server: None,
        }
    }

    /// Serves the mirror on its port; returns once it answers.
    pub fn start(&mut self) {
        let (root, port) = (&self.root, self.port);
        let server = Command::new("python3")
            .args([
                "-m",
                "http.server",
                "--bind",
                "127.0.0.1",
                &port.to_string(),
            ])
            .arg("--directory")
            .arg(root)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.server = Some(Proc(server));
        wait_until("the mirror", Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        });
    }

    /// The artifact catalog pinning every download of the mirror, written to `path`.
    pub fn catalog(&self, path: &Path) {
        let mut catalog = String::new();
        for (name, version, at) in &self.entries {
            let digest = Sha256Digest::of(&std::fs::read(self.root.join(at)).unwrap());
            catalog += &format!(
                "[[artifact]]\nname = \"{name}\"\nversion = \"{version}\"\n\
                 url = \"http://127.0.0.1:{}/{at}\"\nsha256 = \"{digest}\"\n\n",
                self.port
            );
        }
        std::fs::write(path, catalog).unwrap();
    }

    /// The apt source line of the mirror's Debian packages.
    pub fn apt_source(&self) -> String {
        format!(
            "deb [trusted=yes] http://127.0.0.1:{}/debian ./\n",
            self.port
        )
    }
}
