//! Admission control of bundle requests, on SQLite and PostgreSQL: with every CPU slot held
//! (deterministically, by jobs waiting for a gate to open) and no room to queue, a bundle request
//! is answered 503 with `Retry-After` at once — while the slots are still held, so it was not
//! queued behind them — and served once a slot frees. The gate also opens when the test fails:
//! a runtime waits for its blocking jobs when dropped, so a gate left shut would hang the suite
//! instead of failing it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::app::{Backend, both_backends, spawn_with, test_config};
use crate::bootstrap::{NONCE, cluster_with_credentials, fetch};

/// Shut while held; open once dropped, on success or on a failed assertion alike.
struct Gate(Arc<AtomicBool>);

impl Drop for Gate {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

async fn a_saturated_pool_refuses_bundles_at_once(backend: Backend) {
    let mut config = test_config();
    config.cpu_queue_per_core = 0;
    // A request that queued would wait this long: far past the test's own timeout.
    config.bootstrap_deadline = Duration::from_secs(120);
    let app = spawn_with(backend, config, None).await;
    let nodes = cluster_with_credentials(&app, 7, 1).await;
    let node = &nodes[0];
    let bearer = format!("Bearer {}", node.bootstrap);

    let slots = std::thread::available_parallelism().map_or(2, usize::from);
    let gate = Gate(Arc::new(AtomicBool::new(false)));
    let holding = Arc::new(AtomicUsize::new(0));
    let holders: Vec<_> = (0..slots)
        .map(|_| {
            let (cpu, open, holding) = (app.state.cpu.clone(), gate.0.clone(), holding.clone());
            tokio::spawn(async move {
                cpu.run(move || {
                    holding.fetch_add(1, Ordering::SeqCst);
                    while !open.load(Ordering::SeqCst) {
                        std::thread::sleep(Duration::from_millis(2));
                    }
                })
                .await
                .unwrap();
            })
        })
        .collect();
    while holding.load(Ordering::SeqCst) < slots {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let refused = tokio::time::timeout(
        Duration::from_secs(30),
        fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE),
    )
    .await
    .expect("answered while every slot is still held");
    assert_eq!(refused.status(), 503);
    assert_eq!(refused.headers()["retry-after"], "2");
    assert_eq!(
        holding.load(Ordering::SeqCst),
        slots,
        "the slots were held throughout"
    );

    drop(gate);
    for holder in holders {
        holder.await.unwrap();
    }
    let served = fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE).await;
    assert_eq!(served.status(), 200, "a slot is free again");
}
both_backends!(a_saturated_pool_refuses_bundles_at_once);
