//! The files of a bundle: every certificate and key the node holds, its kubeconfigs, and every
//! rendered configuration, unit and manifest, each with its path and mode — what every node
//! has ([`node`]) and what only a control-plane node has ([`control_plane`]), the static pods
//! last so their annotations can digest the files they mount.

mod control_plane;
pub(super) mod node;

use std::collections::BTreeMap;

use exk8s_common::names::{BundlePath, FileMode, Sha256Digest};
use exk8s_common::payload::BundleFile;
use zeroize::Zeroizing;

use super::contexts::Mount;
use super::{RenderError, RenderInput};
use crate::labels::Taint;
use crate::pki::kubeconfig::{self, KubeconfigSpec};
use crate::pki::{ClientIdentity, IssuedCert};
use exk8s_common::contract::Role;

/// The server a control-plane node's own components talk to: its own apiserver.
const LOCAL_API: &str = "https://127.0.0.1:6443";
/// Where every node's balancer listens (`exk8s-agent balance`).
pub(in crate::render) const BALANCER_HOST: &str = "127.0.0.1";
pub(in crate::render) const BALANCER_PORT: u16 = 7445;
pub(in crate::render) const BALANCER_LISTEN: &str = "127.0.0.1:7445";
/// The server a worker's kubelet and kube-proxy talk to: the node's balancer (every apiserver
/// certificate names 127.0.0.1).
pub(in crate::render) const BALANCED_API: &str = "https://127.0.0.1:7445";

/// Files being assembled: path → (mode, content). `private` files are 0600 (keys,
/// kubeconfigs, static pod manifests as kubeadm writes them); contents are wiped when dropped.
#[derive(Default)]
pub(super) struct FileSet(BTreeMap<&'static str, (FileMode, Zeroizing<Vec<u8>>)>);

impl FileSet {
    pub(super) fn public(&mut self, path: &'static str, content: impl Into<Vec<u8>>) {
        self.0
            .insert(path, (FileMode::PUBLIC, Zeroizing::new(content.into())));
    }

    pub(super) fn private(&mut self, path: &'static str, content: impl Into<Vec<u8>>) {
        self.0
            .insert(path, (FileMode::SECRET, Zeroizing::new(content.into())));
    }

    pub(super) fn cert(
        &mut self,
        cert_path: &'static str,
        key_path: &'static str,
        cert: &IssuedCert,
    ) {
        self.public(cert_path, cert.cert_pem.as_bytes());
        self.private(key_path, cert.key_pem.expose().as_bytes());
    }

    /// SHA-256 over the paths and contents of `mounts` (files only).
    pub(super) fn digest_of(&self, mounts: &[Mount]) -> Sha256Digest {
        let mut all = Vec::new();
        for mount in mounts.iter().filter(|m| m.kind == "File") {
            all.extend_from_slice(mount.path.as_bytes());
            all.push(0);
            if let Some((_, content)) = self.0.get(mount.path) {
                all.extend_from_slice(&Sha256Digest::of(content).as_bytes()[..]);
            }
        }
        Sha256Digest::of(&all)
    }

    /// A kubeconfig for `identity` with `credentials`, trusting the cluster CA, at `path`.
    pub(super) fn kubeconfig(
        &mut self,
        path: &'static str,
        trust: &Trust<'_>,
        identity: &ClientIdentity,
        credentials: &IssuedCert,
    ) {
        let (user, _) = identity.subject();
        let text = kubeconfig::render(&KubeconfigSpec {
            cluster_name: trust.cluster_name,
            server: trust.server,
            ca_pem: trust.ca_pem,
            user: &user,
            credentials,
        });
        self.private(path, text.expose().as_bytes());
    }

    pub(super) fn into_bundle_files(self) -> Result<Vec<BundleFile>, RenderError> {
        self.0
            .into_iter()
            .map(|(path, (mode, mut content))| {
                let path =
                    BundlePath::new(path).map_err(|e| RenderError::InvalidValue(e.to_string()))?;
                // Moved, not copied: the file's content wipes the bytes when it is dropped.
                Ok(BundleFile::new(path, mode, std::mem::take(&mut *content)))
            })
            .collect()
    }
}

/// What a kubeconfig trusts and where it points.
pub(super) struct Trust<'a> {
    pub cluster_name: &'a str,
    /// The apiserver URL.
    pub server: &'a str,
    /// The cluster CA certificate(s), PEM.
    pub ca_pem: &'a str,
}

/// A static pod the node runs: its manifest and the digest of the files it mounts (the
/// manifest's `exk8s.io/inputs-sha256`), which the plan's wait looks for on the mirror pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StaticPod {
    /// The pod's `metadata.name` (`kube-apiserver`).
    pub name: &'static str,
    pub manifest: &'static str,
    pub inputs_sha256: Sha256Digest,
}

/// The rendered files, and the static pods among them in start order.
pub(super) struct Rendered {
    pub files: Vec<BundleFile>,
    pub static_pods: Vec<StaticPod>,
}

pub(super) fn render_files(input: &RenderInput<'_>) -> Result<Rendered, RenderError> {
    let control_plane =
        input
            .credentials
            .minted
            .control_plane()
            .ok_or(RenderError::MissingCredentials(
                "control-plane certificates",
            ))?;
    let mut files = FileSet::default();
    let apiservers: Vec<_> = input
        .peers
        .iter()
        .map(|p| p.addresses.private_ipv4)
        .collect();
    // Every node-local component of a control-plane node talks to its own apiserver.
    node::files(
        &node::NodeSide {
            cluster: input.cluster,
            vm_id: input.node.vm_id,
            addresses: &input.node.addresses,
            cluster_ca_pem: input.credentials.cluster_ca_pem,
            certs: input.credentials.minted.node(),
            server: LOCAL_API,
            role: Role::ControlPlane,
            apiservers: &apiservers,
            labels: &[],
            taints: &[Taint::control_plane()],
        },
        &mut files,
    )?;
    let static_pods = control_plane::files(input, control_plane, &mut files)?;
    Ok(Rendered {
        files: files.into_bundle_files()?,
        static_pods,
    })
}
