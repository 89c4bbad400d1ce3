//! The console's actions — found a cluster, take a snapshot, renew certificates, scale the
//! control plane, upgrade, add and scale a worker pool, delete — each a page that says what
//! will happen and asks what the action needs (the page is the confirmation; a delete asks
//! for the cluster's name typed), and a post that, once [`Console::check_form`] has found the
//! form to be this session's own, becomes the API's request ([`super::client`]). A refusal is
//! shown on the form, in the API's words and with the API's status, the values sent kept; a
//! change made goes to the cluster's page, which follows it live.

use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use exk8s_api_types::{ClusterView, KubernetesVersionView};
use minijinja::context;
use serde::Serialize;

use super::client::{self, Answer, Call, Refusal};
use super::forms::{self, Action, Field, Known};
use super::render::{error_page, page};
use super::session::{Console, Form, MAX_FORM_BYTES};
use crate::app::AppState;
use crate::http::error::ApiError;
use crate::http::extract::ApiPath;

/// The pool a pool's action is about (`?pool=`).
#[derive(Debug, serde::Deserialize)]
pub(super) struct On {
    pool: Option<String>,
}

impl On {
    /// The pool, for the action `slug` names if it is a pool's (any other ignores it).
    fn pool(&self, slug: &str) -> Option<&str> {
        self.pool
            .as_deref()
            .filter(|_| slug == Action::ScalePool.slug())
    }
}

/// `GET /ui/clusters/new`: the founding form.
pub(super) async fn found_page(State(state): State<AppState>, console: Console) -> Response {
    match versions(&state, &console).await {
        Ok(versions) => {
            let known = Known {
                cluster: None,
                versions: &versions,
                pool: None,
            };
            let fields = forms::fields(Action::Found, &known);
            form_page(
                &console,
                StatusCode::OK,
                Action::Found,
                None,
                None,
                fields,
                None,
            )
        }
        Err(e) => error_page(Some(&console.operator.principal), &e),
    }
}

/// `POST /ui/clusters`: founds a cluster as `POST /clusters` would; its page next.
pub(super) async fn found(
    State(state): State<AppState>,
    console: Console,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let form = match sent_form(&console, &headers, &body) {
        Ok(form) => form,
        Err(e) => return error_page(Some(&console.operator.principal), &e),
    };
    let versions = match versions(&state, &console).await {
        Ok(versions) => versions,
        Err(e) => return error_page(Some(&console.operator.principal), &e),
    };
    let known = Known {
        cluster: None,
        versions: &versions,
        pool: None,
    };
    let mut fields = forms::fields(Action::Found, &known);
    forms::fill(&mut fields, |name| form.get(name).map(str::to_owned));
    let answer = match send(&state, &console, Action::Found, 0, None, &fields, &form).await {
        Ok(answer) => answer,
        Err(refusal) => {
            let status = StatusCode::UNPROCESSABLE_ENTITY;
            return form_page(
                &console,
                status,
                Action::Found,
                None,
                None,
                fields,
                Some(refusal),
            );
        }
    };
    /// The one field of the answer the console reads: the cluster's id, in the view of a
    /// founding that goes on (202) or in what a founding that ended at once made (201; the
    /// rest of that, a kubeconfig among it, is never held or shown: it is the CLI's to save).
    #[derive(serde::Deserialize)]
    struct Founded {
        #[serde(alias = "cluster_id")]
        id: i64,
    }
    match answer.json::<Founded>() {
        Ok(founded) => Redirect::to(&format!("/ui/clusters/{}", founded.id)).into_response(),
        Err(_) => {
            let refusal = Some(answer.refusal());
            form_page(
                &console,
                answer.status,
                Action::Found,
                None,
                None,
                fields,
                refusal,
            )
        }
    }
}

/// `GET /ui/clusters/{id}/actions/{action}`: the action's form, filled with what the cluster
/// has now.
pub(super) async fn action_page(
    State(state): State<AppState>,
    console: Console,
    ApiPath((id, slug)): ApiPath<(i64, String)>,
    Query(on): Query<On>,
) -> Response {
    let principal = console.operator.principal.clone();
    let shown = async {
        let pool = on.pool(&slug);
        let (action, cluster, versions, upgrades) = load(&state, &console, id, &slug, pool).await?;
        let known = Known {
            cluster: Some(&cluster),
            versions: &versions,
            pool,
        };
        let fields = forms::fields(action, &known);
        Ok::<_, ApiError>(form_page(
            &console,
            StatusCode::OK,
            action,
            Some(Target {
                cluster: &cluster,
                upgrades: &upgrades,
            }),
            pool,
            fields,
            None,
        ))
    };
    shown
        .await
        .unwrap_or_else(|e| error_page(Some(&principal), &e))
}

/// `POST /ui/clusters/{id}/actions/{action}`: the action made; the cluster's page next (the
/// list after a delete), or the form again with the API's refusal.
pub(super) async fn act(
    State(state): State<AppState>,
    console: Console,
    ApiPath((id, slug)): ApiPath<(i64, String)>,
    Query(on): Query<On>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let form = match sent_form(&console, &headers, &body) {
        Ok(form) => form,
        Err(e) => return error_page(Some(&console.operator.principal), &e),
    };
    let pool = on.pool(&slug);
    let (action, cluster, versions, upgrades) = match load(&state, &console, id, &slug, pool).await
    {
        Ok(loaded) => loaded,
        Err(e) => return error_page(Some(&console.operator.principal), &e),
    };
    let known = Known {
        cluster: Some(&cluster),
        versions: &versions,
        pool,
    };
    let mut fields = forms::fields(action, &known);
    forms::fill(&mut fields, |name| form.get(name).map(str::to_owned));
    let c = Some(Target {
        cluster: &cluster,
        upgrades: &upgrades,
    });
    if action == Action::Delete && form.get("confirm").map(str::trim) != Some(cluster.name.as_str())
    {
        let refusal = Refusal {
            message: format!("type the cluster's name, {}, to delete it", cluster.name),
            field: Some("confirm".to_owned()),
        };
        let status = StatusCode::UNPROCESSABLE_ENTITY;
        return form_page(&console, status, action, c, pool, fields, Some(refusal));
    }
    match send(&state, &console, action, id, pool, &fields, &form).await {
        Ok(answer) if answer.status.is_success() => {
            let next = if action == Action::Delete {
                "/ui/clusters".to_owned()
            } else {
                format!("/ui/clusters/{id}")
            };
            Redirect::to(&next).into_response()
        }
        Ok(answer) => {
            let refusal = Some(answer.refusal());
            form_page(&console, answer.status, action, c, pool, fields, refusal)
        }
        Err(refusal) => {
            let status = StatusCode::UNPROCESSABLE_ENTITY;
            form_page(&console, status, action, c, pool, fields, Some(refusal))
        }
    }
}

/// The form in `body` if it is this session's own.
fn sent_form(console: &Console, headers: &HeaderMap, body: &[u8]) -> Result<Form, ApiError> {
    let form = Form::parse(body).map_err(|_| ApiError::PayloadTooLarge(MAX_FORM_BYTES))?;
    console.check_form(headers, &form)?;
    Ok(form)
}

/// What an action on cluster `id` needs: the action `slug` names (an unknown one, or a pool
/// the cluster does not have, is not found), the cluster as the operator's token sees it
/// (another org's is not found) and, for the actions that choose one, the releases offered.
async fn load(
    state: &AppState,
    console: &Console,
    id: i64,
    slug: &str,
    pool: Option<&str>,
) -> Result<
    (
        Action,
        ClusterView,
        Vec<KubernetesVersionView>,
        Vec<UpgradeChoice>,
    ),
    ApiError,
> {
    let action = Action::of_slug(slug).ok_or(ApiError::NotFound)?;
    let cluster: ClusterView = client::call(state, console, Call::get(format!("/clusters/{id}")))
        .await
        .json()?;
    if action == Action::ScalePool {
        let known = pool
            .filter(|p| forms::pool_name(p))
            .is_some_and(|p| cluster.node_pools.iter().any(|have| have.name == p));
        if !known {
            return Err(ApiError::NotFound);
        }
    }
    let (versions, upgrades) = if action == Action::Upgrade {
        let upgrades = upgrade_choices(state, console, id).await?;
        (versions(state, console).await?, upgrades)
    } else {
        (Vec::new(), Vec::new())
    };
    Ok((action, cluster, versions, upgrades))
}

/// A release an upgrade may go to, or why the skew policy refuses it.
#[derive(Debug, Serialize)]
pub(super) struct UpgradeChoice {
    release: String,
    refused: Option<String>,
}

/// The releases the API offers for cluster `id`'s upgrade, each with the skew policy's verdict.
pub(super) async fn upgrade_choices(
    state: &AppState,
    console: &Console,
    id: i64,
) -> Result<Vec<UpgradeChoice>, ApiError> {
    Ok(
        crate::upgrade::choices(&state.upgrader(), console.operator.org_id, id)
            .await
            .map_err(ApiError::from)?
            .into_iter()
            .map(|(release, refused)| UpgradeChoice {
                release: release.to_string(),
                refused,
            })
            .collect(),
    )
}

/// The cluster an action's page is about, and the releases its upgrade form offers.
#[derive(Clone, Copy)]
struct Target<'a> {
    cluster: &'a ClusterView,
    upgrades: &'a [UpgradeChoice],
}

/// The releases the API offers.
async fn versions(
    state: &AppState,
    console: &Console,
) -> Result<Vec<KubernetesVersionView>, ApiError> {
    client::call(state, console, Call::get("/kubernetes-versions".to_owned()))
        .await
        .json()
}

/// `action`'s API request from the filled `fields`, made; a field the console itself cannot
/// turn into the request (a number that is not one) is refused without a call.
async fn send(
    state: &AppState,
    console: &Console,
    action: Action,
    id: i64,
    pool: Option<&str>,
    fields: &[Field],
    form: &Form,
) -> Result<Answer, Refusal> {
    let body = forms::body(fields)?;
    let (method, path, sends) = forms::request(action, id, pool);
    let call = Call {
        method,
        path,
        body: sends.then_some(body),
        attempt: form.get("attempt"),
    };
    Ok(client::call(state, console, call).await)
}

/// The action's form page: what it does, its fields, and the refusal of the last try if any.
/// Every rendering carries a new attempt (the `Idempotency-Key` of its post: the same form
/// sent twice makes one change; a corrected form is a new request).
fn form_page(
    console: &Console,
    status: StatusCode,
    action: Action,
    target: Option<Target<'_>>,
    pool: Option<&str>,
    fields: Vec<Field>,
    refusal: Option<Refusal>,
) -> Response {
    let cluster = target.map(|t| t.cluster);
    let upgrades = target.map_or(&[][..], |t| t.upgrades);
    page(
        status,
        "action.html",
        context! {
            principal => console.operator.principal.as_str(),
            words => action.words(),
            c => cluster.map(|c| context! { id => c.id, name => c.name.as_str() }),
            slug => action.slug(),
            pool,
            fields,
            refusal,
            upgrades,
            form_key => console.form_key(),
            attempt => uuid::Uuid::new_v4().to_string(),
        },
    )
}
