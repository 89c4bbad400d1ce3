//! Checking and storing a cluster's [`HealthPolicy`] (the type is the API's, in
//! `exk8s_api_types`): stored as JSON in `clusters.health_policy`, absent for the defaults. A
//! pool may have its own (`node_pools.health_policy`), which its workers are judged and
//! remediated by instead; absent, they follow the cluster's.

pub use exk8s_api_types::health::{HealthPolicy, MaxUnhealthy};

/// Why a policy was refused: the field and what is wrong with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("health policy: {0}")]
pub struct PolicyError(String);

impl PolicyError {
    /// The field it names (the message starts with it).
    pub fn field(&self) -> &str {
        self.0.split_whitespace().next().unwrap_or_default()
    }
}

/// Why a policy could not be read or set.
#[derive(Debug, thiserror::Error)]
pub enum SetError {
    /// No such cluster (in the org), or no such pool in it.
    #[error("not found")]
    NotFound,
    #[error(transparent)]
    Invalid(#[from] PolicyError),
    #[error(transparent)]
    Db(#[from] crate::db::DbError),
}

/// The cluster's policy (another org's cluster is not found).
pub async fn get(
    db: &crate::db::Db,
    org_id: i64,
    cluster_id: i64,
) -> Result<HealthPolicy, SetError> {
    let row = crate::db::clusters::get(&db.pool, org_id, cluster_id)
        .await?
        .ok_or(SetError::NotFound)?;
    Ok(of(&row))
}

/// Replaces the cluster's policy (fields a request leaves out take their defaults); the next
/// health judgement and remediation pass use it.
pub async fn set(
    db: &crate::db::Db,
    org_id: i64,
    cluster_id: i64,
    policy: HealthPolicy,
) -> Result<HealthPolicy, SetError> {
    validate(&policy)?;
    crate::db::clusters::get(&db.pool, org_id, cluster_id)
        .await?
        .ok_or(SetError::NotFound)?;
    crate::db::clusters::set_health_policy(&db.pool, cluster_id, stored(&policy).as_deref())
        .await?;
    Ok(policy)
}

/// The policy `pool`'s workers are judged by: its own, else its cluster's.
pub fn for_pool(
    cluster: &crate::db::clusters::ClusterRow,
    pool: Option<&crate::db::pools::PoolRow>,
) -> HealthPolicy {
    match pool.and_then(|p| p.health_policy.as_deref()) {
        Some(own) => from_stored(Some(own)),
        None => of(cluster),
    }
}

/// The policy `node` is judged by: its pool's (a worker) or its cluster's.
pub fn for_node(
    cluster: &crate::db::clusters::ClusterRow,
    pools: &[crate::db::pools::PoolRow],
    node: &crate::db::nodes::NodeRow,
) -> HealthPolicy {
    for_pool(
        cluster,
        node.pool_id
            .and_then(|id| pools.iter().find(|p| p.id == id)),
    )
}

/// `org_id`'s cluster and its pool `pool_id`.
async fn pool_of(
    db: &crate::db::Db,
    org_id: i64,
    cluster_id: i64,
    pool_id: i64,
) -> Result<(crate::db::clusters::ClusterRow, crate::db::pools::PoolRow), SetError> {
    let cluster = crate::db::clusters::get(&db.pool, org_id, cluster_id)
        .await?
        .ok_or(SetError::NotFound)?;
    let pool = crate::db::pools::get(&db.pool, pool_id)
        .await?
        .filter(|p| p.cluster_id == cluster_id)
        .ok_or(SetError::NotFound)?;
    Ok((cluster, pool))
}

/// The policy a pool's workers are judged by, and whether it is the pool's own.
pub async fn get_pool(
    db: &crate::db::Db,
    org_id: i64,
    cluster_id: i64,
    pool_id: i64,
) -> Result<(HealthPolicy, bool), SetError> {
    let (cluster, pool) = pool_of(db, org_id, cluster_id, pool_id).await?;
    Ok((
        for_pool(&cluster, Some(&pool)),
        pool.health_policy.is_some(),
    ))
}

/// Gives a pool its own policy (fields a request leaves out take their defaults, not the
/// cluster's), or with `None` makes it follow its cluster's again; the policy it is judged by
/// now.
pub async fn set_pool(
    db: &crate::db::Db,
    org_id: i64,
    cluster_id: i64,
    pool_id: i64,
    policy: Option<HealthPolicy>,
) -> Result<HealthPolicy, SetError> {
    if let Some(policy) = &policy {
        validate(policy)?;
    }
    let (cluster, pool) = pool_of(db, org_id, cluster_id, pool_id).await?;
    let text = policy
        .as_ref()
        .map(|p| serde_json::to_string(p).unwrap_or_default());
    crate::db::pools::set_health_policy(&db.pool, pool.id, text.as_deref()).await?;
    Ok(policy.unwrap_or_else(|| of(&cluster)))
}

/// The shortest timeout a policy may set: below the agent's poll interval a healthy machine
/// would look unreachable between two polls.
pub const MIN_UNREACHABLE_SECS: u32 = 10 * 60;

/// Refuses timeouts that would call a healthy machine unhealthy.
pub fn validate(policy: &HealthPolicy) -> Result<(), PolicyError> {
    if policy.unreachable_after_secs < MIN_UNREACHABLE_SECS {
        return Err(PolicyError(format!(
            "unreachable_after_secs {} is shorter than {MIN_UNREACHABLE_SECS}: a healthy agent polls every five to seven minutes",
            policy.unreachable_after_secs
        )));
    }
    for (name, value) in [
        ("unhealthy_after_secs", policy.unhealthy_after_secs),
        ("vm_down_after_secs", policy.vm_down_after_secs),
        ("startup_timeout_secs", policy.startup_timeout_secs),
        ("retry_period_secs", policy.retry_period_secs),
    ] {
        if value < 60 {
            return Err(PolicyError(format!(
                "{name} {value} is shorter than a minute"
            )));
        }
    }
    if policy.max_remediations == 0 && policy.remediation {
        return Err(PolicyError(
            "max_remediations 0 allows none: turn remediation off instead".into(),
        ));
    }
    Ok(())
}

/// The stored form (`None` for the defaults).
pub fn stored(policy: &HealthPolicy) -> Option<String> {
    (*policy != HealthPolicy::default()).then(|| serde_json::to_string(policy).unwrap_or_default())
}

/// The cluster's policy.
pub fn of(cluster: &crate::db::clusters::ClusterRow) -> HealthPolicy {
    from_stored(cluster.health_policy.as_deref())
}

/// The policy a row stores (`None`: the defaults). A row that no longer parses (a field this
/// build does not know) reads as the defaults with remediation off, never as a policy nobody
/// wrote.
pub fn from_stored(stored: Option<&str>) -> HealthPolicy {
    stored.map_or_else(HealthPolicy::default, |text| {
        serde_json::from_str(text).unwrap_or(HealthPolicy {
            remediation: false,
            ..HealthPolicy::default()
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_unhealthy_reads_counts_and_percents_and_nothing_else() {
        assert_eq!("2".parse(), Ok(MaxUnhealthy::Count(2)));
        assert_eq!("40%".parse(), Ok(MaxUnhealthy::Percent(40)));
        for bad in ["101%", "-1", "x", "%", "40 %", ""] {
            let err = bad.parse::<MaxUnhealthy>().unwrap_err();
            assert!(err.contains("a count (2) or a percent"), "{bad}: {err}");
        }
        assert_eq!(MaxUnhealthy::Percent(40).of(3), 1);
        assert_eq!(MaxUnhealthy::Percent(40).of(5), 2);
        assert_eq!(MaxUnhealthy::Percent(40).of(2), 0);
        assert_eq!(MaxUnhealthy::Count(1).of(10), 1);
    }

    #[test]
    fn a_policy_round_trips_and_refuses_what_would_misjudge_a_healthy_machine() {
        let defaults = HealthPolicy::default();
        assert_eq!(stored(&defaults), None);
        assert_eq!(from_stored(None), defaults);
        let changed = HealthPolicy {
            max_unhealthy: MaxUnhealthy::Count(1),
            ..defaults
        };
        let stored = stored(&changed).unwrap();
        assert!(stored.contains(r#""max_unhealthy":"1""#), "{stored}");
        assert_eq!(from_stored(Some(&stored)), changed);
        // A partial document keeps the defaults for what it does not say.
        let partial: HealthPolicy = serde_json::from_str(r#"{"remediation":false}"#).unwrap();
        assert_eq!(
            partial,
            HealthPolicy {
                remediation: false,
                ..defaults
            }
        );
        assert!(serde_json::from_str::<HealthPolicy>(r#"{"remedy":false}"#).is_err());
        assert!(!from_stored(Some(r#"{"future":1}"#)).remediation);

        validate(&defaults).unwrap();
        let short = HealthPolicy {
            unreachable_after_secs: 300,
            ..defaults
        };
        assert!(
            validate(&short)
                .unwrap_err()
                .to_string()
                .contains("unreachable_after_secs 300")
        );
        let short = HealthPolicy {
            vm_down_after_secs: 5,
            ..defaults
        };
        assert!(
            validate(&short)
                .unwrap_err()
                .to_string()
                .contains("vm_down_after_secs 5")
        );
        let none = HealthPolicy {
            max_remediations: 0,
            ..defaults
        };
        assert!(validate(&none).is_err());
        validate(&HealthPolicy {
            remediation: false,
            ..none
        })
        .unwrap();
    }
}
