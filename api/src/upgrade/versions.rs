//! What this API can install: each Kubernetes release it offers (`--kubernetes-versions`, the
//! first the default), with the versions of everything a node runs beside it and where each
//! download comes from — pinned by the artifact catalog, or upstream with its published digest.

use exk8s_common::names::Version;
use exk8s_common::payload::Artifact;

use crate::render::{ArtifactCatalog, RenderError, Versions, downloads};

/// One Kubernetes release this API installs.
#[derive(Debug, Clone)]
pub struct Offered {
    pub versions: Versions,
    /// New clusters get it when they ask for none.
    pub default: bool,
    pub downloads: Vec<Artifact>,
}

/// Every release in `kubernetes` (the configured allow-list), in its order.
pub fn offered(
    kubernetes: &[String],
    catalog: &ArtifactCatalog,
) -> Result<Vec<Offered>, RenderError> {
    kubernetes
        .iter()
        .enumerate()
        .map(|(i, release)| {
            let versions = Versions::of(
                Version::new(release.as_str())
                    .map_err(|e| RenderError::InvalidValue(e.to_string()))?,
            );
            Ok(Offered {
                downloads: downloads(&versions, catalog)?,
                versions,
                default: i == 0,
            })
        })
        .collect()
}
