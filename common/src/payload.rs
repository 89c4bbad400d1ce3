//! The v2 bundle payload: everything one node needs, rendered by the API for
//! exactly that VM. Every field is typed and validated on the way in; unknown fields are
//! refused at every level so a newer, richer bundle is never half-understood by an older agent.
//!
//! Parse a payload only through [`crate::envelope::verify`], which checks the signature first.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

pub use crate::contract::{BundleKind, Role};
use crate::error::BundleError;
use crate::limits::{
    MAX_ARTIFACTS, MAX_FILE_BYTES, MAX_FILES, MAX_PACKAGES, MAX_PLAN_STEPS, base64_len_for,
};
use crate::names::{
    AccountName, ArchiveMember, ArtifactDest, ArtifactName, BundlePath, ChartRef, FileMode,
    HttpUrl, K8sName, NodeName, Nonce, PackageName, Sha256Digest, UnitName, Version,
};
use crate::serde_util::bounded_vec;

/// The v2 bundle payload (v2 added the bundle kind and the generation).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundlePayload {
    pub identity: Identity,
    pub freshness: Freshness,
    #[serde(deserialize_with = "bounded_vec::<_, _, MAX_FILES>")]
    pub files: Vec<BundleFile>,
    #[serde(deserialize_with = "bounded_vec::<_, _, MAX_ARTIFACTS>")]
    pub artifacts: Vec<Artifact>,
    #[serde(deserialize_with = "bounded_vec::<_, _, MAX_PACKAGES>")]
    pub packages: Vec<Package>,
    #[serde(deserialize_with = "bounded_vec::<_, _, MAX_PLAN_STEPS>")]
    pub plan: Vec<PlanStep>,
}

/// Who the bundle is for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Identity {
    /// Unique per issuance; the audit row carries the same id.
    pub bundle_id: Uuid,
    pub cluster_id: u64,
    pub cluster_name: K8sName,
    pub org_id: u64,
    /// The VM this bundle was rendered for; the agent compares it with its IMDS identity.
    pub vm_id: u64,
    pub node_name: NodeName,
    pub role: Role,
    /// Only the initial control-plane node runs the cluster-wide addon steps.
    pub is_initial_control_plane: bool,
    /// The first bundle of the node's life, or a later update.
    pub kind: BundleKind,
    /// The node's generation this bundle carries (at least 1); the agent reports it applied.
    pub generation: u64,
}

/// When and in answer to which request the bundle was issued.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Freshness {
    /// Unix seconds.
    pub issued_at: i64,
    /// Unix seconds; the agent refuses the bundle after this (plus a documented skew allowance).
    pub expires_at: i64,
    /// Per node, strictly increasing across issuances; the agent refuses rollback.
    pub serial: u64,
    /// Echo of the agent's `X-Exk8s-Nonce`, binding the bundle to one request.
    pub nonce: Nonce,
}

/// One file to write.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BundleFile {
    pub path: BundlePath,
    pub mode: FileMode,
    pub owner: AccountName,
    pub group: AccountName,
    /// Digest of `content`; checked after decoding, and used by the agent to plan changes.
    pub sha256: Sha256Digest,
    pub content: FileContent,
}

impl BundleFile {
    /// A root-owned file whose digest is computed from `content`.
    pub fn new(path: BundlePath, mode: FileMode, content: impl Into<Vec<u8>>) -> Self {
        let content = FileContent(content.into());
        let root = AccountName::new("root").unwrap_or_else(|_| unreachable!("`root` is valid"));
        Self {
            path,
            mode,
            owner: root.clone(),
            group: root,
            sha256: Sha256Digest::of(content.as_bytes()),
            content,
        }
    }
}

/// File bytes, base64 on the wire. `Debug` never shows them: they are often private keys.
#[derive(Clone, PartialEq, Eq)]
pub struct FileContent(Vec<u8>);

impl FileContent {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for FileContent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "[{} bytes redacted]", self.0.len())
    }
}

impl Drop for FileContent {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.0);
    }
}

impl Serialize for FileContent {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Encoded piece by piece straight into the output: no whole base64 copy of the bytes
        // (often a private key) is made, and none is left unwiped in freed memory.
        s.collect_str(&base64::display::Base64Display::new(&self.0, &BASE64))
    }
}

impl<'de> Deserialize<'de> for FileContent {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let encoded = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        // Judge the size from the encoded length before decoding anything.
        if encoded.len() > base64_len_for(MAX_FILE_BYTES) {
            return Err(D::Error::custom(format!(
                "file content exceeds the {MAX_FILE_BYTES}-byte limit"
            )));
        }
        let bytes = BASE64
            .decode(encoded.as_bytes())
            .map_err(|_| D::Error::custom("file content is not valid base64"))?;
        if bytes.len() > MAX_FILE_BYTES {
            return Err(D::Error::custom(format!(
                "file content exceeds the {MAX_FILE_BYTES}-byte limit"
            )));
        }
        Ok(Self(bytes))
    }
}

/// A binary the node needs, downloaded and checked by digest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub name: ArtifactName,
    pub version: Version,
    pub url: HttpUrl,
    /// Pinned digest of what `url` serves. When absent the agent fetches `<url>.sha256` and
    /// fails closed if that does not match either.
    pub sha256: Option<Sha256Digest>,
    /// When `url` serves a `.tar.gz`, the member to install; otherwise the download itself is
    /// the binary.
    pub archive_member: Option<ArchiveMember>,
    pub dest: ArtifactDest,
    pub mode: FileMode,
}

/// An OS package the node needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Package {
    pub name: PackageName,
}

/// A rollout the addon step waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RolloutKind {
    Deployment,
    DaemonSet,
}

/// One step of the node plan, run in order. The API decides the plan; the agent never branches
/// on cluster facts itself. Every path a step names is a bundle path.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case", deny_unknown_fields)]
pub enum PlanStep {
    /// `systemctl daemon-reload` (the agent skips it when no unit file changed).
    // An empty struct variant, not a unit variant: serde ignores unknown fields on unit
    // variants of internally tagged enums.
    DaemonReload {},
    /// `systemctl enable --no-reload` (systemd reloads in the plan's `DaemonReload` step, when a
    /// unit file changed), then start the unit if it is not running, or restart it if it is
    /// and a file in `watch` changed in this apply. Nothing changed and running: no action.
    EnableStart {
        unit: UnitName,
        #[serde(deserialize_with = "bounded_vec::<_, _, MAX_PLAN_STEPS>")]
        watch: Vec<BundlePath>,
    },
    /// Poll etcd's `/health` over mutual TLS until it answers healthy or the timeout passes.
    WaitEtcdHealthy {
        endpoint: HttpUrl,
        ca_file: BundlePath,
        cert_file: BundlePath,
        key_file: BundlePath,
        timeout_secs: u32,
    },
    /// Before etcd starts on a node joining a running cluster: adds this node as a learner with
    /// `peer_url` through the first of `voters` that answers (a learner refuses membership
    /// calls), or finds the learner a retried join added. The client identity is the files'.
    EtcdJoin {
        #[serde(deserialize_with = "bounded_vec::<_, _, MAX_PLAN_STEPS>")]
        voters: Vec<HttpUrl>,
        peer_url: HttpUrl,
        ca_file: BundlePath,
        cert_file: BundlePath,
        key_file: BundlePath,
    },
    /// Once this node's etcd runs: promotes its learner as soon as it has caught up (etcd
    /// refuses before), retrying until `timeout_secs`; a learner still behind then is removed
    /// and the step fails. A member already voting is done.
    EtcdPromote {
        #[serde(deserialize_with = "bounded_vec::<_, _, MAX_PLAN_STEPS>")]
        voters: Vec<HttpUrl>,
        peer_url: HttpUrl,
        ca_file: BundlePath,
        cert_file: BundlePath,
        key_file: BundlePath,
        timeout_secs: u32,
    },
    /// Removes a leaving member from etcd: leadership moves off it first (asked through its
    /// own `member_client_url`, when it answers), then it is removed through the first of
    /// `voters` (the members that stay) that answers, retried while etcd's quorum protection
    /// refuses, until `timeout_secs`. A member etcd no longer lists is done.
    EtcdRemove {
        #[serde(deserialize_with = "bounded_vec::<_, _, MAX_PLAN_STEPS>")]
        voters: Vec<HttpUrl>,
        member_client_url: HttpUrl,
        member_peer_url: HttpUrl,
        ca_file: BundlePath,
        cert_file: BundlePath,
        key_file: BundlePath,
        timeout_secs: u32,
    },
    /// Poll the apiserver's `/readyz` with the identity and CA of a kubeconfig.
    WaitApiserverReady {
        kubeconfig: BundlePath,
        timeout_secs: u32,
    },
    /// Polls a control-plane component's `/healthz` on this node, `https://127.0.0.1:<port>`,
    /// until it answers `ok`. Like the kubelet's own probe of these pods, the component's
    /// self-signed serving certificate is not verified: the probe reaches loopback only and
    /// sends nothing but the request line.
    WaitComponentHealthy {
        /// The component, as reports name it (`kube-controller-manager`).
        component: K8sName,
        port: u16,
        timeout_secs: u32,
    },
    /// Waits until this node's kubelet registered its Node object `node`, read through
    /// `kubeconfig`'s apiserver (the kubelet's own kubeconfig: a kubelet may read its Node).
    WaitNodeRegistered {
        kubeconfig: BundlePath,
        node: NodeName,
        timeout_secs: u32,
    },
    /// Installs a static pod's manifest — one of the bundle's files — here instead of with the
    /// other files, so the kubelet (re)starts the pod only after the steps before it (etcd
    /// healthy). An unchanged manifest is left alone.
    InstallStaticPod { manifest: BundlePath },
    /// Only when `manifest` changed in this apply: waits until the kubelet runs the new pod —
    /// its mirror pod `mirror_pod` in `kube-system`, read through `kubeconfig`'s apiserver, is
    /// Ready and carries `inputs_sha256` in its `exk8s.io/inputs-sha256` annotation (the old
    /// pod, still answering, does not count).
    WaitStaticPod {
        kubeconfig: BundlePath,
        manifest: BundlePath,
        mirror_pod: K8sName,
        inputs_sha256: Sha256Digest,
        timeout_secs: u32,
    },
    /// `kubectl apply -f <file>`.
    KubectlApply {
        kubeconfig: BundlePath,
        file: BundlePath,
    },
    /// `helm upgrade --install`.
    HelmInstall {
        kubeconfig: BundlePath,
        release: K8sName,
        chart: ChartRef,
        version: Version,
        namespace: K8sName,
        values_file: BundlePath,
        timeout_secs: u32,
    },
    /// Drains a worker being removed through the Kubernetes eviction API (cordon, evict its
    /// pods honouring PodDisruptionBudgets, DaemonSet pods excepted), then deletes its Node
    /// object; a node the apiserver does not know is already done.
    DrainNode {
        kubeconfig: BundlePath,
        node: NodeName,
        timeout_secs: u32,
    },
    /// `kubectl rollout status`.
    WaitRollout {
        kubeconfig: BundlePath,
        kind: RolloutKind,
        name: K8sName,
        namespace: K8sName,
        timeout_secs: u32,
    },
}

impl BundlePayload {
    /// Parses payload JSON (already signature-checked) and applies the cross-field rules.
    pub(crate) fn from_json(bytes: &[u8]) -> Result<Self, BundleError> {
        let de = &mut serde_json::Deserializer::from_slice(bytes);
        let payload: Self = serde_path_to_error::deserialize(de).map_err(|e| {
            let (at, reason) = crate::names::json_failure(e);
            BundleError::MalformedPayload { at, reason }
        })?;
        payload.check_consistency()?;
        Ok(payload)
    }

    /// Rules no single field can express: distinct paths, digests matching contents,
    /// a validity window that is not empty.
    pub fn check_consistency(&self) -> Result<(), BundleError> {
        if self.freshness.expires_at <= self.freshness.issued_at {
            return Err(BundleError::EmptyValidity);
        }
        if self.identity.generation == 0 {
            return Err(BundleError::ZeroGeneration);
        }
        let mut seen = std::collections::HashSet::with_capacity(self.files.len());
        for file in &self.files {
            if !seen.insert(file.path.as_str()) {
                return Err(BundleError::DuplicatePath {
                    path: crate::names::shown_at_most(file.path.as_str(), 160),
                });
            }
            if Sha256Digest::of(file.content.as_bytes()) != file.sha256 {
                return Err(BundleError::DigestMismatch {
                    path: crate::names::shown_at_most(file.path.as_str(), 160),
                });
            }
        }
        for step in &self.plan {
            let manifest = match step {
                PlanStep::InstallStaticPod { manifest }
                | PlanStep::WaitStaticPod { manifest, .. } => manifest,
                _ => continue,
            };
            if !seen.contains(manifest.as_str()) {
                return Err(BundleError::PlanFileMissing {
                    path: crate::names::shown_at_most(manifest.as_str(), 160),
                });
            }
        }
        let mut dests = std::collections::HashSet::with_capacity(self.artifacts.len());
        for artifact in &self.artifacts {
            if !dests.insert(artifact.dest.as_str()) {
                return Err(BundleError::DuplicatePath {
                    path: crate::names::shown_at_most(artifact.dest.as_str(), 160),
                });
            }
        }
        Ok(())
    }

    /// The file at `path`, if the bundle carries one.
    pub fn file(&self, path: &str) -> Option<&BundleFile> {
        self.files.iter().find(|f| f.path.as_str() == path)
    }
}

/// A payload serialised in two steps, for an issuer that takes the serial and generation after
/// the expensive part is done: [`PayloadBody::of`] serialises the files, artifacts, packages
/// and plan; [`PayloadBody::finish`] puts identity and freshness in front. The result is
/// byte for byte what `serde_json::to_vec` gives for the whole [`BundlePayload`] (the fields
/// keep their declared order). The bytes hold private keys: wiped on drop, never shown.
pub struct PayloadBody(zeroize::Zeroizing<Vec<u8>>);

impl std::fmt::Debug for PayloadBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PayloadBody([{} bytes redacted])", self.0.len())
    }
}

#[derive(Serialize)]
struct Head<'a> {
    identity: &'a Identity,
    freshness: &'a Freshness,
}

#[derive(Serialize)]
struct Body<'a> {
    files: &'a [BundleFile],
    artifacts: &'a [Artifact],
    packages: &'a [Package],
    plan: &'a [PlanStep],
}

impl PayloadBody {
    /// Everything of `payload` after its identity and freshness, serialised.
    pub fn of(payload: &BundlePayload) -> serde_json::Result<Self> {
        let body = Body {
            files: &payload.files,
            artifacts: &payload.artifacts,
            packages: &payload.packages,
            plan: &payload.plan,
        };
        // Sized up front: a growing buffer would leave copies of the keys it holds in the
        // memory each reallocation frees, and copy them each time.
        let mut out = Vec::with_capacity(Self::estimate(payload));
        serde_json::to_writer(&mut out, &body)?;
        Ok(Self(zeroize::Zeroizing::new(out)))
    }

    /// Bytes enough for the body's JSON in all but unusual payloads: each file's base64 and
    /// fields, and a margin for the artifacts, packages and plan.
    fn estimate(payload: &BundlePayload) -> usize {
        const PER_FILE: usize = 256;
        const REST: usize = 32 * 1024;
        let files: usize = payload
            .files
            .iter()
            .map(|f| f.content.0.len().div_ceil(3) * 4 + f.path.as_str().len() + PER_FILE)
            .sum();
        files + REST
    }

    /// The whole payload's JSON with `identity` and `freshness` in front of the body.
    pub fn finish(
        &self,
        identity: &Identity,
        freshness: &Freshness,
    ) -> serde_json::Result<zeroize::Zeroizing<Vec<u8>>> {
        let head = serde_json::to_vec(&Head {
            identity,
            freshness,
        })?;
        // `{"identity":…,"freshness":…}` + `{"files":…}` → `{"identity":…,"freshness":…,"files":…}`
        let (Some((b'}', head)), Some((b'{', body))) = (head.split_last(), self.0.split_first())
        else {
            return Err(serde::ser::Error::custom(
                "a payload part is not a JSON object",
            ));
        };
        let mut out = Vec::with_capacity(head.len() + 1 + body.len());
        out.extend_from_slice(head);
        out.push(b',');
        out.extend_from_slice(body);
        Ok(zeroize::Zeroizing::new(out))
    }
}
