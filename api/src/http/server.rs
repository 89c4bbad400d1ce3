//! The composition root of a running service: [`Application`] migrates the database, binds
//! its listener at build time (port 0 works in tests), starts the reconciler, wires the router
//! onto the state and serves until stopped, with a drain period during which `/healthz` answers
//! 418. The state ([`crate::app`]) wires nothing; this module wires everything.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::net::TcpListener;

use crate::app::AppState;
use crate::db::DbError;

/// A bound, migrated server, ready to run.
pub struct Application {
    listener: TcpListener,
    state: AppState,
    extra_routes: Option<axum::Router>,
}

impl Application {
    /// Binds `listen`, runs migrations, and starts the reconciler.
    pub async fn build(state: AppState, listen: &str) -> Result<Self, BuildError> {
        state.db.migrate().await?;
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| BuildError::Bind(listen.to_owned(), e))?;
        crate::founding::reconcile::spawn(state.reconciler());
        spawn_limit_pruning(&state);
        Ok(Self {
            listener,
            state,
            extra_routes: None,
        })
    }

    /// Adds routes served beside the API (the dev stack's simulators).
    pub fn with_routes(mut self, routes: axum::Router) -> Self {
        self.extra_routes = Some(routes);
        self
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn state(&self) -> &AppState {
        &self.state
    }

    /// Serves until `stop` resolves; then answers `/healthz` with 418 for the drain period,
    /// lets in-flight requests finish, and returns.
    pub async fn run_until_stopped(
        self,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let draining = Arc::clone(&self.state.draining);
        let drain = self.state.config.drain;
        let mut router = super::router(self.state);
        if let Some(extra) = self.extra_routes {
            router = router.merge(extra);
        }
        let shutdown = async move {
            stop.await;
            draining.store(true, Ordering::SeqCst);
            tracing::info!(drain_secs = drain.as_secs(), "draining before shutdown");
            tokio::time::sleep(drain).await;
        };
        axum::serve(
            self.listener,
            router.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .with_graceful_shutdown(shutdown)
        .await
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("binding {0}")]
    Bind(String, #[source] std::io::Error),
}

/// Prunes the rate limiters' idle keys on a timer, off the request path, for as long as the
/// state lives (a weak reference: a stopped server's limiters are not kept alive by it).
fn spawn_limit_pruning(state: &AppState) {
    let limits = Arc::downgrade(&state.limits);
    tokio::spawn(async move {
        let mut every = tokio::time::interval(crate::ratelimit::PRUNE_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(limits) = limits.upgrade() else {
                return;
            };
            limits.prune();
        }
    });
}
