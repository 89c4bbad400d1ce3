//! An object's exk8s credentials: the Secret its `credentialsRef` names, in its namespace, with
//! `url`, `token` and optionally `ca.crt`. Every problem with it is named (never its token).

use k8s_openapi::api::core::v1::Secret;
use kube::{Api, Client};

use crate::crd::CredentialsRef;
use crate::exk8s::{Exk8s, Exk8sError};

/// Why an object's credentials cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("the Secret {namespace}/{name} (credentialsRef) does not exist")]
    Missing { namespace: String, name: String },
    #[error("the Secret {namespace}/{name} (credentialsRef) has no {key:?}")]
    NoKey {
        namespace: String,
        name: String,
        key: &'static str,
    },
    #[error("reading the Secret {namespace}/{name} (credentialsRef): {source}")]
    Read {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error("the Secret {namespace}/{name} (credentialsRef): {source}")]
    Unusable {
        namespace: String,
        name: String,
        source: Exk8sError,
    },
}

/// The exk8s client `reference` in `namespace` makes.
pub async fn client(
    kube: &Client,
    namespace: &str,
    reference: &CredentialsRef,
) -> Result<Exk8s, CredentialsError> {
    let name = reference.name.clone();
    let secret = Api::<Secret>::namespaced(kube.clone(), namespace)
        .get_opt(&name)
        .await
        .map_err(|source| CredentialsError::Read {
            namespace: namespace.to_owned(),
            name: name.clone(),
            source,
        })?
        .ok_or_else(|| CredentialsError::Missing {
            namespace: namespace.to_owned(),
            name: name.clone(),
        })?;
    let data = secret.data.unwrap_or_default();
    let text = |key: &'static str| {
        data.get(key)
            .and_then(|v| std::str::from_utf8(&v.0).ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| CredentialsError::NoKey {
                namespace: namespace.to_owned(),
                name: name.clone(),
                key,
            })
    };
    let (url, token) = (text("url")?, text("token")?);
    let ca = data.get("ca.crt").map(|v| v.0.as_slice());
    Exk8s::new(url, token, ca).map_err(|source| CredentialsError::Unusable {
        namespace: namespace.to_owned(),
        name: name.clone(),
        source,
    })
}
