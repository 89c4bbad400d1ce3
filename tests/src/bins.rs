//! The real Kubernetes and etcd binaries the tests run: built from their Go modules once per
//! machine by `scripts/k8s-binaries.sh` (which `scripts/test.sh` runs, exporting where they are)
//! at the versions the renderer pins. A missing binary stops the test naming the script: never
//! a silent skip, never Debian's older etcd in their place.

use std::path::{Path, PathBuf};

/// The etcd release the renderer pins for [`KUBERNETES_VERSION`] (`render::input`), built by
/// `scripts/k8s-binaries.sh`.
pub const ETCD_VERSION: &str = "v3.6.10";
/// The etcd release [`NEXT_KUBERNETES_VERSION`] runs (`EXK8S_ETCD_NEXT_BIN` names its binaries).
pub const NEXT_ETCD_VERSION: &str = "v3.6.14";
/// The Kubernetes release the renderer defaults to.
pub const KUBERNETES_VERSION: &str = "v1.35.3";
/// The next minor's release the upgrade tests go to (`EXK8S_K8S_NEXT_BIN` names its binaries).
pub const NEXT_KUBERNETES_VERSION: &str = "v1.36.3";

fn cache() -> PathBuf {
    std::env::var_os("EXK8S_K8S_CACHE").map_or_else(|| "/var/cache/exk8s/k8s".into(), PathBuf::from)
}

fn found(dir: PathBuf, name: &str) -> PathBuf {
    found_of(dir, name, KUBERNETES_VERSION)
}

fn found_of(dir: PathBuf, name: &str, kubernetes: &str) -> PathBuf {
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/k8s-binaries.sh {kubernetes} {ETCD_VERSION}` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// `etcd`, `etcdctl` or `etcdutl` of [`ETCD_VERSION`] (`EXK8S_ETCD_BIN` names their directory).
pub fn etcd(name: &str) -> PathBuf {
    let dir = std::env::var_os("EXK8S_ETCD_BIN").map_or_else(
        || cache().join(format!("etcd-{ETCD_VERSION}/bin")),
        PathBuf::from,
    );
    found(dir, name)
}

/// `name` of etcd `version`: [`etcd`] for [`ETCD_VERSION`], the binaries of
/// [`NEXT_ETCD_VERSION`] from `EXK8S_ETCD_NEXT_BIN`, any other from the cache. A member runs the
/// release its unit names.
pub fn etcd_at(version: &str, name: &str) -> PathBuf {
    if version == ETCD_VERSION {
        return etcd(name);
    }
    let dir = std::env::var_os("EXK8S_ETCD_NEXT_BIN")
        .filter(|_| version == NEXT_ETCD_VERSION)
        .map_or_else(
            || cache().join(format!("etcd-{version}/bin")),
            PathBuf::from,
        );
    found_of(dir, name, NEXT_KUBERNETES_VERSION)
}

/// `kube-apiserver`, `kube-controller-manager`, `kube-scheduler`, `kubelet` or `kubectl` of
/// [`KUBERNETES_VERSION`] (`EXK8S_K8S_BIN` names their directory).
pub fn kubernetes(name: &str) -> PathBuf {
    let dir = std::env::var_os("EXK8S_K8S_BIN").map_or_else(
        || cache().join(format!("{KUBERNETES_VERSION}/bin")),
        PathBuf::from,
    );
    found(dir, name)
}

/// `name` of Kubernetes `version`: [`kubernetes`] for the default release, the binaries of
/// [`NEXT_KUBERNETES_VERSION`] from `EXK8S_K8S_NEXT_BIN`, any other from the cache. What a node
/// runs follows what its bundle rendered (a static pod's image tag), so an upgrade test runs
/// each component at the release the node was told to run.
pub fn kubernetes_at(version: &str, name: &str) -> PathBuf {
    if version == KUBERNETES_VERSION {
        return kubernetes(name);
    }
    let dir = std::env::var_os("EXK8S_K8S_NEXT_BIN")
        .filter(|_| version == NEXT_KUBERNETES_VERSION)
        .map_or_else(|| cache().join(format!("{version}/bin")), PathBuf::from);
    found_of(dir, name, version)
}

/// The S3-compatible server the snapshot tests store into: `s3s-fs` from crates.io, built
/// once per machine by `scripts/s3-server.sh` (`EXK8S_S3_SERVER` names it).
pub fn s3_server() -> PathBuf {
    let path = std::env::var_os("EXK8S_S3_SERVER")
        .map_or_else(|| cache().join("s3s-fs-0.14.1/bin/s3s-fs"), PathBuf::from);
    assert!(
        path.exists(),
        "{} is missing: run `scripts/s3-server.sh` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// `exk8s-api` or `exk8s-agent` of the previous release of exk8s (`EXK8S_PREVIOUS_BIN` names
/// their directory; `scripts/previous-release.sh` builds them, and scripts/test.sh runs it).
pub fn previous_release(name: &str) -> PathBuf {
    let dir = std::env::var_os("EXK8S_PREVIOUS_BIN").map(PathBuf::from);
    let path = dir.as_ref().map(|d| d.join(name));
    match path {
        Some(path) if path.is_file() => path,
        _ => panic!(
            "the previous release's {name} is missing: run `scripts/previous-release.sh` and set \
             EXK8S_PREVIOUS_BIN to the directory it prints (scripts/test.sh does)"
        ),
    }
}

/// Cluster API's `core` (its core controller) or `clusterctl`, built once per machine by
/// `scripts/capi-binaries.sh` (`EXK8S_CAPI_BIN` names their directory).
pub fn cluster_api(name: &str) -> PathBuf {
    let path = cluster_api_dir("EXK8S_CAPI_BIN", "bin").join(name);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/capi-binaries.sh` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// The directory of Cluster API's core CRDs (`EXK8S_CAPI_CRDS`), copied from its module by
/// `scripts/capi-binaries.sh`.
pub fn cluster_api_crds() -> PathBuf {
    let dir = cluster_api_dir("EXK8S_CAPI_CRDS", "crds");
    assert!(
        dir.join("cluster.x-k8s.io_clusters.yaml").is_file(),
        "{} holds no Cluster CRD: run `scripts/capi-binaries.sh` (scripts/test.sh does)",
        dir.display()
    );
    dir
}

/// The release scripts/lib/versions.sh names for Cluster API.
const CLUSTER_API_VERSION: &str = "v1.14.2";

fn cluster_api_dir(variable: &str, sub: &str) -> PathBuf {
    if let Some(dir) = std::env::var_os(variable) {
        return dir.into();
    }
    let root = cache().join(format!("cluster-api-{CLUSTER_API_VERSION}"));
    wait_for_build(&root);
    root.join(sub)
}

/// Kubernetes' end-to-end suite `e2e.test` of [`KUBERNETES_VERSION`] (its `[Conformance]` specs
/// are the conformance tests): `EXK8S_E2E_TEST`, or the one `scripts/e2e-binaries.sh --selected`
/// built into the cache (the suite's main with only the spec packages the booted clusters'
/// selection lives in).
pub fn e2e_test() -> PathBuf {
    let path = std::env::var_os("EXK8S_E2E_TEST").map_or_else(
        || cache().join(format!("{KUBERNETES_VERSION}-e2e-selected/bin/e2e.test")),
        PathBuf::from,
    );
    if let Some(root) = path.parent().and_then(Path::parent) {
        wait_for_build(root);
    }
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/e2e-binaries.sh {KUBERNETES_VERSION} --selected` (scripts/test.sh does)",
        path.display()
    );
    path
}

/// Waits while a build of the cache directory `root` is under way (scripts/test.sh builds
/// Cluster API beside the booted clusters, which reach it only later): a build holds
/// `<root>.lock` until it stamps `<root>/.done` (scripts/lib/cache.sh).
fn wait_for_build(root: &Path) {
    let lock = PathBuf::from(format!("{}.lock", root.display()));
    if !root.join(".done").exists() && lock.exists() {
        let waited = std::process::Command::new("flock")
            .arg("--shared")
            .arg(&lock)
            .arg("true")
            .status()
            .expect("flock");
        assert!(waited.success(), "flock {}: {waited}", lock.display());
    }
}
