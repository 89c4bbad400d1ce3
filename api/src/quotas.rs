//! Per-org quotas on clusters, VMs and node pools (`serve --quota-*`; 0 is unlimited): a request
//! that would take an org past one is refused before anything is made, naming the quota, the
//! org's use and what the request asked for. Checked against [`db::quotas::usage`] at request
//! time: concurrent requests of one org may pass together by at most what each asked.

use crate::db::{self, DbError};

/// The bounds per org; 0 is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quotas {
    pub clusters: i64,
    pub vms: i64,
    pub pools: i64,
}

impl Default for Quotas {
    fn default() -> Self {
        Self {
            clusters: 100,
            vms: 1000,
            pools: 100,
        }
    }
}

/// What a request would add.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Ask {
    pub clusters: i64,
    pub vms: i64,
    pub pools: i64,
}

/// A quota a request would pass.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error(
    "this org's {what} quota is {limit}; it uses {used} and this asks for {asked} more \
     (delete some{}, or ask the operator of this API to raise --quota-{what})",
    if *what == "clusters" { " — a deleted cluster counts until it is purged: `exk8s clusters purge`" } else { "" }
)]
pub struct Exceeded {
    pub what: &'static str,
    pub limit: i64,
    pub used: i64,
    pub asked: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    #[error(transparent)]
    Exceeded(#[from] Exceeded),
    #[error(transparent)]
    Db(#[from] DbError),
}

/// Whether `usage` plus `ask` stays within `quotas`.
pub fn check(quotas: Quotas, usage: db::quotas::Usage, ask: Ask) -> Result<(), Exceeded> {
    for (what, limit, used, asked) in [
        ("clusters", quotas.clusters, usage.clusters, ask.clusters),
        ("vms", quotas.vms, usage.vms, ask.vms),
        ("pools", quotas.pools, usage.pools, ask.pools),
    ] {
        if limit > 0 && asked > 0 && used + asked > limit {
            return Err(Exceeded {
                what,
                limit,
                used,
                asked,
            });
        }
    }
    Ok(())
}

/// Reads org `org_id`'s use and checks `ask` against `quotas`.
pub async fn admit(db: &db::Db, quotas: Quotas, org_id: i64, ask: Ask) -> Result<(), QuotaError> {
    if ask == Ask::default() {
        return Ok(());
    }
    let usage = db::quotas::usage(&db.pool, org_id).await?;
    Ok(check(quotas, usage, ask)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_past_a_quota_is_refused_naming_it() {
        let quotas = Quotas {
            clusters: 2,
            vms: 10,
            pools: 0,
        };
        let usage = db::quotas::Usage {
            clusters: 1,
            pools: 40,
            vms: 8,
        };
        let ask = |clusters, vms, pools| Ask {
            clusters,
            vms,
            pools,
        };
        assert_eq!(check(quotas, usage, ask(1, 2, 1)), Ok(()));
        let vms = check(quotas, usage, ask(0, 3, 0)).unwrap_err();
        assert_eq!(
            (vms.what, vms.limit, vms.used, vms.asked),
            ("vms", 10, 8, 3)
        );
        assert!(vms.to_string().contains("--quota-vms"));
        let clusters = check(quotas, usage, ask(2, 0, 0)).unwrap_err();
        assert_eq!(clusters.what, "clusters");
        // Scaling down is never refused, even over a quota lowered since.
        assert_eq!(
            check(
                quotas,
                db::quotas::Usage { vms: 50, ..usage },
                ask(0, -5, 0)
            ),
            Ok(())
        );
    }
}
