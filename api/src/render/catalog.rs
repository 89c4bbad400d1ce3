//! The artifact catalog: where nodes download each binary, per artifact and version, and the
//! SHA-256 digest the download must have. `serve --artifact-catalog FILE` reads it once at start;
//! rendering puts an entry's URL and digest into every bundle that installs that artifact at
//! that version. Without an entry the upstream URL is used with no pinned digest, and the agent
//! requires a `<url>.sha256` beside the download (etcd's releases publish none, so a node that
//! was not pre-baked can install etcd only when the catalog pins it).
//!
//! ```toml
//! [[artifact]]
//! name = "etcd"        # etcd, etcdctl, etcdutl, kubelet, kubectl or helm
//! version = "v3.6.10"
//! url = "https://github.com/etcd-io/etcd/releases/download/v3.6.10/etcd-v3.6.10-linux-amd64.tar.gz"
//! sha256 = "<64 hex digits of the file at url>"
//! ```
//!
//! The digest is of the file the URL serves (the tarball for etcd, etcdctl, etcdutl and helm).
//! etcdctl and etcdutl come out of etcd's tarball: without an entry of their own, etcd's pins
//! them.

use std::collections::BTreeMap;

use exk8s_common::names::{ArtifactName, HttpUrl, Sha256Digest, Version};
use serde::Deserialize;

/// The artifacts a bundle may install; a catalog entry for another name is a typo.
pub const ARTIFACT_NAMES: &[&str] = &["etcd", "etcdctl", "etcdutl", "kubelet", "kubectl", "helm"];

/// One pinned download.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CatalogEntry {
    pub url: HttpUrl,
    pub sha256: Sha256Digest,
}

/// Pinned downloads by artifact and version. The default is empty: upstream URLs, digests from
/// `<url>.sha256`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ArtifactCatalog {
    entries: BTreeMap<(ArtifactName, Version), CatalogEntry>,
}

/// Why a catalog file was refused; names the entry and the field.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CatalogError {
    #[error("not a valid catalog: {0}")]
    Syntax(String),
    #[error("artifact #{index}: {field}: {reason}")]
    Entry {
        /// 1-based position in the file.
        index: usize,
        field: &'static str,
        reason: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    artifact: Vec<RawEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEntry {
    name: String,
    version: String,
    url: String,
    sha256: String,
}

impl ArtifactCatalog {
    /// Parses and checks a catalog file's text.
    pub fn parse(text: &str) -> Result<Self, CatalogError> {
        let file: File = toml::from_str(text).map_err(|e| {
            CatalogError::Syntax(e.to_string().chars().take(500).collect::<String>())
        })?;
        let mut entries = BTreeMap::new();
        for (i, raw) in file.artifact.into_iter().enumerate() {
            let index = i + 1;
            let bad = |field, reason: String| CatalogError::Entry {
                index,
                field,
                reason,
            };
            if !ARTIFACT_NAMES.contains(&raw.name.as_str()) {
                return Err(bad(
                    "name",
                    format!(
                        "`{}` is not an artifact a bundle installs (one of {})",
                        raw.name.chars().take(40).collect::<String>(),
                        ARTIFACT_NAMES.join(", ")
                    ),
                ));
            }
            let name = ArtifactName::new(&raw.name).map_err(|e| bad("name", e.to_string()))?;
            let version = Version::new(&raw.version).map_err(|e| bad("version", e.to_string()))?;
            let url = HttpUrl::new(&raw.url).map_err(|e| bad("url", e.to_string()))?;
            let sha256 = parse_digest(&raw.sha256).map_err(|reason| bad("sha256", reason))?;
            let key = (name, version);
            if entries.contains_key(&key) {
                return Err(bad(
                    "version",
                    format!("{} {} is listed twice", key.0, key.1),
                ));
            }
            entries.insert(key, CatalogEntry { url, sha256 });
        }
        Ok(Self { entries })
    }

    /// The pinned download of `name` at `version`, if the catalog has one.
    pub fn get(&self, name: &ArtifactName, version: &Version) -> Option<&CatalogEntry> {
        self.entries.get(&(name.clone(), version.clone()))
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

fn parse_digest(text: &str) -> Result<Sha256Digest, String> {
    let well_formed = text.len() == 64 && text.bytes().all(|b| b.is_ascii_hexdigit());
    if !well_formed {
        return Err("must be 64 hexadecimal digits (the SHA-256 of the file at url)".into());
    }
    text.to_ascii_lowercase()
        .parse()
        .map_err(|_| "must be 64 hexadecimal digits (the SHA-256 of the file at url)".into())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    const DIGEST: &str = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

    fn entry(name: &str, version: &str, url: &str, sha256: &str) -> String {
        format!(
            "[[artifact]]\nname = \"{name}\"\nversion = \"{version}\"\nurl = \"{url}\"\nsha256 = \"{sha256}\"\n"
        )
    }

    #[test]
    fn entries_are_found_by_name_and_version() {
        let text = entry("etcd", "v3.6.10", "https://mirror.example/etcd.tgz", DIGEST)
            + &entry(
                "etcd",
                "v3.6.11",
                "https://mirror.example/etcd-11.tgz",
                DIGEST,
            );
        let catalog = ArtifactCatalog::parse(&text).unwrap();
        assert_eq!(catalog.len(), 2);
        let found = catalog
            .get(&"etcd".parse().unwrap(), &"v3.6.10".parse().unwrap())
            .unwrap();
        assert_eq!(found.url.as_str(), "https://mirror.example/etcd.tgz");
        assert_eq!(found.sha256.to_hex(), DIGEST);
        assert!(
            catalog
                .get(&"etcd".parse().unwrap(), &"v3.6.9".parse().unwrap())
                .is_none()
        );
        assert!(ArtifactCatalog::parse("").unwrap().is_empty());
    }

    #[test]
    fn every_bad_entry_is_refused_naming_entry_and_field() {
        let url = "https://mirror.example/x";
        let cases = [
            (entry("etcdd", "v3.6.10", url, DIGEST), "artifact #1: name"),
            (entry("etcd", "--set", url, DIGEST), "artifact #1: version"),
            (
                entry("etcd", "v3.6.10", "file:///x", DIGEST),
                "artifact #1: url",
            ),
            (entry("etcd", "v3.6.10", url, "abc"), "artifact #1: sha256"),
            (
                entry("etcd", "v3.6.10", url, &"g".repeat(64)),
                "artifact #1: sha256",
            ),
            (
                entry("kubelet", "v1.35.3", url, DIGEST)
                    + &entry("kubelet", "v1.35.3", url, DIGEST),
                "artifact #2: version",
            ),
            (
                entry("etcd", "v3.6.10", url, DIGEST).replace("sha256", "digest"),
                "not a valid catalog",
            ),
            (
                "[[artifact]]\nname = \"etcd\"\n".into(),
                "not a valid catalog",
            ),
            ("artifact = 3".into(), "not a valid catalog"),
        ];
        for (text, expected) in cases {
            let error = ArtifactCatalog::parse(&text).unwrap_err().to_string();
            assert!(error.starts_with(expected), "{text}\n→ {error}");
        }
    }
}
