//! `GET /kubernetes-versions`: the Kubernetes releases this API installs, and what a node of
//! each runs and downloads.

use axum::Json;
use axum::extract::State;
use exk8s_api_types::{DownloadView, KubernetesVersionView};

use super::error::{ApiError, ErrorBody};
use super::extract::Operator;
use crate::app::AppState;
use crate::upgrade::versions::{Offered, offered};

fn view(o: Offered) -> KubernetesVersionView {
    let v = o.versions;
    KubernetesVersionView {
        version: v.kubernetes.to_string(),
        default: o.default,
        etcd: v.etcd.to_string(),
        coredns: v.coredns.to_string(),
        pause: v.pause.to_string(),
        cilium_chart: v.cilium_chart.to_string(),
        flannel: v.flannel.to_string(),
        helm: v.helm.to_string(),
        downloads: o
            .downloads
            .into_iter()
            .map(|a| DownloadView {
                name: a.name.to_string(),
                version: a.version.to_string(),
                url: a.url.to_string(),
                sha256: a.sha256.map(|d| d.to_hex()),
            })
            .collect(),
    }
}

/// The Kubernetes releases new clusters (and upgrades) may ask for, the default first.
#[utoipa::path(
    get, path = "/kubernetes-versions",
    responses((status = 200, body = Vec<KubernetesVersionView>), (status = 401, body = ErrorBody)),
    security(("operator_token" = [])),
)]
pub async fn kubernetes_versions(
    State(state): State<AppState>,
    _operator: Operator,
) -> Result<Json<Vec<KubernetesVersionView>>, ApiError> {
    let offered = offered(&state.config.kubernetes_versions, &state.config.artifacts)
        .map_err(ApiError::internal)?;
    Ok(Json(offered.into_iter().map(view).collect()))
}
