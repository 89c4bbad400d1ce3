//! The cluster's shared DNS name: one A record over every control-plane node, journaled like
//! every external thing founding makes. A failure is reported on the cluster, never fatal.

use super::Founder;
use crate::db::{self, DbError, resources::Kind};

use super::Founded;

/// Creates the shared A record; a failure is reported, never fatal.
pub(super) async fn configure(ctx: &Founder, founded: &mut Founded) {
    let Some(dns) = &ctx.machines.dns else {
        founded.dns_error = Some("DNS management is disabled (--dns none)".into());
        return;
    };
    let token = format!("cluster-{}-dns", founded.id);
    let recorded = async {
        let journal_id = db::resources::journal_intent(
            &ctx.db,
            &db::resources::Intent {
                cluster_id: founded.id,
                kind: Kind::DnsRecord,
                client_token: &token,
                ordinal: None,
                pool_id: None,
            },
            db::now(),
        )
        .await?;
        Ok::<i64, DbError>(journal_id)
    }
    .await;
    let result = match recorded {
        Err(e) => Err(format!("journaling the DNS record failed: {e}")),
        Ok(journal_id) => match dns.upsert_a(&founded.dns_name, &founded.node_ips).await {
            Ok(()) => db::resources::set_state(
                &ctx.db.pool,
                journal_id,
                "created",
                Some(&founded.dns_name),
                db::now(),
            )
            .await
            .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        },
    };
    let (configured, error) = match result {
        Ok(()) => (true, None),
        Err(e) => {
            tracing::warn!(cluster_id = founded.id, error = %e, "DNS record not configured (the cluster stands)");
            (false, Some(e))
        }
    };
    founded.dns_configured = configured;
    founded.dns_error = error.clone();
    let _ = db::clusters::set_dns(&ctx.db.pool, founded.id, configured, error.as_deref()).await;
}
