//! The CAs an operator brings to `POST /clusters` (`certificate_authorities`): each one is
//! checked by [`crate::pki::import`] before anything is created, and a refusal is a 422 naming
//! the field (`certificate_authorities.<role>.cert_pem` or `.key_pem`) and the reason.

use super::FoundingError;
use super::request::{SuppliedCaRequest, SuppliedCasRequest};
use crate::pki::{
    CaPart, CaRole, CertAuthority, ImportError, ImportTerms, SuppliedCa, SuppliedCas,
    check_distinct, import,
};

/// Checks every supplied CA; none supplied is no CA imported.
pub fn check(
    request: Option<&SuppliedCasRequest>,
    terms: ImportTerms,
) -> Result<SuppliedCas, FoundingError> {
    let Some(request) = request else {
        return Ok(SuppliedCas::default());
    };
    if request.cluster.is_none() && request.etcd.is_none() && request.front_proxy.is_none() {
        return Err(FoundingError::Unprocessable {
            field: Some("certificate_authorities"),
            message: "certificate_authorities names no CA: give at least one of cluster, etcd, \
                      front_proxy, or leave it out"
                .into(),
        });
    }
    let one = |role: CaRole, given: &Option<SuppliedCaRequest>| {
        given
            .as_ref()
            .map(|ca| {
                let supplied = SuppliedCa {
                    cert_pem: ca.cert_pem.as_deref(),
                    key_pem: ca.key_pem.as_ref(),
                };
                import(role, &supplied, terms).map_err(refused)
            })
            .transpose()
    };
    let supplied = SuppliedCas {
        cluster: one(CaRole::Cluster, &request.cluster)?,
        etcd: one(CaRole::Etcd, &request.etcd)?,
        front_proxy: one(CaRole::FrontProxy, &request.front_proxy)?,
    };
    let given: Vec<&CertAuthority> = [&supplied.cluster, &supplied.etcd, &supplied.front_proxy]
        .into_iter()
        .flatten()
        .collect();
    check_distinct(&given).map_err(refused)?;
    Ok(supplied)
}

fn refused(e: ImportError) -> FoundingError {
    FoundingError::Unprocessable {
        field: Some(field(e.role, e.part)),
        message: format!("{}: {e}", field(e.role, e.part)),
    }
}

/// The request field a refusal is about.
pub fn field(role: CaRole, part: CaPart) -> &'static str {
    match (role, part) {
        (CaRole::Cluster, CaPart::Certificate) => "certificate_authorities.cluster.cert_pem",
        (CaRole::Cluster, CaPart::Key) => "certificate_authorities.cluster.key_pem",
        (CaRole::Etcd, CaPart::Certificate) => "certificate_authorities.etcd.cert_pem",
        (CaRole::Etcd, CaPart::Key) => "certificate_authorities.etcd.key_pem",
        (CaRole::FrontProxy, CaPart::Certificate) => "certificate_authorities.front_proxy.cert_pem",
        (CaRole::FrontProxy, CaPart::Key) => "certificate_authorities.front_proxy.key_pem",
    }
}
