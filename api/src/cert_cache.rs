//! Clusters' recorded certificates kept in memory between reads. A page of views and a renewal
//! pass judge what every node runs from these rows (23,000 for a page of 500 booted clusters),
//! and they change only when a node takes a bundle or the cluster's own certificates change:
//! reading them again each time was half of a page's time. A cluster's copy is used only while
//! its [`Stamp`] — read with the rows, in one statement — is the one the reader now sees, so a
//! read never gets rows older than the cluster and nodes it read. The cache holds at most a
//! bound of rows, the least recently used clusters evicted; certificates' public facts only,
//! no key material.

use std::sync::{Arc, Mutex, PoisonError};

use foldhash::{HashMap, HashMapExt as _};

use crate::db::certificates::{CertRow, Stamp};
use crate::db::nodes::NodeRow;
use crate::db::pages::{Clusters, Stamped};
use crate::db::{self, DbError};

/// Rows held at most by default: 10,000 booted three-node clusters (46 rows each), ≈ 30 MB.
pub const DEFAULT_BOUND_ROWS: usize = 500_000;

struct Entry {
    stamp: Stamp,
    rows: Arc<[CertRow]>,
}

struct Held {
    entries: lru::LruCache<i64, Entry>,
    rows: usize,
}

/// See the module's doc.
pub struct CertificateCache {
    held: Mutex<Held>,
    bound_rows: usize,
}

impl std::fmt::Debug for CertificateCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let held = self.lock();
        f.debug_struct("CertificateCache")
            .field("clusters", &held.entries.len())
            .field("rows", &held.rows)
            .field("bound_rows", &self.bound_rows)
            .finish()
    }
}

impl CertificateCache {
    /// A cache of at most `bound_rows` rows.
    pub fn new(bound_rows: usize) -> Self {
        Self {
            held: Mutex::new(Held {
                entries: lru::LruCache::unbounded(),
                rows: 0,
            }),
            bound_rows,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Held> {
        // A panic while holding the lock leaves the counts consistent (each update is whole).
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Cluster `id`'s rows, when the copy held was read with `stamp`.
    pub fn get(&self, id: i64, stamp: &Stamp) -> Option<Arc<[CertRow]>> {
        let mut held = self.lock();
        held.entries
            .get(&id)
            .filter(|entry| entry.stamp == *stamp)
            .map(|entry| Arc::clone(&entry.rows))
    }

    /// Keeps cluster `id`'s `rows`, read with `stamp`, in place of any earlier copy, evicting
    /// the least recently used clusters past the bound (a cluster larger than the bound is
    /// not kept).
    pub fn put(&self, id: i64, stamp: Stamp, rows: Arc<[CertRow]>) {
        let mut held = self.lock();
        if let Some(old) = held.entries.pop(&id) {
            held.rows -= old.rows.len();
        }
        if rows.len() > self.bound_rows {
            return;
        }
        while held.rows + rows.len() > self.bound_rows {
            match held.entries.pop_lru() {
                Some((_, old)) => held.rows -= old.rows.len(),
                None => break,
            }
        }
        held.rows += rows.len();
        held.entries.put(id, Entry { stamp, rows });
    }

    /// Whether any copy of cluster `id` is held (however old).
    pub fn holds(&self, id: i64) -> bool {
        self.lock().entries.contains(&id)
    }

    /// (clusters, rows) held.
    pub fn size(&self) -> (usize, usize) {
        let held = self.lock();
        (held.entries.len(), held.rows)
    }

    /// What to read ahead for a page covering `page` of clusters `ids`, before their stamps are
    /// known: all of it when none is held (a cold page keeps its span's cheap plan), else the
    /// ones never held.
    pub fn ahead(&self, page: &Clusters, ids: &[i64]) -> Clusters {
        let held = self.lock();
        let absent: Vec<i64> = ids
            .iter()
            .copied()
            .filter(|id| !held.entries.contains(id))
            .collect();
        if absent.len() == ids.len() {
            page.clone()
        } else {
            Clusters::Ids(absent.into())
        }
    }

    /// The rows of each of `clusters` (id and `certificates_version`, whose nodes are in
    /// `nodes`): from `read` (rows just read, with their own stamp, which are kept), else the
    /// copy held while its stamp is the one the clusters and nodes now give, else read now in
    /// one statement (and kept).
    pub async fn resolve(
        &self,
        db: &sqlx::AnyPool,
        clusters: impl IntoIterator<Item = (i64, i64)>,
        nodes: &std::collections::HashMap<i64, Vec<NodeRow>>,
        read: impl IntoIterator<Item = (i64, Stamped)>,
    ) -> Result<HashMap<i64, Arc<[CertRow]>>, DbError> {
        let mut read: HashMap<i64, Stamped> = read.into_iter().collect();
        let mut rows = HashMap::new();
        let mut stale = Vec::new();
        for (id, version) in clusters {
            let stamp = || Stamp::of(version, nodes.get(&id).map_or(&[][..], Vec::as_slice));
            if let Some(fresh) = read.remove(&id) {
                rows.insert(id, self.keep(id, fresh));
            } else if let Some(held) = self.get(id, &stamp()) {
                rows.insert(id, held);
            } else {
                stale.push(id);
            }
        }
        if !stale.is_empty() {
            let read = db::pages::certificates(db, &Clusters::Ids(stale.into())).await?;
            for (id, fresh) in read {
                rows.insert(id, self.keep(id, fresh));
            }
        }
        Ok(rows)
    }

    fn keep(&self, id: i64, fresh: Stamped) -> Arc<[CertRow]> {
        let rows: Arc<[CertRow]> = fresh.rows.into();
        self.put(id, fresh.stamp, Arc::clone(&rows));
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize) -> Arc<[CertRow]> {
        (0..n)
            .map(|i| CertRow {
                node_id: Some(1),
                generation: 1,
                name: format!("c{i}").into(),
                not_before: 0,
                not_after: 10,
                details: None,
            })
            .collect()
    }

    fn stamp(serial: i64) -> Stamp {
        Stamp::new(0, [(2, 1), (1, serial)])
    }

    #[test]
    fn a_copy_is_used_only_while_its_stamp_holds() {
        let cache = CertificateCache::new(100);
        cache.put(7, stamp(3), rows(2));
        assert_eq!(
            cache
                .get(7, &Stamp::new(0, [(1, 3), (2, 1)]))
                .unwrap()
                .len(),
            2
        );
        assert!(cache.get(7, &stamp(4)).is_none(), "a node took a bundle");
        assert!(cache.get(7, &Stamp::new(1, [(1, 3), (2, 1)])).is_none());
        assert!(
            cache.get(7, &Stamp::new(0, [(1, 3)])).is_none(),
            "a node left"
        );
        assert!(cache.get(8, &stamp(3)).is_none());
        cache.put(7, stamp(4), rows(5));
        assert_eq!(cache.get(7, &stamp(4)).unwrap().len(), 5);
        assert!(cache.get(7, &stamp(3)).is_none());
        assert_eq!(cache.size(), (1, 5));
    }

    #[test]
    fn never_more_rows_than_the_bound_the_least_recently_used_go_first() {
        let cache = CertificateCache::new(10);
        for id in 1..=3 {
            cache.put(id, stamp(1), rows(3));
        }
        assert_eq!(cache.size(), (3, 9));
        assert!(cache.get(1, &stamp(1)).is_some()); // 2 is now the least recently used
        cache.put(4, stamp(1), rows(4));
        assert_eq!(cache.size(), (3, 10));
        assert!(!cache.holds(2));
        assert!(cache.holds(1) && cache.holds(3) && cache.holds(4));
        cache.put(5, stamp(1), rows(11));
        assert!(!cache.holds(5), "larger than the bound");
        cache.put(1, stamp(2), rows(11));
        assert!(!cache.holds(1), "replaced by a copy larger than the bound");
        assert_eq!(cache.size(), (2, 7));
        for id in 10..100 {
            cache.put(id, stamp(1), rows(id as usize % 4));
            assert!(cache.size().1 <= 10);
        }
    }

    #[test]
    fn a_cold_page_is_read_ahead_whole_a_warm_one_for_what_was_never_held() {
        let cache = CertificateCache::new(100);
        let page = Clusters::Span {
            org_id: Some(1),
            first: 1,
            last: 4,
        };
        let ids = [1, 2, 3, 4];
        assert!(matches!(cache.ahead(&page, &ids), Clusters::Span { .. }));
        cache.put(2, stamp(1), rows(1));
        cache.put(4, stamp(1), rows(1));
        match cache.ahead(&page, &ids) {
            Clusters::Ids(absent) => assert_eq!(&*absent, [1, 3]),
            other => panic!("{other:?}"),
        }
        cache.put(1, stamp(1), rows(1));
        cache.put(3, stamp(1), rows(1));
        match cache.ahead(&page, &ids) {
            Clusters::Ids(absent) => assert!(absent.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn debug_shows_sizes_only() {
        let cache = CertificateCache::new(100);
        cache.put(1, stamp(1), rows(2));
        let text = format!("{cache:?}");
        assert_eq!(
            text,
            "CertificateCache { clusters: 1, rows: 2, bound_rows: 100 }"
        );
    }
}
