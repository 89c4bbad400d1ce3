//! Admission control of bundle requests, on SQLite and PostgreSQL: with every CPU slot held
//! (deterministically, by jobs waiting on a barrier) and no room to queue, a bundle request is
//! answered 503 with `Retry-After` at once — while the slots are still held, so it was not
//! queued behind them — and served once a slot frees.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::app::{Backend, both_backends, spawn_with, test_config};
use crate::bootstrap::{NONCE, cluster_with_credentials, fetch};

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
    let gate = Arc::new(std::sync::Barrier::new(slots + 1));
    let holding = Arc::new(AtomicUsize::new(0));
    let holders: Vec<_> = (0..slots)
        .map(|_| {
            let (cpu, gate, holding) = (app.state.cpu.clone(), gate.clone(), holding.clone());
            tokio::spawn(async move {
                cpu.run(move || {
                    holding.fetch_add(1, Ordering::SeqCst);
                    gate.wait();
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

    tokio::task::spawn_blocking(move || gate.wait())
        .await
        .unwrap();
    for holder in holders {
        holder.await.unwrap();
    }
    let served = fetch(&app, node.vm, Some(&node.imds), Some(&bearer), NONCE).await;
    assert_eq!(served.status(), 200, "a slot is free again");
}
both_backends!(a_saturated_pool_refuses_bundles_at_once);
