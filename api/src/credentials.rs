//! Operators' short-lived credentials, for client-go's exec credential plugin (`exk8s
//! credential`): a client certificate of the cluster's admin identity that lives [`LIFETIME`]
//! (at most the cluster's leaf lifetime), minted on request and recorded in the inventory, and
//! what a client must trust to reach the cluster's apiservers now (the cluster CA, the one
//! beside it while that CA is rotated, and the standby made for its next rotation). A client that fetches the trust before each use and a
//! new certificate when its own nears its end or its issuer is no longer trusted never needs an
//! operator through a leaf's life or a rotation of the cluster CA.

use std::sync::Arc;

use time::OffsetDateTime;

use crate::certificates::{self, CertificatesError, Certifier, Issued, OPERATOR_CREDENTIAL};
use crate::db::{self, certificates::CertKind, clusters::ClusterRow};
use crate::pki::{ClientIdentity, SecretPem};

/// How long a minted credential lives.
pub const LIFETIME: time::Duration = time::Duration::hours(8);

/// What a client of the cluster's apiservers trusts now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trust {
    /// `https://<control-plane DNS name>:6443`.
    pub server: String,
    /// The cluster CA, the other one while it is rotated, and the standby for its next
    /// rotation (PEM).
    pub certificate_authority_pem: String,
}

/// A minted credential.
#[derive(Debug)]
pub struct Minted {
    pub certificate_pem: String,
    pub key_pem: SecretPem,
    /// The CA certificate that signed it (one of `trust`'s while it is trusted).
    pub issuer_pem: String,
    pub not_after: OffsetDateTime,
    pub trust: Trust,
}

/// What a client of founded cluster `row` trusts now.
pub async fn trust(ctx: &Certifier, row: &ClusterRow) -> Result<Trust, CertificatesError> {
    let rotation = db::rotations::get(&ctx.db.pool, row.id).await?;
    let standby = db::standby::get(&ctx.db.pool, row.id).await?;
    let pki = ctx.issuers.open(&ctx.keks, row)?;
    Ok(Trust {
        server: server(row),
        certificate_authority_pem: crate::trust::operator_bundle(
            pki.cluster_ca.cert_pem(),
            rotation.as_ref(),
            standby.as_ref().map(|s| s.cert.as_str()),
        ),
    })
}

/// Mints a credential of the admin identity for founded cluster `row`, recorded in its
/// inventory.
pub async fn mint(ctx: &Certifier, row: ClusterRow) -> Result<Minted, CertificatesError> {
    let trust = trust(ctx, &row).await?;
    let (keks, issuers) = (Arc::clone(&ctx.keks), Arc::clone(&ctx.issuers));
    let now = ctx.clock.now();
    let cluster_id = row.id;
    // Minting the client key is CPU work (seconds for RSA-4096): the pool.
    let (cert, issuer_pem, facts) = ctx
        .cpu
        .run(move || {
            let pki = issuers.open(&keks, &row)?;
            let identity = ClientIdentity::Admin;
            let cert = pki
                .ca(identity.signer())
                .issue_short(&identity.spec(), now, LIFETIME)?;
            let facts = cert.facts()?;
            let issuer = pki.ca(identity.signer()).cert_pem().to_owned();
            Ok::<_, CertificatesError>((cert, issuer, facts))
        })
        .await??;
    let recorded = Issued {
        name: OPERATOR_CREDENTIAL,
        kind: CertKind::Client,
        pem: &cert.cert_pem,
        minted: cert.minted.as_ref(),
    };
    let mut tx = ctx.db.begin().await?;
    certificates::record_read(
        &mut tx,
        cluster_id,
        None,
        &[recorded],
        std::slice::from_ref(&facts),
        now.unix_timestamp(),
    )
    .await?;
    tx.commit().await?;
    Ok(Minted {
        not_after: OffsetDateTime::from_unix_timestamp(facts.not_after)
            .map_err(|e| CertificatesError::Pki(crate::pki::PkiError::Unreadable(e.to_string())))?,
        certificate_pem: cert.cert_pem,
        key_pem: cert.key_pem,
        issuer_pem,
        trust,
    })
}

fn server(row: &ClusterRow) -> String {
    format!("https://{}:6443", row.control_plane_dns_name)
}
