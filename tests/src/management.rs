//! A management cluster for Cluster API: the real etcd, kube-apiserver and
//! kube-controller-manager (its garbage collector and namespace controllers: owner references
//! and deletes behave as in any cluster) the tests build, as processes on loopback, with a CA,
//! certificates and an admin kubeconfig made by openssl; then Cluster API's CRDs and core
//! controller (built from its module by `scripts/capi-binaries.sh`) and `exk8s-capi` with its
//! CRDs. Stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use base64::Engine as _;

use crate::bins;
use crate::procs::{Proc, binary, free_port, wait_until};
use crate::tls::{openssl, self_signed};

/// The management cluster's processes and how to reach it.
pub struct Management {
    pub dir: PathBuf,
    /// The admin kubeconfig (`system:masters`).
    pub kubeconfig: PathBuf,
    /// The CA that signed every certificate here (`ca.crt`, `ca.key` in `dir`).
    pub ca: PathBuf,
    /// The apiserver's port on 127.0.0.1.
    port: u16,
    procs: Vec<Proc>,
}

/// `name.crt` and `name.key` in `dir`: a P-256 key and a certificate for `subject` signed by
/// `dir/ca.crt`, with `extensions` (an openssl extension section's lines).
pub fn issue(dir: &Path, name: &str, subject: &str, extensions: &str) {
    let ext = dir.join(format!("{name}.ext"));
    std::fs::write(&ext, extensions).unwrap();
    let (key, csr, crt) = (
        format!("{name}.key"),
        format!("{name}.csr"),
        format!("{name}.crt"),
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            subject,
        ],
    );
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-out",
            &crt,
            "-extfile",
            &ext.display().to_string(),
        ],
    );
}

fn log_file(dir: &Path, name: &str) -> std::fs::File {
    std::fs::File::create(dir.join(format!("{name}.log"))).unwrap()
}

fn spawn(dir: &Path, name: &str, program: &Path, args: &[String]) -> Proc {
    Proc(
        Command::new(program)
            .args(args)
            .stdout(Stdio::null())
            .stderr(log_file(dir, name))
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e}", program.display())),
    )
}

/// `dir/<name>.kubeconfig`: the apiserver on `port` with the client certificate `<name>.crt`.
fn kubeconfig_of(dir: &Path, port: u16, name: &str) -> PathBuf {
    let b64 = |file: &str| {
        base64::engine::general_purpose::STANDARD.encode(std::fs::read(dir.join(file)).unwrap())
    };
    let kubeconfig = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: management\n  cluster:\n    \
             server: https://127.0.0.1:{port}\n    certificate-authority-data: {}\nusers:\n\
             - name: {name}\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\n\
             contexts:\n- name: management\n  context:\n    cluster: management\n    user: {name}\n\
             current-context: management\n",
            b64("ca.crt"),
            b64(&format!("{name}.crt")),
            b64(&format!("{name}.key"))
        ),
    )
    .unwrap();
    kubeconfig
}

/// The example manifest of docs/cluster-api.md, exactly, with this test's exk8s API, token,
/// machines, version and replicas in place of the page's.
pub fn example_manifest(api: &str, token: &str, version: &str, replicas: u8) -> String {
    substituted(
        &docs_example("kind: ExK8sControlPlane"),
        &[
            ("https://exk8s.example.com", api),
            ("EXK8S-OPERATOR-TOKEN", token),
            ("version: v1.35.3", &format!("version: {version}")),
            ("replicas: 1", &format!("replicas: {replicas}")),
            ("instanceType: e2.medium", "instanceType: dev.small"),
            ("imageID: 42", "imageID: 1"),
            ("subnetID: 7", "subnetID: 1"),
        ],
    )
}

/// The workers' example manifest of docs/cluster-api.md (a MachinePool and its
/// `ExK8sMachinePool`), exactly, with this test's machines, version and replicas.
pub fn example_workers_manifest(version: &str, replicas: u8) -> String {
    substituted(
        &docs_example("kind: ExK8sMachinePool"),
        &[
            ("version: v1.35.3", &format!("version: {version}")),
            ("replicas: 2", &format!("replicas: {replicas}")),
            ("instanceType: e2.medium", "instanceType: dev.small"),
            ("imageID: 42", "imageID: 1"),
            ("subnetID: 7", "subnetID: 1"),
        ],
    )
}

/// docs/cluster-api.md's code block that contains `marker`.
fn docs_example(marker: &str) -> String {
    let page = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/cluster-api.md"),
    )
    .unwrap();
    crate::readme::code_blocks(&page)
        .into_iter()
        .find(|b| b.contains(marker))
        .unwrap_or_else(|| panic!("docs/cluster-api.md has no example with {marker:?}"))
}

/// `example` with each `(from, to)` replaced; each `from` must be there.
fn substituted(example: &str, replacements: &[(&str, &str)]) -> String {
    replacements
        .iter()
        .fold(example.to_owned(), |text, (from, to)| {
            assert!(
                text.contains(from),
                "the example no longer says {from:?}: {example}"
            );
            text.replace(from, to)
        })
}

impl Management {
    /// etcd, kube-apiserver and kube-controller-manager under `dir`, on loopback: ready once
    /// `/readyz` answers.
    pub fn start(dir: &Path) -> Self {
        Self::start_on(dir, free_port())
    }

    /// [`Self::start`] with the apiserver on `127.0.0.1:port`.
    pub fn start_on(dir: &Path, secure: u16) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        self_signed(dir, "/CN=management-ca", 2, "ca.key", "ca.crt");
        issue(
            dir,
            "apiserver",
            "/CN=kube-apiserver",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        );
        issue(
            dir,
            "admin",
            "/O=system:masters/CN=management-admin",
            "extendedKeyUsage=clientAuth\n",
        );
        openssl(
            dir,
            &[
                "ecparam",
                "-name",
                "prime256v1",
                "-genkey",
                "-noout",
                "-out",
                "sa.key",
            ],
        );
        let path = |name: &str| dir.join(name).display().to_string();
        let (client, peer) = (free_port(), free_port());
        let etcd = spawn(
            dir,
            "etcd",
            &bins::etcd("etcd"),
            &[
                "--name=management".into(),
                format!("--data-dir={}", path("etcd")),
                format!("--listen-client-urls=http://127.0.0.1:{client}"),
                format!("--advertise-client-urls=http://127.0.0.1:{client}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"),
                format!("--initial-cluster=management=http://127.0.0.1:{peer}"),
                "--log-level=warn".into(),
            ],
        );
        let apiserver = spawn(
            dir,
            "kube-apiserver",
            &bins::kubernetes("kube-apiserver"),
            &[
                format!("--etcd-servers=http://127.0.0.1:{client}"),
                "--bind-address=127.0.0.1".into(),
                "--advertise-address=127.0.0.1".into(),
                format!("--secure-port={secure}"),
                format!("--tls-cert-file={}", path("apiserver.crt")),
                format!("--tls-private-key-file={}", path("apiserver.key")),
                format!("--client-ca-file={}", path("ca.crt")),
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
                format!("--service-account-key-file={}", path("sa.key")),
                format!("--service-account-signing-key-file={}", path("sa.key")),
                "--service-cluster-ip-range=10.96.0.0/16".into(),
                "--authorization-mode=RBAC".into(),
                "--profiling=false".into(),
            ],
        );
        let kubeconfig = kubeconfig_of(dir, secure, "admin");
        let mut management = Self {
            dir: dir.to_owned(),
            kubeconfig,
            ca: dir.join("ca.crt"),
            port: secure,
            procs: vec![etcd, apiserver],
        };
        wait_until(
            "the management apiserver's /readyz",
            Duration::from_secs(120),
            || {
                management
                    .kubectl(&["get", "--raw", "/readyz"])
                    .status
                    .success()
            },
        );
        let controllers = spawn(
            dir,
            "kube-controller-manager",
            &bins::kubernetes("kube-controller-manager"),
            &[
                format!("--kubeconfig={}", management.kubeconfig.display()),
                "--controllers=garbagecollector,namespace".into(),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
            ],
        );
        management.procs.push(controllers);
        management
    }

    /// `kubectl args` with the admin kubeconfig.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        Command::new(bins::kubernetes("kubectl"))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(args)
            .output()
            .expect("kubectl")
    }

    /// [`Self::kubectl`]'s stdout; panics with its output when it fails.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml`: its output, or the error kubectl printed.
    pub fn apply(&self, yaml: &str) -> Result<String, String> {
        use std::io::Write as _;
        let mut child = Command::new(bins::kubernetes("kubectl"))
            .arg(format!("--kubeconfig={}", self.kubeconfig.display()))
            .args(["apply", "--server-side", "--force-conflicts", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("kubectl");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(yaml.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if out.status.success() {
            Ok(said)
        } else {
            Err(said)
        }
    }

    /// `command`, started beside the cluster (a controller), its stderr to `dir/<name>.log`,
    /// stopped with the cluster.
    pub fn spawn(&mut self, name: &str, mut command: Command) {
        let child = command
            .stdout(log_file(&self.dir, &format!("{name}.out")))
            .stderr(log_file(&self.dir, name))
            .spawn()
            .unwrap_or_else(|e| panic!("{name}: {command:?}: {e}"));
        self.procs.push(Proc(child));
    }

    /// Cluster API's CRDs and exk8s-capi's, applied and established.
    pub fn install_crds(&self) {
        let crds = bins::cluster_api_crds().display().to_string();
        self.kubectl_ok(&["apply", "--server-side", "-f", &crds]);
        let ours = Command::new(binary("exk8s-capi"))
            .arg("crds")
            .output()
            .unwrap();
        assert!(ours.status.success(), "exk8s-capi crds: {ours:?}");
        self.apply(&String::from_utf8(ours.stdout).unwrap())
            .unwrap();
        self.kubectl_ok(&[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/clusters.cluster.x-k8s.io",
            "crd/exk8sclusters.infrastructure.cluster.x-k8s.io",
            "crd/exk8scontrolplanes.controlplane.cluster.x-k8s.io",
        ]);
    }

    /// Cluster API's core controller with the admin kubeconfig, its webhook server on a
    /// certificate of this cluster's CA (it binds every address: run it in a namespace of the
    /// test's own), started through `launcher` when given: a command prefix that ends with the
    /// program to run (entering a network namespace, for instance).
    pub fn start_cluster_api(&mut self, launcher: &[String]) {
        let webhook = self.dir.join("webhook");
        std::fs::create_dir_all(&webhook).unwrap();
        for file in ["ca.crt", "ca.key"] {
            std::fs::copy(self.dir.join(file), webhook.join(file)).unwrap();
        }
        issue(
            &webhook,
            "tls",
            "/CN=capi-webhook",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        );
        let core = bins::cluster_api("core").display().to_string();
        let mut argv: Vec<String> = launcher.to_vec();
        argv.extend([
            core,
            format!("--kubeconfig={}", self.kubeconfig.display()),
            "--leader-elect=false".into(),
            format!("--webhook-port={}", free_port()),
            format!("--webhook-cert-dir={}", webhook.display()),
            format!("--health-addr=127.0.0.1:{}", free_port()),
            format!("--diagnostics-address=127.0.0.1:{}", free_port()),
            "--insecure-diagnostics".into(),
            "--remote-connection-grace-period=20s".into(),
        ]);
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]);
        self.spawn("capi-core", command);
    }

    /// `exk8s-capi run` against this cluster.
    pub fn start_exk8s_capi(&mut self) {
        // As the user `exk8s-capi rbac` grants, and nothing more: what it needs is all it has.
        let user = "exk8s-capi";
        let rbac = Command::new(binary("exk8s-capi"))
            .args(["rbac", "--user", user])
            .output()
            .unwrap();
        assert!(rbac.status.success(), "exk8s-capi rbac: {rbac:?}");
        self.apply(&String::from_utf8(rbac.stdout).unwrap())
            .unwrap();
        issue(
            &self.dir,
            user,
            &format!("/CN={user}"),
            "extendedKeyUsage=clientAuth\n",
        );
        let kubeconfig = kubeconfig_of(&self.dir, self.port, user);
        let mut command = Command::new(binary("exk8s-capi"));
        command
            .arg("run")
            .env("KUBECONFIG", &kubeconfig)
            .env("RUST_LOG", "info");
        self.spawn("exk8s-capi", command);
    }

    /// exk8s-capi's log and the end of Cluster API's, for a failure's message.
    pub fn controller_logs(&self) -> String {
        let core = self.log("capi-core");
        let tail: Vec<&str> = core.lines().rev().take(40).collect();
        format!(
            "--- exk8s-capi:\n{}\n--- capi-core (its last 40 lines, newest first):\n{}",
            self.log("exk8s-capi"),
            tail.join("\n")
        )
    }

    /// `kubectl get KIND NAME -o json`, or `None` when it is not there.
    pub fn get(&self, kind: &str, name: &str) -> Option<serde_json::Value> {
        let out = self.kubectl(&["get", kind, name, "-o", "json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).unwrap())
    }

    /// `dir/<name>.log`'s text.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.join(format!("{name}.log"))).unwrap_or_default()
    }
}

impl Drop for Management {
    fn drop(&mut self) {
        // Controllers first, the apiserver, then etcd: each its SIGTERM.
        while let Some(proc) = self.procs.pop() {
            proc.terminate(Duration::from_secs(10));
        }
    }
}
