//! Absolute paths a bundle may write: normalised, under an allow-list, no `..`, no `.`, no empty
//! component. Symlinks cannot be judged from text; the agent checks those on disk.

use std::fmt;
use std::marker::PhantomData;

use super::shown;

/// Longest path accepted (Linux `PATH_MAX` is 4096 including the NUL).
const MAX_PATH_BYTES: usize = 4095;
/// Longest single component (Linux `NAME_MAX`).
const MAX_COMPONENT_BYTES: usize = 255;

/// Why a path was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("path is empty")]
    Empty,
    #[error("path `{0}` is not absolute")]
    NotAbsolute(String),
    #[error("path is longer than {MAX_PATH_BYTES} bytes")]
    TooLong,
    #[error("path `{0}` contains a control character")]
    ControlCharacter(String),
    #[error("path `{0}` has an empty component (`//` or a trailing `/`)")]
    EmptyComponent(String),
    #[error("path `{0}` has a `.` component")]
    DotComponent(String),
    #[error("path `{0}` has a `..` component (path traversal)")]
    ParentComponent(String),
    #[error("path `{0}` has a component longer than {MAX_COMPONENT_BYTES} bytes")]
    ComponentTooLong(String),
    #[error("path `{path}` is not inside any of {allowed}")]
    OutsideAllowList { path: String, allowed: String },
}

/// A set of directories paths must live under.
pub trait AllowList {
    /// Absolute, normalised directories; a path must be strictly inside one of them.
    const ROOTS: &'static [&'static str];
}

/// Where bundle files may be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FileRoots {}
impl AllowList for FileRoots {
    const ROOTS: &'static [&'static str] = &[
        "/etc/exk8s",
        "/etc/kubernetes",
        "/etc/systemd/system",
        "/var/lib/kubelet",
        "/etc/cni/net.d",
        "/etc/containerd",
        // The kernel parameters and modules a node needs (kubeadm's preflight checks them).
        "/etc/sysctl.d",
        "/etc/modules-load.d",
    ];
}

/// Where downloaded artifacts (binaries) may be installed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ArtifactRoots {}
impl AllowList for ArtifactRoots {
    /// `/opt/exk8s/kubernetes` and `/opt/exk8s/etcd` hold each release's binaries side by side
    /// (`<version>/kubelet`, `<version>/etcd`), so an update can be undone by pointing back at
    /// the old ones.
    const ROOTS: &'static [&'static str] = &[
        "/usr/local/bin",
        "/opt/cni/bin",
        "/opt/exk8s/kubernetes",
        "/opt/exk8s/etcd",
    ];
}

/// A validated absolute path strictly inside one of `L::ROOTS`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AllowedPath<L: AllowList> {
    path: String,
    allow_list: PhantomData<L>,
}

/// A path a bundle file may be written to.
pub type BundlePath = AllowedPath<FileRoots>;
/// A path an artifact may be installed to.
pub type ArtifactDest = AllowedPath<ArtifactRoots>;

impl<L: AllowList> AllowedPath<L> {
    pub fn new(path: impl Into<String>) -> Result<Self, PathError> {
        let path = path.into();
        validate::<L>(&path)?;
        Ok(Self {
            path,
            allow_list: PhantomData,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.path
    }

    /// The components after the leading `/`, each non-empty, never `.` or `..`.
    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.path[1..].split('/')
    }

    /// The path without its leading `/`, for joining under a root directory.
    pub fn relative(&self) -> &str {
        &self.path[1..]
    }

    /// The final component.
    pub fn file_name(&self) -> &str {
        self.components().last().unwrap_or_default()
    }

    /// The directory holding this path (always `/`-rooted, never empty).
    pub fn parent(&self) -> &str {
        match self.path.rfind('/') {
            Some(0) | None => "/",
            Some(i) => &self.path[..i],
        }
    }
}

fn validate<L: AllowList>(path: &str) -> Result<(), PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong);
    }
    if path.chars().any(char::is_control) {
        return Err(PathError::ControlCharacter(shown(path)));
    }
    let Some(rest) = path.strip_prefix('/') else {
        return Err(PathError::NotAbsolute(shown(path)));
    };
    for component in rest.split('/') {
        match component {
            "" => return Err(PathError::EmptyComponent(shown(path))),
            "." => return Err(PathError::DotComponent(shown(path))),
            ".." => return Err(PathError::ParentComponent(shown(path))),
            c if c.len() > MAX_COMPONENT_BYTES => {
                return Err(PathError::ComponentTooLong(shown(path)));
            }
            _ => {}
        }
    }
    let inside = |root: &&str| {
        path.strip_prefix(root)
            .is_some_and(|tail| tail.starts_with('/') && tail.len() > 1)
    };
    if !L::ROOTS.iter().any(inside) {
        return Err(PathError::OutsideAllowList {
            path: shown(path),
            allowed: L::ROOTS.join(", "),
        });
    }
    Ok(())
}

impl<L: AllowList> fmt::Display for AllowedPath<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.path)
    }
}

impl<L: AllowList> fmt::Debug for AllowedPath<L> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.path, f)
    }
}

impl<L: AllowList> std::str::FromStr for AllowedPath<L> {
    type Err = PathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl<L: AllowList> serde::Serialize for AllowedPath<L> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.path)
    }
}

impl<'de, L: AllowList> serde::Deserialize<'de> for AllowedPath<L> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(d)?;
        Self::new(raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_files_strictly_inside_the_allow_list() {
        for ok in [
            "/etc/exk8s/pki/ca.pem",
            "/etc/kubernetes/manifests/kube-apiserver.yaml",
            "/etc/systemd/system/etcd.service",
            "/var/lib/kubelet/config.yaml",
            "/etc/cni/net.d/10-exk8s.conflist",
            "/etc/containerd/config.toml",
            "/etc/containerd/bridge-cni.conflist.tmpl",
        ] {
            let p = BundlePath::new(ok).unwrap();
            assert_eq!(p.as_str(), ok);
        }
        let p = BundlePath::new("/etc/exk8s/pki/ca.pem").unwrap();
        assert_eq!(p.parent(), "/etc/exk8s/pki");
        assert_eq!(p.file_name(), "ca.pem");
        assert_eq!(p.relative(), "etc/exk8s/pki/ca.pem");
    }

    #[test]
    fn refuses_each_kind_of_bad_path() {
        use PathError::*;
        type Case = (&'static str, fn(&PathError) -> bool);
        let cases: &[Case] = &[
            ("", |e| matches!(e, Empty)),
            ("etc/exk8s/a", |e| matches!(e, NotAbsolute(_))),
            ("/etc/exk8s/../shadow", |e| matches!(e, ParentComponent(_))),
            ("/etc/exk8s/./a", |e| matches!(e, DotComponent(_))),
            ("/etc/exk8s//a", |e| matches!(e, EmptyComponent(_))),
            ("/etc/exk8s/a/", |e| matches!(e, EmptyComponent(_))),
            ("/etc/exk8s/a\nb", |e| matches!(e, ControlCharacter(_))),
            ("/etc/exk8s/a\0b", |e| matches!(e, ControlCharacter(_))),
            ("/etc/shadow", |e| matches!(e, OutsideAllowList { .. })),
            ("/etc/exk8sevil/a", |e| matches!(e, OutsideAllowList { .. })),
            ("/etc/exk8s", |e| matches!(e, OutsideAllowList { .. })),
            ("/usr/local/bin/etcd", |e| {
                matches!(e, OutsideAllowList { .. })
            }),
        ];
        for (input, expected) in cases {
            let err = BundlePath::new(*input).unwrap_err();
            assert!(expected(&err), "{input:?} gave {err:?}");
        }
        let long = format!("/etc/exk8s/{}", "a".repeat(256));
        assert!(matches!(BundlePath::new(long), Err(ComponentTooLong(_))));
        let huge = format!("/etc/exk8s/{}", "a/".repeat(3000));
        assert!(matches!(BundlePath::new(huge), Err(TooLong)));
    }

    #[test]
    fn artifact_destinations_have_their_own_allow_list() {
        assert!(ArtifactDest::new("/usr/local/bin/etcd").is_ok());
        assert!(ArtifactDest::new("/opt/exk8s/kubernetes/v1.36.3/kubelet").is_ok());
        assert!(ArtifactDest::new("/opt/exk8s/etcd/v3.6.14/etcd").is_ok());
        assert!(ArtifactDest::new("/opt/exk8s/kubernetes/../../etc/x").is_err());
        assert!(ArtifactDest::new("/etc/exk8s/etcd").is_err());
        assert!(ArtifactDest::new("/usr/local/bin/../sbin/x").is_err());
    }

    #[test]
    fn error_messages_escape_and_bound_untrusted_input() {
        let evil = format!("/tmp/{}\u{1b}[31m", "x".repeat(500));
        let msg = BundlePath::new(evil).unwrap_err().to_string();
        assert!(!msg.contains('\u{1b}'));
        assert!(msg.len() < 300, "{msg}");
    }
}
