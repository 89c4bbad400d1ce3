//! The simulators over HTTP, with the REST contracts of `crate::compute` and `crate::dns`, plus
//! `PUT /sim/faults` to change fault knobs, `POST /sim/vms/{id}/{stop|start|destroy}` to do to
//! a VM what a failing machine or a careless operator would, `GET /sim/machines/{id}` for the
//! booted machine behind a VM (`dev --machines nspawn`), and `GET /v1/vms`,
//! `GET /v1/security-groups` listings for tests that inspect what exists.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use serde::Deserialize;

use super::{ComputeSim, DnsSim, Faults, Simulators, VmEvent};
use crate::compute::{Compute, ComputeError, CreateSecurityGroup, CreateVm};
use crate::dns::{ARecord, Dns};

#[derive(Clone)]
struct Sims {
    compute: ComputeSim,
    dns: DnsSim,
}

#[derive(Deserialize)]
struct ByToken {
    client_token: Option<String>,
    /// `key=value`.
    tag: Option<String>,
}

fn failure(e: ComputeError) -> Response {
    match e {
        ComputeError::Unavailable(m) => (StatusCode::SERVICE_UNAVAILABLE, m).into_response(),
        ComputeError::Rejected { status, message } => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
            message,
        )
            .into_response(),
    }
}

fn found<T: serde::Serialize>(value: Option<T>) -> Response {
    match value {
        Some(v) => Json(v).into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// The simulator's HTTP service.
pub fn router(sims: Simulators) -> Router {
    Router::new()
        .route("/v1/vms", get(list_vms).post(create_vm))
        .route("/v1/vms/{id}", get(get_vm).delete(delete_vm))
        .route("/v1/subnets/{id}", get(get_subnet))
        .route("/v1/security-groups", get(list_groups).post(create_group))
        .route(
            "/v1/security-groups/{id}",
            get(get_group).delete(delete_group),
        )
        .route(
            "/v1/records/{name}/A",
            put(put_record).delete(delete_record),
        )
        .route("/v1/records", get(list_records))
        .route("/sim/faults", put(set_faults).get(get_faults))
        .route("/sim/vms/{id}/{event}", post(befall))
        .route("/sim/machines/{id}", get(machine))
        .with_state(Sims {
            compute: sims.compute,
            dns: sims.dns,
        })
}

async fn list_vms(State(s): State<Sims>, Query(q): Query<ByToken>) -> Response {
    let tag = match q.tag.as_deref().map(|t| t.split_once('=')) {
        Some(None) => {
            return (StatusCode::BAD_REQUEST, "tag must be key=value").into_response();
        }
        Some(Some(pair)) => Some(pair),
        None => None,
    };
    let vms: Vec<_> = s
        .compute
        .vms()
        .into_iter()
        .filter(|vm| {
            q.client_token
                .as_ref()
                .is_none_or(|t| vm.client_token.as_ref() == Some(t))
        })
        .filter(|vm| tag.is_none_or(|(k, v)| vm.tags.get(k).is_some_and(|have| have == v)))
        .collect();
    Json(vms).into_response()
}

async fn befall(State(s): State<Sims>, Path((id, event)): Path<(i64, String)>) -> Response {
    let event = match event.as_str() {
        "stop" => VmEvent::Stop,
        "start" => VmEvent::Start,
        "destroy" => VmEvent::Destroy,
        other => {
            let message = format!("unknown VM event {other:?}: stop, start or destroy");
            return (StatusCode::NOT_FOUND, message).into_response();
        }
    };
    if s.compute.befall(id, event) {
        StatusCode::NO_CONTENT.into_response()
    } else {
        (StatusCode::NOT_FOUND, format!("VM {id} does not exist")).into_response()
    }
}

async fn create_vm(State(s): State<Sims>, Json(req): Json<CreateVm>) -> Response {
    match s.compute.create_vm(&req).await {
        Ok(vm) => (StatusCode::CREATED, Json(vm)).into_response(),
        Err(e) => failure(e),
    }
}

async fn get_vm(State(s): State<Sims>, Path(id): Path<i64>) -> Response {
    s.compute.get_vm(id).await.map_or_else(failure, found)
}

async fn delete_vm(State(s): State<Sims>, Path(id): Path<i64>) -> Response {
    s.compute
        .delete_vm(id)
        .await
        .map_or_else(failure, |()| StatusCode::NO_CONTENT.into_response())
}

async fn get_subnet(State(s): State<Sims>, Path(id): Path<i64>) -> Response {
    s.compute.get_subnet(id).await.map_or_else(failure, found)
}

async fn list_groups(State(s): State<Sims>, Query(q): Query<ByToken>) -> Response {
    let groups = s.compute.security_groups();
    Json(match q.client_token {
        Some(t) => groups
            .into_iter()
            .filter(|g| g.client_token.as_deref() == Some(&t))
            .collect(),
        None => groups,
    })
    .into_response()
}

async fn create_group(State(s): State<Sims>, Json(req): Json<CreateSecurityGroup>) -> Response {
    match s.compute.create_security_group(&req).await {
        Ok(group) => (StatusCode::CREATED, Json(group)).into_response(),
        Err(e) => failure(e),
    }
}

async fn get_group(State(s): State<Sims>, Path(id): Path<i64>) -> Response {
    s.compute
        .get_security_group(id)
        .await
        .map_or_else(failure, found)
}

async fn delete_group(State(s): State<Sims>, Path(id): Path<i64>) -> Response {
    s.compute
        .delete_security_group(id)
        .await
        .map_or_else(failure, |()| StatusCode::NO_CONTENT.into_response())
}

async fn put_record(
    State(s): State<Sims>,
    Path(name): Path<String>,
    Json(record): Json<ARecord>,
) -> Response {
    s.dns
        .upsert_a(&name, &record.values)
        .await
        .map_or_else(failure, |()| Json(record).into_response())
}

async fn delete_record(State(s): State<Sims>, Path(name): Path<String>) -> Response {
    s.dns
        .delete_a(&name)
        .await
        .map_or_else(failure, |()| StatusCode::NO_CONTENT.into_response())
}

async fn list_records(State(s): State<Sims>) -> Response {
    Json(s.dns.records()).into_response()
}

async fn set_faults(State(s): State<Sims>, Json(faults): Json<Faults>) -> Response {
    s.dns.set_failing(faults.fail_dns);
    s.compute.set_faults(faults);
    StatusCode::NO_CONTENT.into_response()
}

async fn get_faults(State(s): State<Sims>) -> Response {
    Json(s.compute.faults()).into_response()
}

/// The booted machine behind VM `id` (`dev --machines nspawn`): its state, PID 1, disk and
/// console; 404 when there is none.
async fn machine(State(sims): State<Sims>, Path(id): Path<i64>) -> Response {
    found(sims.compute.machines().and_then(|m| m.info(id)))
}
