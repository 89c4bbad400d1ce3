//! `PATCH /clusters/{id}`: one change of a running cluster at a time — its control plane's
//! size (`{"control_plane_count": N}`, [`crate::membership`]) or the Kubernetes version it runs
//! (`{"kubernetes_version": "v1.36.3"}`, [`crate::upgrade`]; an etcd snapshot first unless
//! `"snapshot_first": false`). Answers 202 with where the change
//! stands (200 when there is nothing to do); its progress is in `GET /clusters/{id}` and the
//! event stream (`ScalingUp`/`ScalingDown`, `RollingOut`, each node's version).

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::error::{ApiError, ErrorBody};
use super::extract::{ApiJson, ApiPath, Operator};
use crate::app::AppState;
use crate::field::Validate as _;
use crate::membership::{self, ClusterPatch, MembershipError};
use crate::upgrade::{self, Started, UpgradeError, skew::SkewError};
use exk8s_api_types::{ClusterChange, ScalingView, UpgradeState, UpgradeView};

impl From<UpgradeError> for ApiError {
    fn from(e: UpgradeError) -> Self {
        let field = || Some("kubernetes_version".to_owned());
        match e {
            UpgradeError::NotFound => Self::NotFound,
            e @ UpgradeError::NotFounded { .. } => Self::Conflict(e.to_string()),
            e @ (UpgradeError::NotARelease(_)
            | UpgradeError::Skew(SkewError::NotOffered { .. })) => Self::Unprocessable {
                field: field(),
                message: e.to_string(),
            },
            // The policy forbids it from where the cluster stands: 409, naming the rule and
            // what to do first.
            UpgradeError::Skew(rule) => Self::Conflict(rule.to_string()),
            UpgradeError::Conflict(message) => Self::Conflict(message),
            UpgradeError::Db(db) => db.into(),
        }
    }
}

/// The change a patch asks for.
enum Change<'a> {
    Scale(i64),
    /// The version, and whether an etcd snapshot is stored before any member changes.
    Version(&'a str, bool),
}

fn change(patch: &ClusterPatch) -> Result<Change<'_>, ApiError> {
    if patch.snapshot_first.is_some() && patch.kubernetes_version.is_none() {
        return Err(ApiError::Unprocessable {
            field: Some("snapshot_first".into()),
            message: "snapshot_first goes with kubernetes_version: it says whether an upgrade \
                      waits for an etcd snapshot"
                .into(),
        });
    }
    match (
        patch.control_plane_count,
        patch.kubernetes_version.as_deref(),
    ) {
        (Some(_), Some(_)) => Err(ApiError::Unprocessable {
            field: None,
            message: "change one thing at a time: control_plane_count or kubernetes_version".into(),
        }),
        (None, Some(version)) => Ok(Change::Version(
            version,
            patch.snapshot_first.unwrap_or(true),
        )),
        (Some(_), None) | (None, None) => Ok(Change::Scale(
            patch.validate().map_err(MembershipError::from)?,
        )),
    }
}

/// Scales the control plane (1, 3, 5 or 7 members, one at a time) or changes the Kubernetes
/// version it runs (one member at a time, within the version skew policy).
#[utoipa::path(
    patch, path = "/clusters/{id}", request_body = ClusterPatch,
    params(("id" = i64, Path), ("Idempotency-Key" = Option<String>, Header, description = "Retries with the same key and body return the first response; while it is still in progress, 409 `wait` with Retry-After")),
    responses(
        (status = 202, body = ClusterChange, description = "the change is under way: a `ScalingView` or an `UpgradeView`"),
        (status = 200, body = ClusterChange, description = "already that size, or already at that version"),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "another change runs, the cluster is not healthy, or the version skew policy forbids the version from where the cluster stands"),
        (status = 422, body = ErrorBody, description = "not a size or an offered version, or both asked at once"),
    ),
    security(("operator_token" = [])),
)]
pub async fn patch_cluster(
    State(state): State<AppState>,
    operator: Operator,
    ApiPath(cluster_id): ApiPath<i64>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ClusterPatch>,
) -> Result<Response, ApiError> {
    let key = super::idempotent::key(&headers)?;
    let body = serde_json::to_vec(&request).map_err(ApiError::internal)?;
    let change = change(&request)?;
    let scope = format!("PATCH /clusters/{cluster_id}\n");
    let idempotent = super::idempotent::Request {
        scope: &scope,
        body: &body,
        locate: None,
    };
    super::idempotent::run(&state, operator.org_id, key, idempotent, || async {
        let (status, view) = match change {
            Change::Scale(count) => {
                let scaling =
                    membership::scale(&state.membership(), operator.org_id, cluster_id, count)
                        .await?;
                let status = if scaling.desired == scaling.voters {
                    StatusCode::OK
                } else {
                    StatusCode::ACCEPTED
                };
                let view = ScalingView {
                    cluster_id,
                    desired: scaling.desired,
                    voters: scaling.voters,
                };
                (status, ClusterChange::Scaling(view))
            }
            Change::Version(version, snapshot_first) => {
                let upgrader = state.upgrader();
                let change = upgrade::start(
                    &upgrader,
                    operator.org_id,
                    cluster_id,
                    version,
                    snapshot_first,
                )
                .await?;
                let status = match change.started {
                    Started::Current { .. } => StatusCode::OK,
                    _ => StatusCode::ACCEPTED,
                };
                (
                    status,
                    ClusterChange::Upgrade(upgrade_view(cluster_id, &change)),
                )
            }
        };
        Ok((
            status,
            serde_json::to_vec(&view).map_err(ApiError::internal)?,
        ))
    })
    .await
}

fn upgrade_view(cluster_id: i64, change: &upgrade::Change) -> UpgradeView {
    let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
    let (upgrade, from, to, done, members) = match change.started {
        Started::Current { version, members } => (
            UpgradeState::Current,
            version,
            version,
            count(members),
            count(members),
        ),
        Started::Upgrading {
            from,
            to,
            done,
            members,
        } => (
            UpgradeState::Upgrading,
            from,
            to,
            count(done),
            count(members),
        ),
        Started::RollingBack { from, to } => (UpgradeState::RollingBack, from, to, 0, 0),
    };
    UpgradeView {
        cluster_id,
        upgrade,
        from_version: from.to_string(),
        to_version: to.to_string(),
        done,
        members,
        snapshot_id: change.snapshot_id,
    }
}
