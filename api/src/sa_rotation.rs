//! Service-account signing key rotation, Kubernetes' own procedure, each phase delivered to
//! every control-plane node (one at a time, through the rollout gate) before the next
//! (`POST /clusters/{id}/certificates/rotate-sa-key`, or the reconciler once a key that asked
//! for it is past its maximum age):
//!
//! 1. **trust-both** — a new key pair is made (its private half sealed, waiting); every
//!    apiserver's `--service-account-key-file` carries the old and the new public key; the old
//!    key still signs (`--service-account-signing-key-file`, and the controller-manager's
//!    `--service-account-private-key-file` for legacy token Secrets).
//! 2. **sign-new** — once every control-plane node applied that: the new key is the cluster's
//!    and signs; the old public key is still trusted, so every token signed before keeps
//!    authenticating. Once every node applied it, the clock starts: tokens are refreshed by
//!    their kubelets within `drop_old_after` (default 25 h: a kubelet renews a projected token
//!    past 80 % of its life or 24 h, whichever comes first).
//! 3. **drop-old** — `drop_old_after` later: only the new public key is trusted. Tokens signed
//!    by the old key (a leaked key's, a legacy token Secret's) no longer authenticate.
//!
//! Then the rotation ends. Workers carry no service-account key: only control-plane nodes take
//! new generations. [`advance`] moves a rotation on; a node's report and the reconciler call it.

use exk8s_common::contract::Role;

use crate::db::phase::{ClusterPhase, EtcdMembership};
use crate::db::rotations::RotationPhase;
use crate::db::sa_rotations::SaRotation;
use crate::db::{self, DbError};
use crate::pki::{PkiError, SecretPem, ServiceAccountKey};
use crate::rotation::Rotator;
use crate::trust::{self, cluster_aad};

/// How long the old public key stays trusted after every apiserver signs with the new one
/// when the request does not say: a kubelet refreshes every projected token within 24 h.
pub const DEFAULT_DROP_OLD_AFTER: i64 = 25 * 3600;
/// The longest wait a request may ask for.
pub const MAX_DROP_OLD_AFTER: i64 = 30 * 86_400;

/// The column a waiting new key is sealed under.
const NEW_KEY: &str = "sa_rotation_key";
/// The column the cluster's own key is sealed under (see [`crate::trust`]).
const KEY: &str = "sa_key";

/// Why a rotation could not start or move on.
#[derive(Debug, thiserror::Error)]
pub enum SaRotationError {
    #[error("cluster not found")]
    NotFound,
    #[error("cluster {id} is {phase}; only a founded cluster's service-account key can be rotated")]
    NotFounded { id: i64, phase: ClusterPhase },
    #[error(
        "the service-account key of this cluster is being rotated (phase {0}); one rotation at a time"
    )]
    InProgress(RotationPhase),
    /// Another change runs: it says which.
    #[error("{0}")]
    Blocked(String),
    #[error("drop_old_after_seconds must be between 0 and {MAX_DROP_OLD_AFTER} (30 days), got {0}")]
    DropOldAfter(i64),
    #[error("max_age_days must be between 1 and 3650, got {0}")]
    MaxAge(i64),
    #[error(transparent)]
    Db(#[from] DbError),
    #[error(transparent)]
    Trust(#[from] trust::TrustError),
    #[error(transparent)]
    Pki(#[from] PkiError),
    #[error(transparent)]
    Cpu(#[from] crate::cpu::CpuError),
    #[error("sealing the new service-account key")]
    Seal(#[from] crate::crypto::SealError),
}

/// A rotation started: its phase, the wait before the old key goes, and each control-plane
/// node's new desired generation (VM id, generation).
#[derive(Debug, Clone)]
pub struct Started {
    pub cluster_id: i64,
    pub phase: RotationPhase,
    pub drop_old_after: i64,
    pub nodes: Vec<(i64, i64)>,
}

/// What every apiserver verifies tokens with: the cluster's public key (`own`, PEM), and the
/// other one while `rotation` is in trust-both or sign-new.
pub fn public_keys(own: &str, rotation: Option<&SaRotation>) -> String {
    let mut pem = own.to_owned();
    if let Some(SaRotation {
        other_public: Some(other),
        phase: RotationPhase::TrustBoth | RotationPhase::SignNew,
        ..
    }) = rotation
    {
        if !pem.ends_with('\n') {
            pem.push('\n');
        }
        pem.push_str(other);
    }
    pem
}

/// Why a cluster founded from `source`'s snapshot now would not carry its service-account
/// trust whole, given `source`'s rotation in progress; `None` when it would. The founding copies
/// the source's own key: whole in trust-both (the waiting key has signed nothing) and in
/// drop-old (only the new key is trusted), but in sign-new the old key's tokens (in the
/// snapshot's Secrets, or held by clients) still verify at the source and would not in the new
/// cluster, so the founding waits for the source's drop-old.
pub fn not_carried_whole(source: i64, rotation: Option<&SaRotation>) -> Option<String> {
    let rotation = rotation.filter(|r| r.phase == RotationPhase::SignNew)?;
    let until = match rotation.drop_old_at() {
        Some(at) => time::OffsetDateTime::from_unix_timestamp(at)
            .ok()
            .and_then(|t| {
                t.format(&time::format_description::well_known::Rfc3339)
                    .ok()
            })
            .unwrap_or_else(|| format!("unix time {at}")),
        None => format!(
            "{} s after every one of its control-plane nodes signs with the new key",
            rotation.drop_old_after
        ),
    };
    Some(format!(
        "cluster {source} is rotating its service-account key (phase sign-new): tokens its old \
         key signed verify there until {until}, and a cluster founded from its snapshot now \
         would trust only the new key; found it once the old key is dropped"
    ))
}

/// Starts rotating the service-account key of `org_id`'s cluster `cluster_id`; the old key
/// stays trusted `drop_old_after` seconds (default [`DEFAULT_DROP_OLD_AFTER`]) after every
/// apiserver signs with the new one.
pub async fn start(
    ctx: &Rotator,
    org_id: i64,
    cluster_id: i64,
    drop_old_after: Option<i64>,
) -> Result<Started, SaRotationError> {
    let drop_old_after = drop_old_after.unwrap_or(DEFAULT_DROP_OLD_AFTER);
    if !(0..=MAX_DROP_OLD_AFTER).contains(&drop_old_after) {
        return Err(SaRotationError::DropOldAfter(drop_old_after));
    }
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(SaRotationError::NotFound)?;
    start_for(ctx, &cluster, drop_old_after).await
}

async fn start_for(
    ctx: &Rotator,
    cluster: &db::clusters::ClusterRow,
    drop_old_after: i64,
) -> Result<Started, SaRotationError> {
    let cluster_id = cluster.id;
    if cluster.phase != ClusterPhase::Founded {
        return Err(SaRotationError::NotFounded {
            id: cluster_id,
            phase: cluster.phase,
        });
    }
    if let Some(current) = db::sa_rotations::get(&ctx.db.pool, cluster_id).await? {
        return Err(SaRotationError::InProgress(current.phase));
    }
    let then = "rotate the service-account key after it";
    if let Some(why) = db::rotations::refusal(&ctx.db.pool, cluster_id, then).await? {
        return Err(SaRotationError::Blocked(why));
    }
    if let Some(why) = db::restores::refusal(&ctx.db.pool, cluster_id, then).await? {
        return Err(SaRotationError::Blocked(why));
    }
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id).await?;
    if let Some(why) = other_change(cluster, &nodes) {
        return Err(SaRotationError::Blocked(why));
    }
    let algorithm = ctx.issuers.open(&ctx.keks, cluster)?.algorithm;
    let new = ctx
        .cpu
        .run(move || ServiceAccountKey::generate(algorithm))
        .await??;
    let sealed = ctx.keks.seal(
        &cluster_aad(cluster_id, NEW_KEY),
        new.private_pem.expose().as_bytes(),
    )?;
    let now = ctx.clock.unix();
    let mut tx = ctx.db.begin().await?;
    if !db::sa_rotations::insert(
        &mut tx,
        cluster_id,
        &new.public_pem,
        &sealed,
        drop_old_after,
        now,
    )
    .await?
    {
        drop(tx);
        let current = db::sa_rotations::get(&ctx.db.pool, cluster_id).await?;
        return Err(current.map_or(SaRotationError::NotFound, |c| {
            SaRotationError::InProgress(c.phase)
        }));
    }
    db::nodes::bump_role_generations(&mut tx, cluster_id, Role::ControlPlane).await?;
    tx.commit().await?;
    tracing::info!(
        cluster_id,
        drop_old_after,
        "service-account key rotation started: trust-both"
    );
    let nodes = db::nodes::list(&ctx.db.pool, cluster_id)
        .await?
        .into_iter()
        .filter(|n| n.role == Role::ControlPlane)
        .map(|n| (n.vm_id, n.desired_generation))
        .collect();
    Ok(Started {
        cluster_id,
        phase: RotationPhase::TrustBoth,
        drop_old_after,
        nodes,
    })
}

/// A membership change or an upgrade of the control plane in progress, said in a sentence.
fn other_change(
    cluster: &db::clusters::ClusterRow,
    nodes: &[db::nodes::NodeRow],
) -> Option<String> {
    let control_plane = || nodes.iter().filter(|n| n.role == Role::ControlPlane);
    if let Some(changing) = control_plane().find(|n| {
        n.etcd_membership != Some(EtcdMembership::Voter)
            || n.replace_since.is_some()
            || n.removal.is_some()
    }) {
        return Some(format!(
            "a membership change is in progress ({} is not a settled voter); rotate the service-account key after it",
            changing.node_name
        ));
    }
    control_plane()
        .find(|n| n.handed_version.as_deref() != Some(cluster.kubernetes_version.as_str()))
        .map(|upgrading| {
            format!(
                "an upgrade to {} is in progress ({} was handed {}); rotate the service-account key after it",
                cluster.kubernetes_version,
                upgrading.node_name,
                upgrading.handed_version.as_deref().unwrap_or("nothing yet")
            )
        })
}

/// Where a rotation went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Advanced {
    /// The new key signs on the nodes that take their next generation.
    SignNew,
    /// Every control-plane node signs with the new key: the wait before drop-old starts.
    SigningEverywhere,
    /// The old public key is dropped from the nodes that take their next generation.
    DropOld,
    Finished,
}

/// Moves `cluster_id`'s service-account key rotation on when every control-plane node runs
/// its desired generation (and, from sign-new, once the wait is over). `None`: nothing to do.
pub async fn advance(ctx: &Rotator, cluster_id: i64) -> Result<Option<Advanced>, SaRotationError> {
    let Some(rotation) = db::sa_rotations::get(&ctx.db.pool, cluster_id).await? else {
        return Ok(None);
    };
    let nodes: Vec<_> = db::nodes::list(&ctx.db.pool, cluster_id)
        .await?
        .into_iter()
        .filter(|n| n.role == Role::ControlPlane)
        .collect();
    if nodes.is_empty() || crate::rotation::waiting_for(&nodes).is_some() {
        return Ok(None);
    }
    let now = ctx.clock.unix();
    let advanced = match rotation.phase {
        RotationPhase::TrustBoth => sign_with_new(ctx, &rotation, now).await?,
        RotationPhase::SignNew => match rotation.drop_old_at() {
            None => {
                let set =
                    db::sa_rotations::set_signing_since(&ctx.db.pool, cluster_id, now).await?;
                if set && rotation.drop_old_after == 0 {
                    drop_old(ctx, cluster_id, now).await?
                } else {
                    set.then_some(Advanced::SigningEverywhere)
                }
            }
            Some(at) if now >= at => drop_old(ctx, cluster_id, now).await?,
            Some(_) => None,
        },
        RotationPhase::DropOld => db::sa_rotations::finish(&ctx.db.pool, cluster_id)
            .await?
            .then_some(Advanced::Finished),
    };
    if let Some(step) = advanced {
        tracing::info!(cluster_id, step = ?step, "service-account key rotation moved on");
    }
    Ok(advanced)
}

/// sign-new → drop-old: the old public key leaves every apiserver.
async fn drop_old(
    ctx: &Rotator,
    cluster_id: i64,
    now: i64,
) -> Result<Option<Advanced>, SaRotationError> {
    let mut tx = ctx.db.begin().await?;
    if !db::sa_rotations::advance(
        &mut tx,
        cluster_id,
        RotationPhase::SignNew,
        RotationPhase::DropOld,
        None,
        now,
    )
    .await?
    {
        return Ok(None);
    }
    db::nodes::bump_role_generations(&mut tx, cluster_id, Role::ControlPlane).await?;
    tx.commit().await?;
    Ok(Some(Advanced::DropOld))
}

/// trust-both → sign-new: the waiting key becomes the cluster's (resealed under its own
/// column), the old public key stays trusted beside it, every control-plane node gets its next
/// generation.
async fn sign_with_new(
    ctx: &Rotator,
    rotation: &SaRotation,
    now: i64,
) -> Result<Option<Advanced>, SaRotationError> {
    let cluster_id = rotation.cluster_id;
    let Some(cluster) = db::clusters::get_by_id(&ctx.db.pool, cluster_id).await? else {
        return Ok(None);
    };
    let (Some(new_public), Some(sealed), Some(old_public)) = (
        &rotation.other_public,
        &rotation.new_key_sealed,
        &cluster.sa_public,
    ) else {
        return Err(SaRotationError::Trust(trust::TrustError::Missing(
            cluster_id,
        )));
    };
    let key = ctx
        .keks
        .open_text(&cluster_aad(cluster_id, NEW_KEY), sealed)?;
    // The waiting key must be the one every apiserver was told to trust.
    let pair = ServiceAccountKey::from_private(SecretPem::new(key.to_string()))?;
    if pair.public_pem.trim() != new_public.trim() {
        return Err(SaRotationError::Pki(PkiError::InvalidServiceAccountKey(
            "the waiting key is not the one trusted in trust-both".into(),
        )));
    }
    let resealed = ctx
        .keks
        .seal(&cluster_aad(cluster_id, KEY), key.as_bytes())?;
    let mut tx = ctx.db.begin().await?;
    if !db::sa_rotations::advance(
        &mut tx,
        cluster_id,
        RotationPhase::TrustBoth,
        RotationPhase::SignNew,
        Some(old_public),
        now,
    )
    .await?
    {
        return Ok(None);
    }
    db::sa_rotations::set_key(&mut tx, cluster_id, new_public, &resealed, now).await?;
    db::nodes::bump_role_generations(&mut tx, cluster_id, Role::ControlPlane).await?;
    tx.commit().await?;
    Ok(Some(Advanced::SignNew))
}

/// A cluster's key as its view shows it: the cluster row (its key columns), its rotation in
/// progress and its nodes (what the rotation waits for).
#[derive(Debug)]
pub struct KeyState {
    pub cluster: db::clusters::ClusterRow,
    pub rotation: Option<SaRotation>,
    pub nodes: Vec<db::nodes::NodeRow>,
}

/// `org_id`'s cluster `cluster_id`'s key.
pub async fn state(
    ctx: &Rotator,
    org_id: i64,
    cluster_id: i64,
) -> Result<KeyState, SaRotationError> {
    let cluster = db::clusters::get(&ctx.db.pool, org_id, cluster_id)
        .await?
        .ok_or(SaRotationError::NotFound)?;
    Ok(KeyState {
        rotation: db::sa_rotations::get(&ctx.db.pool, cluster_id).await?,
        nodes: db::nodes::list(&ctx.db.pool, cluster_id).await?,
        cluster,
    })
}

/// Sets the key's policy: past `max_age_days` (1–3650) `ServiceAccountKeyFresh` turns False,
/// and with `auto_rotate` the reconciler rotates the key. Answers the key's state after it.
pub async fn set_policy(
    ctx: &Rotator,
    org_id: i64,
    cluster_id: i64,
    max_age_days: i64,
    auto_rotate: bool,
) -> Result<KeyState, SaRotationError> {
    if !(1..=3650).contains(&max_age_days) {
        return Err(SaRotationError::MaxAge(max_age_days));
    }
    state(ctx, org_id, cluster_id).await?;
    db::sa_rotations::set_policy(&ctx.db.pool, cluster_id, max_age_days, auto_rotate).await?;
    tracing::info!(
        cluster_id,
        max_age_days,
        auto_rotate,
        "service-account key policy set"
    );
    state(ctx, org_id, cluster_id).await
}

/// Starts a rotation of every cluster that asked for automatic rotation and whose key is past
/// its maximum age (the reconciler's pass); a cluster busy with another change is tried again
/// at the next pass. Returns how many started.
pub async fn rotate_due(ctx: &Rotator) -> usize {
    let due = match db::sa_rotations::due(&ctx.db.pool, ctx.clock.unix()).await {
        Ok(due) => due,
        Err(e) => {
            tracing::warn!(error = %crate::error_chain(&e), "cannot list clusters whose service-account key is due");
            return 0;
        }
    };
    let mut started = 0;
    for cluster_id in due {
        let cluster = match db::clusters::get_by_id(&ctx.db.pool, cluster_id).await {
            Ok(Some(cluster)) => cluster,
            Ok(None) => continue,
            Err(e) => {
                tracing::warn!(cluster_id, error = %crate::error_chain(&e), "cannot read a cluster whose service-account key is due");
                continue;
            }
        };
        match start_for(ctx, &cluster, DEFAULT_DROP_OLD_AFTER).await {
            Ok(_) => {
                started += 1;
                tracing::info!(
                    cluster_id,
                    max_age_days = cluster.sa_key_max_age_days,
                    "service-account key past its maximum age: rotation started"
                );
            }
            Err(e @ (SaRotationError::Blocked(_) | SaRotationError::InProgress(_))) => {
                tracing::info!(cluster_id, reason = %e, "service-account key due; its rotation waits");
            }
            Err(e) => {
                tracing::warn!(cluster_id, error = %crate::error_chain(&e), "service-account key due; its rotation could not start");
            }
        }
    }
    started
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn rotation(phase: RotationPhase, other: Option<&str>) -> SaRotation {
        SaRotation {
            cluster_id: 1,
            phase,
            other_public: other.map(str::to_owned),
            new_key_sealed: None,
            drop_old_after: 0,
            signing_since: None,
            started_at: 0,
            updated_at: 0,
        }
    }

    #[test]
    fn a_founding_from_a_snapshot_waits_only_for_sign_new() {
        assert_eq!(not_carried_whole(7, None), None);
        for phase in [RotationPhase::TrustBoth, RotationPhase::DropOld] {
            assert_eq!(not_carried_whole(7, Some(&rotation(phase, None))), None);
        }
        let mut signing = rotation(RotationPhase::SignNew, Some("old"));
        signing.drop_old_after = 90_000;
        let said = not_carried_whole(7, Some(&signing)).unwrap();
        assert!(
            said.starts_with("cluster 7 is rotating its service-account key (phase sign-new)"),
            "{said}"
        );
        assert!(
            said.contains("until 90000 s after every one of its control-plane nodes"),
            "{said}"
        );
        signing.signing_since = Some(1_800_000_000);
        let said = not_carried_whole(7, Some(&signing)).unwrap();
        assert!(said.contains("until 2027-01-16T09:00:00Z"), "{said}");
    }

    #[test]
    fn both_keys_are_trusted_until_drop_old() {
        let own = "-----OWN-----";
        assert_eq!(public_keys(own, None), own);
        for phase in [RotationPhase::TrustBoth, RotationPhase::SignNew] {
            assert_eq!(
                public_keys(own, Some(&rotation(phase, Some("-----OTHER-----\n")))),
                "-----OWN-----\n-----OTHER-----\n"
            );
        }
        assert_eq!(
            public_keys(own, Some(&rotation(RotationPhase::DropOld, None))),
            own
        );
    }

    #[test]
    fn a_derived_pair_matches_the_generated_one() {
        let made = ServiceAccountKey::generate(crate::pki::KeyAlgorithm::EcdsaP256).unwrap();
        let read = ServiceAccountKey::from_private(made.private_pem.clone()).unwrap();
        assert_eq!(read.public_pem, made.public_pem);
        assert!(ServiceAccountKey::from_private(SecretPem::new("not a key".into())).is_err());
    }
}
