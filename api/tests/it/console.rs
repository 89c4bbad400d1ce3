//! The operator console (`/ui`) on SQLite and PostgreSQL, over HTTP as a browser uses it: the
//! login form keeps the operator's token in an `HttpOnly`, `SameSite=Strict` cookie scoped to
//! `/ui` (a bad, expired-scope or cross-site login is refused on the form, saying why); the
//! pages list the org's clusters and show one's conditions and nodes, never another org's;
//! every answer carries the strict Content-Security-Policy; what the pages show is escaped;
//! a revoked token's session ends; logging out clears the cookie.

use exk8s_api::tokens::{self, Scope};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, LOCATION, SET_COOKIE};

use crate::app::{Backend, TestApp, both_backends, json_of, operator_token, spawn_app, valid_body};

pub(crate) fn browser() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `POST /ui/login` with `token`, as the login form sends it, from `origin` if given.
pub(crate) async fn login(app: &TestApp, token: &str, origin: Option<&str>) -> reqwest::Response {
    let mut request = browser()
        .post(format!("{}/ui/login", app.url))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(format!("token={token}"));
    if let Some(origin) = origin {
        request = request.header("origin", origin);
    }
    request.send().await.unwrap()
}

/// `GET path` with the session cookie `cookie`.
pub(crate) async fn page(app: &TestApp, path: &str, cookie: &str) -> reqwest::Response {
    browser()
        .get(format!("{}{path}", app.url))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap()
}

/// The `name=value` of a response's session cookie, and its attributes.
pub(crate) fn session(response: &reqwest::Response) -> (String, String) {
    let set = response.headers()[SET_COOKIE].to_str().unwrap().to_owned();
    let (pair, attributes) = set.split_once(';').unwrap();
    (pair.to_owned(), attributes.to_owned())
}

/// Founds a one-node cluster `name` with `token` (another org's, in these tests): its id.
pub(crate) async fn found_with(app: &TestApp, token: &str, name: &str) -> i64 {
    let mut body = valid_body(1);
    body["name"] = name.into();
    let founded = browser()
        .post(format!("{}/clusters", app.url))
        .bearer_auth(token)
        .header(crate::app::WAIT.0, crate::app::WAIT.1)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(founded.status(), StatusCode::CREATED);
    json_of(founded).await["cluster_id"].as_i64().unwrap()
}

/// A token of `org` and a one-node cluster `name` it founded: the cluster's id and the token.
pub(crate) async fn found_as(app: &TestApp, org: i64, name: &str) -> (i64, String) {
    let token = operator_token(&app.state, org, Scope::Operator, 3600).await;
    (found_with(app, &token, name).await, token)
}

async fn the_console_shows_the_orgs_clusters_to_its_operators(backend: Backend) {
    let app = spawn_app(backend).await;
    let ours = json_of(app.found(1, serde_json::json!({"name": "shop"})).await).await;
    let ours = ours["cluster_id"].as_i64().unwrap();
    // Another org's cluster.
    let (theirs, theirs_token) = found_as(&app, 8, "theirs").await;

    // Signed out: every page leads to the login form, which carries the policy.
    let home = browser()
        .get(format!("{}/ui", app.url))
        .send()
        .await
        .unwrap();
    assert_eq!(home.status(), StatusCode::SEE_OTHER);
    assert_eq!(home.headers()[LOCATION], "/ui/clusters");
    let out = page(&app, "/ui/clusters", "").await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert_eq!(out.headers()[LOCATION], "/ui/login");
    let form = page(&app, "/ui/login", "").await;
    assert_eq!(form.status(), StatusCode::OK);
    let csp = form.headers()[CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        csp.contains("default-src 'none'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert!(!form.text().await.unwrap().contains("<script"), "no script");

    // Refused logins say why, on the form.
    let bad = login(&app, "exk8s_op_not-a-token", None).await;
    assert_eq!(bad.status(), StatusCode::UNAUTHORIZED);
    assert!(bad.headers().get(SET_COOKIE).is_none());
    assert!(
        bad.text()
            .await
            .unwrap()
            .contains("unknown, expired or revoked")
    );
    let bootstrap = operator_token(&app.state, 7, Scope::Bootstrap, 3600).await;
    let scoped = login(&app, &bootstrap, None).await;
    assert_eq!(scoped.status(), StatusCode::FORBIDDEN);
    assert!(scoped.text().await.unwrap().contains("scope"));
    // Nor does a bootstrap token put straight into the cookie open a page.
    let planted = page(&app, "/ui/clusters", &format!("exk8s_console={bootstrap}")).await;
    assert_eq!(planted.status(), StatusCode::SEE_OTHER);
    assert_eq!(planted.headers()[LOCATION], "/ui/login");
    assert!(session(&planted).1.contains("Max-Age=0"));
    let forged = login(&app, &app.token, Some("https://evil.example")).await;
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert!(forged.headers().get(SET_COOKIE).is_none());
    let odd = login(&app, "a%3Bb", None).await;
    assert_eq!(odd.status(), StatusCode::UNAUTHORIZED);

    // The operator's token logs in: kept where no page script reads it.
    let origin = app.url.clone();
    let signed = login(&app, &app.token, Some(&origin)).await;
    assert_eq!(signed.status(), StatusCode::SEE_OTHER, "{signed:?}");
    assert_eq!(signed.headers()[LOCATION], "/ui/clusters");
    let (cookie, attributes) = session(&signed);
    for wanted in ["Path=/ui", "HttpOnly", "SameSite=Strict", "Max-Age="] {
        assert!(attributes.contains(wanted), "{attributes}");
    }
    let max_age: i64 = attributes
        .split("Max-Age=")
        .nth(1)
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=12 * 3600).contains(&max_age), "{max_age}");

    let list = page(&app, "/ui/clusters", &cookie).await;
    assert_eq!(list.status(), StatusCode::OK);
    assert!(list.headers().contains_key(CONTENT_SECURITY_POLICY));
    let list = list.text().await.unwrap();
    assert!(
        list.contains(&format!("href=\"/ui/clusters/{ours}\">shop</a>")),
        "{list}"
    );
    assert!(!list.contains("theirs"), "another org's cluster: {list}");
    let one = page(&app, &format!("/ui/clusters/{ours}"), &cookie).await;
    assert_eq!(one.status(), StatusCode::OK);
    let one = one.text().await.unwrap();
    for shown in ["Available", "EtcdClusterHealthy", "control-plane", "Nodes"] {
        assert!(one.contains(shown), "{shown}: {one}");
    }
    // The releases it may be upgraded to, as the skew policy judges them; the default health
    // policy it is judged by; a node that has not reported yet.
    assert!(
        one.contains(
            "<tr><th scope=\"row\">v1.34.6</th><td>No: the control plane runs v1.35.3; going \
             down a minor to v1.34.6 is not supported</td></tr>"
        ) && one.contains("Remediation is <strong>on</strong>")
            && one.contains("<td class=\"health\">not reported</td>")
            && one.contains("<p>Never restored.</p>"),
        "{one}"
    );
    // Its latest changes, newest first: the founding's phases and its node.
    let changes = &one[one.find("Recent changes").expect("the changes")..];
    let founded = changes.find("<td>founded</td>").expect(changes);
    let provisioning = changes.find("<td>provisioning</td>").expect(changes);
    assert!(founded < provisioning, "newest first: {changes}");
    assert!(changes.contains("<th scope=\"row\">node</th>"), "{changes}");
    // Its certificates, each a bar of its life on a timeline.
    let lives = page(&app, &format!("/ui/clusters/{ours}/certificates"), &cookie).await;
    assert_eq!(lives.status(), StatusCode::OK);
    let lives = lives.text().await.unwrap();
    for shown in [
        "Certificates of shop",
        "Certificate authorities",
        ">cluster-ca</th>",
        "<svg class=\"life\"",
    ] {
        assert!(lives.contains(shown), "{shown}: {lives}");
    }
    assert!(one.contains(&format!("href=\"/ui/clusters/{ours}/certificates\"")));
    let hidden_lives = page(
        &app,
        &format!("/ui/clusters/{theirs}/certificates"),
        &cookie,
    )
    .await;
    assert_eq!(hidden_lives.status(), StatusCode::NOT_FOUND);
    let hidden = page(&app, &format!("/ui/clusters/{theirs}"), &cookie).await;
    assert_eq!(hidden.status(), StatusCode::NOT_FOUND);
    assert!(hidden.text().await.unwrap().contains("not found"));
    let style = page(&app, "/ui/style.css", "").await;
    assert_eq!(style.headers()["content-type"], "text/css; charset=utf-8");
    let script = page(&app, "/ui/live.js", "").await;
    assert_eq!(
        script.headers()["content-type"],
        "text/javascript; charset=utf-8"
    );

    // The cluster page's stream: the cluster's events for the cookie's operator, as the API
    // streams them to its token; none for another org's cluster or without a session.
    let mut live = page(&app, &format!("/ui/clusters/{ours}/events"), &cookie).await;
    assert_eq!(live.status(), StatusCode::OK);
    assert_eq!(live.headers()["content-type"], "text/event-stream");
    let mut first = String::new();
    while !first.contains("\n\n") {
        let chunk = live.chunk().await.unwrap().expect("the stream stays open");
        first.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(first.contains("\nevent: cluster\n"), "{first}");
    drop(live);
    // The page starts its stream after the last change it shows; a start it could not have
    // shown is refused.
    let one_page = page(&app, &format!("/ui/clusters/{ours}"), &cookie)
        .await
        .text()
        .await
        .unwrap();
    let marker = format!("data-live=\"/ui/clusters/{ours}/events?after=");
    let after: i64 = one_page[one_page.find(&marker).expect(&one_page) + marker.len()..]
        .split('"')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(after > 0, "{after}");
    for bad in [-1, after + 1000] {
        let refused = page(
            &app,
            &format!("/ui/clusters/{ours}/events?after={bad}"),
            &cookie,
        )
        .await;
        assert_eq!(refused.status(), StatusCode::BAD_REQUEST, "after={bad}");
    }
    // The list's stream: a `changed` event for each of the org's clusters that changes, none
    // for another org's (founded first, so it would come first).
    let mut org = page(&app, "/ui/events", &cookie).await;
    assert_eq!(org.status(), StatusCode::OK);
    assert_eq!(org.headers()["content-type"], "text/event-stream");
    found_with(&app, &theirs_token, "theirs-2").await;
    let second = json_of(app.found(1, serde_json::json!({"name": "shop-2"})).await).await;
    let second = second["cluster_id"].as_i64().unwrap();
    let mut said = String::new();
    let first_change = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        loop {
            if let Some(at) = said.find("event: changed\ndata: ") {
                let rest = &said[at + "event: changed\ndata: ".len()..];
                if let Some((id, _)) = rest.split_once('\n') {
                    return id.to_owned();
                }
            }
            let chunk = org.chunk().await.unwrap().expect("the stream stays open");
            said.push_str(&String::from_utf8_lossy(&chunk));
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no change of the org's new cluster {second}: {said}"));
    assert_eq!(first_change, second.to_string(), "{said}");
    drop(org);
    let hidden_stream = page(&app, &format!("/ui/clusters/{theirs}/events"), &cookie).await;
    assert_eq!(hidden_stream.status(), StatusCode::NOT_FOUND);
    let signed_out = page(&app, &format!("/ui/clusters/{ours}/events"), "").await;
    assert_eq!(signed_out.status(), StatusCode::SEE_OTHER);
    assert_eq!(signed_out.headers()[LOCATION], "/ui/login");

    // What a page shows is escaped: a principal with markup in it.
    let marked = tokens::generate("exk8s_op").unwrap().to_string();
    let now = exk8s_api::db::now();
    exk8s_api::db::tokens::insert_api_token(
        &app.state.db.pool,
        &tokens::hash(&marked),
        7,
        "<b>ops</b>",
        Scope::Operator,
        now,
        now + 3600,
    )
    .await
    .unwrap();
    let (marked_cookie, _) = session(&login(&app, &marked, None).await);
    let escaped = page(&app, "/ui/clusters", &marked_cookie)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        escaped.contains("&lt;b&gt;ops") && !escaped.contains("<b>ops"),
        "{escaped}"
    );

    // A revoked token's session ends at its next page.
    let id = exk8s_api::db::tokens::find_api_token(&app.state.db.pool, &tokens::hash(&marked))
        .await
        .unwrap()
        .unwrap()
        .id;
    exk8s_api::db::tokens::revoke_api_token(&app.state.db.pool, id)
        .await
        .unwrap();
    let ended = page(&app, "/ui/clusters", &marked_cookie).await;
    assert_eq!(ended.status(), StatusCode::SEE_OTHER);
    assert_eq!(ended.headers()[LOCATION], "/ui/login");
    assert!(session(&ended).1.contains("Max-Age=0"));

    // Logging out clears the cookie.
    let gone = browser()
        .post(format!("{}/ui/logout", app.url))
        .header("cookie", &cookie)
        .header("origin", &origin)
        .send()
        .await
        .unwrap();
    assert_eq!(gone.status(), StatusCode::SEE_OTHER);
    assert_eq!(gone.headers()[LOCATION], "/ui/login");
    let (cleared, attributes) = session(&gone);
    assert_eq!(cleared, "exk8s_console=");
    assert!(attributes.contains("Max-Age=0"), "{attributes}");
}

both_backends!(the_console_shows_the_orgs_clusters_to_its_operators);

/// The list's stream (`/ui/events`) wants a session, and ends once its token is revoked (the
/// token is checked again every `event_stream_token_recheck`, short here).
async fn the_lists_stream_wants_a_session_and_ends_with_its_token(backend: Backend) {
    let config = exk8s_api::app::ApiConfig {
        event_stream_token_recheck: std::time::Duration::from_millis(200),
        ..crate::app::test_config()
    };
    let app = crate::app::spawn_with(backend, config, None).await;
    let signed_out = page(&app, "/ui/events", "").await;
    assert_eq!(signed_out.status(), StatusCode::SEE_OTHER);
    assert_eq!(signed_out.headers()[LOCATION], "/ui/login");

    let token = operator_token(&app.state, 1, Scope::Operator, 3600).await;
    let (cookie, _) = session(&login(&app, &token, None).await);
    let mut stream = page(&app, "/ui/events", &cookie).await;
    assert_eq!(stream.status(), StatusCode::OK);
    let id = exk8s_api::db::tokens::find_api_token(&app.state.db.pool, &tokens::hash(&token))
        .await
        .unwrap()
        .unwrap()
        .id;
    assert!(
        exk8s_api::db::tokens::revoke_api_token(&app.state.db.pool, id)
            .await
            .unwrap()
    );
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), async {
        while stream.chunk().await.unwrap().is_some() {}
    })
    .await;
    assert!(ended.is_ok(), "the revoked token's stream stays open");
}

both_backends!(the_lists_stream_wants_a_session_and_ends_with_its_token);
