use std::time::Instant;

use super::*;

const RSA: KeyAlgorithm = KeyAlgorithm::Rsa2048;

fn wants(keys: usize) -> Option<Demand> {
    Some(Demand {
        algorithm: RSA,
        keys,
    })
}

/// Polls until `done` holds (the filler works on its own thread), failing after a minute.
fn until(pool: &KeyPool, what: &str, done: impl Fn(PoolStats) -> bool) -> PoolStats {
    let start = Instant::now();
    loop {
        let stats = pool.stats();
        if done(stats) {
            return stats;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{what}: {stats:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn fills_each_cluster_to_its_demand_and_a_bundle_takes_them() {
    let pool = KeyPool::start(100).unwrap();
    pool.set_cluster(1, wants(3));
    pool.set_cluster(2, wants(2));
    let full = until(&pool, "filled", |s| s.ready == 5);
    assert_eq!(full.wanted, 5);

    let taken = pool.take(1, RSA, 2);
    assert_eq!(taken.len(), 2);
    assert!(taken.iter().all(|k| k.algorithm() == RSA));
    // The demand fell with the take: nothing is made again for it.
    let after = pool.stats();
    assert_eq!((after.ready, after.wanted, after.taken), (3, 3, 2));
    // A bundle of another algorithm, or of a cluster with nothing ready, gets nothing.
    assert!(pool.take(2, KeyAlgorithm::Rsa4096, 2).is_empty());
    assert!(pool.take(9, RSA, 2).is_empty());
    // A take beyond what is ready gets what there is; the rest is the bundle's to make.
    assert_eq!(pool.take(2, RSA, 5).len(), 2);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        pool.stats().ready,
        1,
        "cluster 2's demand is met; only cluster 1's key is left"
    );
}

#[test]
fn the_pool_never_holds_more_than_its_bound() {
    let pool = KeyPool::start(3).unwrap();
    pool.set_cluster(1, wants(10));
    until(&pool, "filled to the bound", |s| s.ready == 3);
    std::thread::sleep(Duration::from_millis(500));
    let stats = pool.stats();
    assert_eq!((stats.ready, stats.wanted), (3, 10), "{stats:?}");
    // Room made by a take is filled again, to the bound and no further.
    assert_eq!(pool.take(1, RSA, 2).len(), 2);
    until(&pool, "refilled", |s| s.ready == 3);
}

#[test]
fn a_cluster_that_wants_nothing_more_loses_its_keys_and_ecdsa_is_never_pooled() {
    let pool = KeyPool::start(100).unwrap();
    let mut demand = HashMap::new();
    demand.insert(1, wants(2).unwrap());
    demand.insert(
        2,
        Demand {
            algorithm: KeyAlgorithm::EcdsaP256,
            keys: 11,
        },
    );
    pool.set_demand(&demand);
    until(&pool, "filled", |s| s.ready == 2);
    assert_eq!(pool.stats().wanted, 2, "ECDSA demand is ignored");
    // A lower demand drops the surplus; a cluster gone from the demand drops everything.
    pool.set_cluster(1, wants(1));
    assert_eq!(pool.stats().ready, 1);
    pool.set_demand(&HashMap::new());
    assert_eq!(
        pool.stats(),
        PoolStats {
            ready: 0,
            wanted: 0,
            made: 2,
            taken: 0
        }
    );
}

/// A thread's nice value, or `None` once it has exited.
fn nice(tid: i32) -> Option<i64> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).ok()?;
    // After the parenthesised name come the fields from `state` (3) on; nice is field 19.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(16)?.parse().ok()
}

#[test]
fn the_filler_runs_at_nice_19_and_stops_with_its_pool() {
    let pool = KeyPool::start(10).unwrap();
    pool.set_cluster(1, wants(1));
    until(&pool, "filled", |s| s.ready == 1);
    let tid = *pool.shared.filler.get().expect("the filler runs");
    assert_eq!(nice(tid), Some(19), "the filler's nice value");
    let clone = pool.clone();
    drop(pool);
    assert_eq!(clone.stats().ready, 1, "a clone keeps the pool");
    assert!(nice(tid).is_some(), "the filler runs while a clone lives");
    drop(clone);
    let start = Instant::now();
    while nice(tid).is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the filler did not stop"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn demand_counts_each_roles_keys_per_cluster() {
    let row = |cluster_id, key_algorithm: &str, role, nodes| PendingBundles {
        cluster_id,
        key_algorithm: key_algorithm.into(),
        role,
        nodes,
    };
    use exk8s_common::contract::Role;
    let rows = [
        row(1, "rsa-2048", Role::ControlPlane, 3),
        row(1, "rsa-2048", Role::Worker, 29),
        row(2, "rsa-4096", Role::Worker, 1),
        row(3, "dsa-512", Role::Worker, 1),
    ];
    let demand = demand(&rows);
    assert_eq!(demand.len(), 2, "an unknown algorithm is skipped");
    assert_eq!(
        demand[&1],
        Demand {
            algorithm: RSA,
            keys: 3 * 11 + 29 * 3
        }
    );
    assert_eq!(
        demand[&2],
        Demand {
            algorithm: KeyAlgorithm::Rsa4096,
            keys: 3
        }
    );
}
