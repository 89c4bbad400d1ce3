//! The closed sets the database stores as text, each an enum and a CHECK constraint there
//! (migration 0003): a cluster's phase, a node's phase with the state of its last report
//! ([`crate::lifecycle`]), a removal, an etcd membership. A value outside the set is a decode
//! error, never a string passed along.

use std::str::FromStr;

pub use crate::lifecycle::phase::NodePhase;
pub use exk8s_api_types::phase::{ClusterPhase, EtcdMembership, Removal};
use exk8s_common::contract::UnknownName;

/// Decodes a text column through `FromStr`, naming the column when the value is outside its set.
pub(crate) fn decode<T>(row: &sqlx::any::AnyRow, column: &str) -> Result<T, sqlx::Error>
where
    T: FromStr<Err = UnknownName>,
{
    use sqlx::Row as _;
    let text: String = row.try_get(column)?;
    text.parse()
        .map_err(|e: UnknownName| sqlx::Error::ColumnDecode {
            index: column.to_owned(),
            source: Box::new(e),
        })
}
