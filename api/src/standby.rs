//! The cluster CA's standby: a CA made ahead of the cluster CA's next rotation. What operators'
//! clients trust carries it beside the CA in use ([`crate::trust::operator_bundle`]), so a
//! client whose trust file was written before a rotation still verifies the apiservers'
//! certificates the rotation brings — kubectl reads the CA file its kubeconfig names before its
//! exec credential plugin (`exk8s credential`) can write a newer one. A rotation of the cluster
//! CA takes the standby as its new CA ([`crate::rotation::start`]), and a new standby is made
//! when the rotation ends. Its key is sealed under the KEK like every CA key; it signs nothing
//! until a rotation makes it the cluster's CA, and never leaves the API.

use time::OffsetDateTime;

use crate::crypto::{Keyring, SealError};
use crate::db::standby::Standby;
use crate::pki::{CaRole, CertAuthority, KeyAlgorithm, PkiError, SecretPem};
use crate::trust::cluster_aad;

/// The name a standby's key is sealed under (in its associated data).
const KEY_COLUMN: &str = "standby_ca_key";

#[derive(Debug, thiserror::Error)]
pub enum StandbyError {
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error("sealing or opening the standby CA key")]
    Seal(#[from] SealError),
}

/// Makes a standby cluster CA for cluster `cluster_id`, its key sealed. CPU work (an RSA key
/// takes up to seconds): run it on the CPU pool.
pub fn make(
    keks: &Keyring,
    cluster_id: i64,
    algorithm: KeyAlgorithm,
    now: OffsetDateTime,
) -> Result<Standby, StandbyError> {
    let ca = CertAuthority::generate(CaRole::Cluster, algorithm, now)?;
    let key_sealed = keks.seal(
        &cluster_aad(cluster_id, KEY_COLUMN),
        ca.key_pem().expose().as_bytes(),
    )?;
    Ok(Standby {
        cert: ca.cert_pem().to_owned(),
        key_sealed,
    })
}

/// Cluster `cluster_id`'s `standby` as a CA issuing `algorithm` leaves: its key opened and
/// checked to be its certificate's.
pub fn open(
    keks: &Keyring,
    cluster_id: i64,
    standby: &Standby,
    algorithm: KeyAlgorithm,
) -> Result<CertAuthority, StandbyError> {
    let key = keks.open_text(&cluster_aad(cluster_id, KEY_COLUMN), &standby.key_sealed)?;
    Ok(CertAuthority::from_pem(
        CaRole::Cluster,
        &standby.cert,
        SecretPem::new(key.to_string()),
        algorithm,
    )?)
}

/// Cluster `from`'s `standby`, its key sealed anew for cluster `to` (a cluster founded from
/// `from`'s snapshot keeps its CAs, and so its standby).
pub fn reseal(
    keks: &Keyring,
    from: i64,
    to: i64,
    standby: &Standby,
) -> Result<Standby, StandbyError> {
    let key = keks.open_text(&cluster_aad(from, KEY_COLUMN), &standby.key_sealed)?;
    Ok(Standby {
        cert: standby.cert.clone(),
        key_sealed: keks.seal(&cluster_aad(to, KEY_COLUMN), key.as_bytes())?,
    })
}
