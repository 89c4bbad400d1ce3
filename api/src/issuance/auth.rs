//! Who is asking (SECURITY.md 1–8): a VM's IMDS session token AND a bootstrap-scope principal
//! token of the same org, for its own VM id. Checked in the order that never reveals more than
//! the caller may know; each refusal has a class (its one answer) and a reason (the audit's).

use exk8s_common::contract::IMDS_TOKEN_HEADER;

use crate::db::Db;
use crate::db::phase::ClusterPhase;
use crate::db::tokens::{ApiToken, ImdsToken};
use crate::db::{self, DbError, clusters::ClusterRow, issuances::Audit, nodes::NodeRow};
use crate::tokens::{self, Scope};

use super::IssuanceError;

/// A caller that passed every check.
#[derive(Debug, Clone)]
pub struct Vm {
    pub node: NodeRow,
    pub cluster: ClusterRow,
}

/// How a refused caller is answered. The caller never learns which check failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// Missing, malformed, unknown, expired or revoked credentials.
    Unauthorized,
    /// A valid token of the wrong scope.
    Forbidden(&'static str),
    /// Anything that would reveal another VM or org: answered as not found.
    Hidden,
    /// The VM's own cluster is still being founded: retry shortly.
    NotYet { retry_after_secs: u64 },
}

/// Why a caller was refused: the class decides the answer, the reason goes to the audit.
#[derive(Debug, Clone, Copy)]
pub struct Refusal {
    pub class: Refused,
    pub reason: &'static str,
}

pub(crate) fn unauthorized(reason: &'static str) -> Refusal {
    Refusal {
        class: Refused::Unauthorized,
        reason,
    }
}

pub(crate) fn hidden(reason: &'static str) -> Refusal {
    Refusal {
        class: Refused::Hidden,
        reason,
    }
}

/// A request header's value: present, text, not blank, at most 256 bytes.
pub fn header<'a>(headers: &'a axum::http::HeaderMap, name: &str) -> Option<&'a str> {
    let value = headers.get(name)?.to_str().ok()?.trim();
    (!value.is_empty() && value.len() <= 256).then_some(value)
}

/// A valid IMDS session: the VM it speaks for and its org.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Session {
    pub vm_id: i64,
    pub org_id: i64,
}

/// The session a looked-up IMDS token record makes, if it is valid.
pub(crate) fn session_of(found: Option<ImdsToken>) -> Result<Session, Refusal> {
    let Some(session) = found else {
        return Err(unauthorized("IMDS token unknown"));
    };
    if session.expires_at <= db::now() {
        return Err(unauthorized("IMDS token expired"));
    }
    Ok(Session {
        vm_id: session.vm_id,
        org_id: session.org_id,
    })
}

/// The session is `path_vm`'s own: checked last, so a caller with good credentials learns
/// nothing about other VMs.
pub(crate) fn same_vm(session: Session, path_vm: i64) -> Result<(), Refusal> {
    if session.vm_id == path_vm {
        Ok(())
    } else {
        Err(hidden("the path names another VM than the IMDS token"))
    }
}

/// Judges a VM of `org_id` that is no node: one the journal holds as made for a cluster of the
/// org that is not going away (`making`: that cluster's org and phase) is a node in a moment —
/// it booted before its row was written — and is told to retry; any other is no node.
pub fn not_a_node(making: Option<(i64, ClusterPhase)>, org_id: i64) -> Refusal {
    match making {
        Some((org, ClusterPhase::Provisioning | ClusterPhase::Founded)) if org == org_id => {
            Refusal {
                class: Refused::NotYet {
                    retry_after_secs: 2,
                },
                reason: "the VM is made for its cluster but not yet recorded as a node",
            }
        }
        _ => hidden("the VM is no node of any cluster"),
    }
}

/// Judges a looked-up node and its cluster: a node of a founded cluster of `org_id`.
pub fn member_of(found: Option<(NodeRow, ClusterRow)>, org_id: i64) -> Result<Vm, Refusal> {
    let Some((node, cluster)) = found else {
        return Err(hidden("the VM is no node of any cluster"));
    };
    if cluster.org_id != org_id {
        return Err(hidden("the VM's cluster belongs to another org"));
    }
    match cluster.phase {
        ClusterPhase::Founded => Ok(Vm { node, cluster }),
        // The VM booted before founding finished: retryable, and it is the VM's own cluster.
        ClusterPhase::Provisioning => Err(Refusal {
            class: Refused::NotYet {
                retry_after_secs: 5,
            },
            reason: "the VM's cluster is still being founded",
        }),
        _ => Err(hidden("the VM's cluster is not founded")),
    }
}

/// Checks both bootstrap credentials and the VM's membership.
pub async fn authenticate(
    db: &Db,
    headers: &axum::http::HeaderMap,
    path_vm: i64,
) -> Result<Result<Vm, Refusal>, DbError> {
    let Some(imds) = header(headers, IMDS_TOKEN_HEADER) else {
        return Ok(Err(unauthorized("IMDS token missing or malformed")));
    };
    let bearer = header(headers, "authorization")
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let Some(bearer) = bearer.filter(|b| !b.is_empty()) else {
        return Ok(Err(unauthorized("bearer token missing or malformed")));
    };
    // Every record in one round trip; judged in the same order as ever.
    let found = db::callers::bootstrap(
        &db.pool,
        &tokens::hash(imds),
        &tokens::hash(bearer),
        path_vm,
    )
    .await?;
    let session = match session_of(found.session) {
        Ok(session) => session,
        Err(refusal) => return Ok(Err(refusal)),
    };
    if let Err(refusal) = bootstrap_principal(found.principal, session.org_id) {
        return Ok(Err(refusal));
    }
    if let Err(refusal) = same_vm(session, path_vm) {
        return Ok(Err(refusal));
    }
    if found.member.is_none() {
        let making = db::resources::cluster_making_vm(&db.pool, path_vm).await?;
        return Ok(Err(not_a_node(making, session.org_id)));
    }
    Ok(member_of(found.member, session.org_id))
}

/// The looked-up principal token is a valid, unrevoked bootstrap-scope token of `org`.
fn bootstrap_principal(found: Option<ApiToken>, org: i64) -> Result<(), Refusal> {
    let Some(principal) = found else {
        return Err(unauthorized("bearer token unknown"));
    };
    if principal.revoked {
        return Err(unauthorized("bearer token revoked"));
    }
    if principal.expires_at <= db::now() {
        return Err(unauthorized("bearer token expired"));
    }
    if principal.scope != Scope::Bootstrap {
        return Err(Refusal {
            class: Refused::Forbidden("this token's scope does not allow bootstrap calls"),
            reason: "bearer token is not bootstrap scope",
        });
    }
    if principal.org_id != org {
        return Err(hidden("bearer and IMDS tokens belong to different orgs"));
    }
    Ok(())
}

/// Writes a refusal's audit row and turns it into its error.
pub async fn refuse(db: &Db, path_vm: i64, refusal: Refusal, source: &str) -> IssuanceError {
    tracing::info!(
        vm_id = path_vm,
        reason = refusal.reason,
        source,
        "node request refused"
    );
    let audit = Audit {
        vm_id: path_vm,
        outcome: "refused",
        reason: Some(refusal.reason),
        source_address: Some(source),
        ..Audit::default()
    };
    if let Err(e) = db::issuances::insert(&db.pool, &audit, db::now()).await {
        return IssuanceError::Db(e);
    }
    IssuanceError::Refused(refusal.class)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only a VM made for a cluster of the caller's own org that is not going away is told to
    /// retry; every other VM that is no node is hidden, as ever.
    #[test]
    fn a_vm_not_yet_a_node_retries_only_for_its_own_live_cluster() {
        for phase in ClusterPhase::ALL {
            let refusal = not_a_node(Some((7, phase)), 7);
            let retries = matches!(refusal.class, Refused::NotYet { .. });
            assert_eq!(
                retries,
                matches!(phase, ClusterPhase::Provisioning | ClusterPhase::Founded),
                "{phase:?}"
            );
            assert_eq!(not_a_node(Some((8, phase)), 7).class, Refused::Hidden);
        }
        assert_eq!(not_a_node(None, 7).class, Refused::Hidden);
    }
}
