//! The template engine: every template embedded at build time, rendered with
//! `UndefinedBehavior::Strict` (a missing variable is an error, never an empty string), no
//! auto-escaping (none of our formats is HTML), and explicit quoting filters:
//!
//! * `q` — a JSON string literal, which is also a valid YAML double-quoted scalar and a TOML
//!   basic string: no value can break the document around it.
//! * `arg` — a systemd command-line word; refuses anything outside a conservative character set
//!   (no whitespace, quotes, `%` specifiers or `$` expansions) so rendering fails instead of
//!   producing a unit that runs something else.
//!
//! A rendering is a pure function of the template (compiled in) and its context, so outputs
//! are kept ([`Memo`]) by the SHA-256 of the template's name and the context's JSON: a node's
//! next bundle, and its peers', take most files from there. Templates that render a secret
//! opt out ([`Template::MEMO`]): a secret lives only as long as the bundle that carries it.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use minijinja::{AutoEscape, Environment, Error, ErrorKind, UndefinedBehavior};
use serde::Serialize;
use sha2::{Digest as _, Sha256};

/// A template and its declared inputs: implemented by exactly one context struct each.
pub(crate) trait Template: Serialize {
    /// The template's name (its file name under `templates/`).
    const NAME: &'static str;
    /// Whether its output may be kept for the next rendering of the same context: false for a
    /// template whose output carries a secret. No default: each template says.
    const MEMO: bool;
}

/// How many rendered outputs are kept: a node's own files (about eight) and those its cluster
/// or every cluster shares, ~2 KB each on average, so ~16 MB at most.
const MEMO_ENTRIES: NonZeroUsize = NonZeroUsize::new(8192).expect("8192 is not zero");

/// Rendered outputs by the digest of their template's name and context.
struct Memo(Mutex<lru::LruCache<[u8; 32], Arc<str>>>);

impl Memo {
    fn get(&self, key: &[u8; 32]) -> Option<Arc<str>> {
        let mut entries = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        entries.get(key).cloned()
    }

    fn put(&self, key: [u8; 32], output: Arc<str>) {
        let mut entries = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        entries.put(key, output);
    }
}

fn memo() -> &'static Memo {
    static MEMO: OnceLock<Memo> = OnceLock::new();
    MEMO.get_or_init(|| Memo(Mutex::new(lru::LruCache::new(MEMO_ENTRIES))))
}

/// The key a rendering is kept under: the SHA-256 of the template's name, a NUL, and the
/// context as JSON (every value the template can read, in field order). The JSON is written
/// into a buffer kept per thread and hashed in one call: serde writes it in many small pieces.
fn memo_key<T: Template>(ctx: &T) -> Result<[u8; 32], Error> {
    thread_local! {
        static JSON: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    JSON.with_borrow_mut(|json| {
        json.clear();
        json.extend_from_slice(T::NAME.as_bytes());
        json.push(0);
        serde_json::to_writer(&mut *json, ctx).map_err(|e| {
            Error::new(
                ErrorKind::BadSerialization,
                format!("the context of {} does not serialise: {e}", T::NAME),
            )
        })?;
        Ok(Sha256::digest(json.as_slice()).into())
    })
}

macro_rules! embedded {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../../templates/", $name)))),*]
    };
}

const TEMPLATES: &[(&str, &str)] = embedded![
    "cluster.env",
    "etcd.service",
    "etcd-bootstrap.env",
    "kubelet.service",
    "kubelet-config.yaml",
    "kube-apiserver.yaml",
    "kube-controller-manager.yaml",
    "kube-scheduler.yaml",
    "bridge-cni.conflist.tmpl",
    "cilium-values.yaml",
    "kube-proxy.yaml",
    "coredns.yaml",
    "flannel.yaml",
    "rbac.yaml",
    "encryption-config.yaml",
    "audit-policy.yaml",
    "containerd-config.toml",
    "kubernetes-sysctl.conf",
    "kubernetes-modules.conf",
    "container-scope-stop.conf",
    "exk8s-apiserver-balancer.socket",
    "exk8s-apiserver-balancer.service",
    "userdata.yaml",
];

fn quote(value: &str) -> String {
    // Serialising a &str to JSON cannot fail.
    serde_json::to_string(value).unwrap_or_else(|_| unreachable!("strings always serialise"))
}

fn systemd_arg(value: &str) -> Result<String, Error> {
    let safe = !value.is_empty()
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._:/,=@+-[]".contains(&b));
    if safe {
        Ok(value.to_owned())
    } else {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("`{}` is not a safe systemd argument", value.escape_debug()),
        ))
    }
}

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_keep_trailing_newline(true);
        env.add_filter("q", |v: String| quote(&v));
        env.add_filter("arg", |v: String| systemd_arg(&v));
        for (name, source) in TEMPLATES {
            // The templates are compiled into the binary and covered by tests: a syntax error
            // is a build defect, caught by every rendering test before it could ship.
            if let Err(e) = env.add_template(name, source) {
                panic!("embedded template {name} does not compile: {e:#}");
            }
        }
        env
    })
}

/// Renders `ctx` with its template, or gives the output kept from the same rendering.
pub(crate) fn render<T: Template>(ctx: &T) -> Result<String, Error> {
    if !T::MEMO {
        return render_now(ctx);
    }
    let key = memo_key(ctx)?;
    if let Some(kept) = memo().get(&key) {
        return Ok(kept.to_string());
    }
    let output = render_now(ctx)?;
    memo().put(key, Arc::from(output.as_str()));
    Ok(output)
}

fn render_now<T: Template>(ctx: &T) -> Result<String, Error> {
    environment().get_template(T::NAME)?.render(ctx)
}

/// What a static pod's context carries where its manifest names the digest of the files it
/// mounts: that digest changes with every bundle's fresh keys, so the manifest is rendered
/// (and kept) around this mark and the digest put in its place after
/// ([`render_static_pod`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct InputsSlot;

const INPUTS_SLOT: &str = "@exk8s-inputs-sha256@";

impl Serialize for InputsSlot {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(INPUTS_SLOT)
    }
}

/// What a static pod's context carries where its manifest names the pod's UID
/// (`metadata.uid`), filled last from everything else in the manifest ([`pod_uid`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct PodUidSlot;

const POD_UID_SLOT: &str = "@exk8s-pod-uid@";

impl Serialize for PodUidSlot {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(POD_UID_SLOT)
    }
}

/// Renders a static pod's `ctx`, puts `inputs_sha256` (hex) where its [`InputsSlot`] is and
/// then the pod's UID where its [`PodUidSlot`] is, each of which must be there exactly once.
pub(crate) fn render_static_pod<T: Template>(
    ctx: &T,
    inputs_sha256: &str,
) -> Result<String, Error> {
    let manifest = fill_slot(T::NAME, &render(ctx)?, INPUTS_SLOT, inputs_sha256)?;
    let uid = pod_uid(&manifest);
    fill_slot(T::NAME, &manifest, POD_UID_SLOT, &uid)
}

/// A static pod's UID, named by its manifest rather than left to the kubelet: a UUID (version
/// 8) from the SHA-256 of the manifest, whose text names its inputs' digest, so the same
/// manifest keeps its UID and any change makes a new one. Left to itself the kubelet derives
/// the UID from a hash of its own Go structure of the pod, which a new Kubernetes release
/// changes: an upgraded kubelet would replace every static pod at its restart — after the
/// agent's wait, while the next node is already being changed.
fn pod_uid(manifest: &str) -> String {
    let digest = Sha256::digest(manifest.as_bytes());
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_custom_bytes(bytes)
        .into_uuid()
        .hyphenated()
        .to_string()
}

/// `rendered` (of template `name`) with `value` in its one `slot`.
fn fill_slot(name: &str, rendered: &str, slot: &str, value: &str) -> Result<String, Error> {
    let mut places = rendered.match_indices(slot).map(|(at, _)| at);
    let (Some(at), None) = (places.next(), places.next()) else {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{name} must have exactly one {slot}"),
        ));
    };
    let rest = &rendered[at + slot.len()..];
    let mut filled = String::with_capacity(at + value.len() + rest.len());
    filled.push_str(&rendered[..at]);
    filled.push_str(value);
    filled.push_str(rest);
    Ok(filled)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Probe {
        value: String,
    }

    #[test]
    fn quoting_survives_hostile_values() {
        let q = quote("a: b # c\n\"d\"");
        let parsed: String = serde_json::from_str(&q).unwrap();
        assert_eq!(parsed, "a: b # c\n\"d\"");
    }

    #[test]
    fn systemd_args_refuse_whitespace_and_specifiers() {
        assert!(systemd_arg("--name=cp-1.cluster-42.internal").is_ok());
        assert!(systemd_arg("https://10.0.0.1:2379,https://127.0.0.1:2379").is_ok());
        for bad in ["a b", "%n", "$HOME", "a\"b", "", "a\nb", "a;b"] {
            assert!(systemd_arg(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn undefined_variables_are_errors() {
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.add_template("t", "{{ value }} {{ missing }}").unwrap();
        let err = env
            .get_template("t")
            .unwrap()
            .render(Probe { value: "x".into() })
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::UndefinedError);
    }

    /// A rendering is kept and given again for the same context, never for another one, and
    /// a template that renders a secret is never kept.
    #[test]
    fn renderings_are_kept_by_context_except_secrets() {
        use crate::render::contexts::{Encryption, EtcdBootstrap};
        let ctx = |token: &str| EtcdBootstrap {
            initial_cluster: "cp-1=https://10.0.0.1:2380",
            initial_cluster_state: "new",
            cluster_token: token.to_owned(),
        };
        let first = render(&ctx("exk8s-memo-1")).unwrap();
        assert_eq!(
            memo()
                .get(&memo_key(&ctx("exk8s-memo-1")).unwrap())
                .as_deref(),
            Some(first.as_str())
        );
        assert_eq!(render(&ctx("exk8s-memo-1")).unwrap(), first);
        let other = render(&ctx("exk8s-memo-2")).unwrap();
        assert!(other.contains("exk8s-memo-2") && !other.contains("exk8s-memo-1"));

        let secret = Encryption {
            key_name: "exk8s-1",
            key_base64: "c2VjcmV0LW5ldmVyLWtlcHQtc2VjcmV0LW5ldmVyLWs=",
        };
        let rendered = render(&secret).unwrap();
        assert!(rendered.contains(secret.key_base64));
        assert!(memo().get(&memo_key(&secret).unwrap()).is_none());
    }

    /// The digest lands where the slot was; a manifest naming it twice, or never, is refused.
    #[test]
    fn a_static_pods_digest_fills_its_one_slot() {
        let once = format!("a: \"{INPUTS_SLOT}\"\nb: c\n");
        assert_eq!(
            fill_slot("pod", &once, INPUTS_SLOT, "ab12").unwrap(),
            "a: \"ab12\"\nb: c\n"
        );
        for bad in [format!("{INPUTS_SLOT} {INPUTS_SLOT}"), "a: b".to_owned()] {
            let err = fill_slot("pod", &bad, INPUTS_SLOT, "ab12").unwrap_err();
            assert!(err.to_string().contains("exactly one"), "{err}");
        }
        assert_eq!(
            serde_json::to_string(&InputsSlot).unwrap(),
            format!("\"{INPUTS_SLOT}\"")
        );
    }

    /// A static pod's UID is a UUID the same manifest always gets, and any change to the
    /// manifest (its inputs' digest among it) gives another.
    #[test]
    fn a_static_pods_uid_follows_its_manifest() {
        use crate::render::contexts::Scheduler;
        use crate::render::paths::PATHS;
        let ctx = |image: &str| Scheduler {
            paths: &PATHS,
            image: image.to_owned(),
            inputs_sha256: InputsSlot,
            pod_uid: PodUidSlot,
            mounts: &[],
        };
        let uid_of = |manifest: &str| {
            let pod: yaml_serde::Value = yaml_serde::from_str(manifest).unwrap();
            let uid = pod["metadata"]["uid"].as_str().unwrap().to_owned();
            assert_eq!(uuid::Uuid::parse_str(&uid).unwrap().get_version_num(), 8);
            uid
        };
        let first =
            render_static_pod(&ctx("registry.k8s.io/kube-scheduler:v1.35.3"), "aa").unwrap();
        let again =
            render_static_pod(&ctx("registry.k8s.io/kube-scheduler:v1.35.3"), "aa").unwrap();
        assert_eq!(uid_of(&first), uid_of(&again));
        assert!(!first.contains(POD_UID_SLOT) && !first.contains(INPUTS_SLOT));
        let new_inputs =
            render_static_pod(&ctx("registry.k8s.io/kube-scheduler:v1.35.3"), "bb").unwrap();
        let new_image =
            render_static_pod(&ctx("registry.k8s.io/kube-scheduler:v1.36.3"), "aa").unwrap();
        assert_ne!(uid_of(&first), uid_of(&new_inputs));
        assert_ne!(uid_of(&first), uid_of(&new_image));
    }

    #[test]
    fn every_embedded_template_compiles() {
        let env = environment();
        for (name, _) in TEMPLATES {
            assert!(env.get_template(name).is_ok(), "{name}");
        }
    }
}
