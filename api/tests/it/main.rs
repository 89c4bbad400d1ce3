//! `exk8s-api` integration tests: one binary, with shared helpers.

#![allow(
    unreachable_pub,
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test helpers: a failure should stop the test loudly"
)]

mod admission;
mod adversarial;
mod agent_skew;
mod app;
mod background;
mod bad_input;
mod bootstrap;
mod cert_cache;
mod certificates;
mod component_health;
mod console;
mod console_actions;
mod cp_remediation;
mod crash;
mod credentials;
mod db_faults;
mod delete_race;
mod disk_full;
mod durability;
mod events;
mod founding;
mod health;
mod helpers;
mod idempotency;
mod idle_ping;
mod issuers;
mod kept_after_delete;
mod key_helper;
mod key_pool;
mod limits;
mod member_crash;
mod membership;
mod membership_down;
mod metrics_bounds;
mod node_lookup;
mod node_routes;
mod pki;
mod pki_cases;
mod pool_burst;
mod pool_crash;
mod pool_drains;
mod pool_upgrade;
mod pools;
mod remediation;
mod render;
mod render_join;
mod render_plan;
mod render_validators;
mod render_worker;
mod renewal;
mod replace;
mod replicas;
mod restore;
mod restore_from;
mod retention;
mod rolling_deploy;
mod rotation;
mod sa_rotation;
mod schema;
mod snapshots;
mod status;
mod supplied_ca;
mod sync;
mod upgrade;
mod upgrade_snapshot;
mod versions;
mod workers;
