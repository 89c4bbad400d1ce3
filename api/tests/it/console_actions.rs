//! The console's actions on SQLite and PostgreSQL, posted as a browser posts its forms: a
//! form is taken only from this origin and with its session's form key (none, another
//! session's, or another site's is refused and changes nothing); a sent form becomes the
//! API's request, so a refusal is the API's own message and status, shown on the form with
//! what was typed; a form sent twice founds one cluster; a delete wants the name typed;
//! another org's cluster, an unknown action or pool is not found.

use reqwest::StatusCode;
use reqwest::header::LOCATION;

use crate::app::{Backend, TestApp, both_backends, json_of, spawn_app};
use crate::console::{browser, found_as, login, page, session};

/// The value of the hidden field `name` on a form page.
fn hidden(html: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let at = html
        .find(&marker)
        .unwrap_or_else(|| panic!("no {name}: {html}"))
        + marker.len();
    html[at..].split('"').next().unwrap().to_owned()
}

/// `POST path` with the session `cookie`, from `origin`, the form `fields`.
async fn post(
    app: &TestApp,
    path: &str,
    cookie: &str,
    origin: &str,
    fields: &[(&str, &str)],
) -> reqwest::Response {
    let body: String = form_urlencoded::Serializer::new(String::new())
        .extend_pairs(fields)
        .finish();
    browser()
        .post(format!("{}{path}", app.url))
        .header("cookie", cookie)
        .header("origin", origin)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(body)
        .send()
        .await
        .unwrap()
}

/// The `good` fields with a form `key` and an `attempt`.
fn with<'a>(
    good: &[(&'a str, &'a str)],
    key: &'a str,
    attempt: &'a str,
) -> Vec<(&'a str, &'a str)> {
    let mut fields = good.to_vec();
    fields.extend([("form_key", key), ("attempt", attempt)]);
    fields
}

/// The org's clusters' names, as the API lists them.
async fn names(app: &TestApp) -> Vec<String> {
    let list = json_of(app.get("/clusters").send().await.unwrap()).await;
    list.as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

async fn the_console_acts_through_the_api_with_its_own_forms(backend: Backend) {
    let app = spawn_app(backend).await;
    let ours = json_of(app.found(1, serde_json::json!({"name": "shop"})).await).await;
    let ours = ours["cluster_id"].as_i64().unwrap();
    let (theirs, theirs_token) = found_as(&app, 8, "theirs").await;
    let origin = app.url.clone();
    let (cookie, _) = session(&login(&app, &app.token, Some(&origin)).await);
    let (their_cookie, _) = session(&login(&app, &theirs_token, Some(&origin)).await);

    // The founding form, from the list; every form carries the session's key.
    let list = page(&app, "/ui/clusters", &cookie)
        .await
        .text()
        .await
        .unwrap();
    assert!(list.contains("href=\"/ui/clusters/new\""), "{list}");
    let form = page(&app, "/ui/clusters/new", &cookie).await;
    assert_eq!(form.status(), StatusCode::OK);
    let form = form.text().await.unwrap();
    for shown in [
        "Found a cluster",
        "name=\"control_plane_image_id\"",
        "<option value=\"flannel\"",
    ] {
        assert!(form.contains(shown), "{shown}: {form}");
    }
    let key = hidden(&form, "form_key");
    assert_eq!(key.len(), 64, "{key}");
    assert!(!form.contains(&app.token), "the token is never on a page");
    let their_key = hidden(
        &page(&app, "/ui/clusters/new", &their_cookie)
            .await
            .text()
            .await
            .unwrap(),
        "form_key",
    );
    assert_ne!(key, their_key);

    let good = [
        ("name", "made-here"),
        ("control_plane_count", "1"),
        ("control_plane_image_id", "42"),
        ("control_plane_instance_type", "e2.medium"),
        ("subnet_id", "5"),
    ];
    // Without the key, with another session's, or from another site: refused, nothing made.
    for (fields, from) in [
        (with(&good, "", "a-1"), origin.as_str()),
        (with(&good, &their_key, "a-1"), origin.as_str()),
        (with(&good, &key, "a-1"), "https://evil.example"),
    ] {
        let refused = post(&app, "/ui/clusters", &cookie, from, &fields).await;
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{from}");
        let said = refused.text().await.unwrap();
        assert!(said.contains("role=\"alert\""), "{said}");
    }
    assert!(!names(&app).await.contains(&"made-here".to_owned()));

    // The API's own refusal, on the form, with what was typed kept.
    let missing = post(
        &app,
        "/ui/clusters",
        &cookie,
        &origin,
        &[
            ("form_key", &key),
            ("attempt", "b-1"),
            ("name", "half-made"),
            ("subnet_id", "5"),
        ],
    )
    .await;
    assert_eq!(missing.status(), StatusCode::BAD_REQUEST);
    let missing = missing.text().await.unwrap();
    assert!(
        missing.contains("control_plane_image_id is required")
            && missing.contains("value=\"half-made\""),
        "{missing}"
    );
    let not_a_number = post(
        &app,
        "/ui/clusters",
        &cookie,
        &origin,
        &[
            ("form_key", &key),
            ("attempt", "b-2"),
            ("subnet_id", "five"),
        ],
    )
    .await;
    assert_eq!(not_a_number.status(), StatusCode::UNPROCESSABLE_ENTITY);
    let not_a_number = not_a_number.text().await.unwrap();
    assert!(
        not_a_number.contains("subnet_id must be a whole number, got &quot;five&quot;")
            && not_a_number.contains("aria-invalid=\"true\""),
        "{not_a_number}"
    );

    // A good form founds the cluster and leads to its page; sent again, it founds no other.
    let pairs = with(&good, &key, "c-1");
    let made = post(&app, "/ui/clusters", &cookie, &origin, &pairs).await;
    assert_eq!(
        made.status(),
        StatusCode::SEE_OTHER,
        "{:?}",
        made.text().await
    );
    let location = made.headers()[LOCATION].to_str().unwrap().to_owned();
    let again = post(&app, "/ui/clusters", &cookie, &origin, &pairs).await;
    assert_eq!(again.status(), StatusCode::SEE_OTHER);
    assert_eq!(again.headers()[LOCATION].to_str().unwrap(), location);
    let made_id: i64 = location
        .strip_prefix("/ui/clusters/")
        .unwrap()
        .parse()
        .unwrap();
    let view = json_of(
        app.get(&format!("/clusters/{made_id}"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(view["name"], "made-here");
    assert_eq!(
        names(&app)
            .await
            .iter()
            .filter(|n| *n == "made-here")
            .count(),
        1
    );

    // A cluster's page offers its actions; each form says what it will do.
    let one = page(&app, &format!("/ui/clusters/{ours}"), &cookie)
        .await
        .text()
        .await
        .unwrap();
    for action in [
        "snapshot", "renew", "scale", "upgrade", "add-pool", "delete",
    ] {
        let href = format!("/ui/clusters/{ours}/actions/{action}");
        assert!(one.contains(&format!("href=\"{href}\"")), "{action}: {one}");
        let form = page(&app, &href, &cookie).await;
        assert_eq!(form.status(), StatusCode::OK, "{action}");
        let form = form.text().await.unwrap();
        assert!(
            form.contains(&format!("action=\"{href}\"")) && form.contains(&key),
            "{form}"
        );
    }
    let upgrade = page(
        &app,
        &format!("/ui/clusters/{ours}/actions/upgrade"),
        &cookie,
    )
    .await
    .text()
    .await
    .unwrap();
    let version = view["kubernetes_version"].as_str().unwrap();
    assert!(
        upgrade.contains(&format!("<option value=\"{version}\" selected>")),
        "{upgrade}"
    );
    // The releases offered besides the one it runs, each judged by the skew policy in its words.
    assert_eq!(
        version, "v1.35.3",
        "the test API offers v1.35.3 and v1.34.6"
    );
    assert!(
        upgrade.contains(
            "<tr><th scope=\"row\">v1.34.6</th><td>No: the control plane runs v1.35.3; going \
             down a minor to v1.34.6 is not supported</td></tr>"
        ),
        "{upgrade}"
    );
    assert!(
        !upgrade.contains("<th scope=\"row\">v1.35.3</th>"),
        "{upgrade}"
    );

    // Renewal made: the cluster's page next, and the API has a rollout going.
    let before = json_of(app.get(&format!("/clusters/{ours}")).send().await.unwrap()).await;
    let renewed = post(
        &app,
        &format!("/ui/clusters/{ours}/actions/renew"),
        &cookie,
        &origin,
        &[("form_key", &key), ("attempt", "d-1")],
    )
    .await;
    assert_eq!(
        renewed.status(),
        StatusCode::SEE_OTHER,
        "{:?}",
        renewed.text().await
    );
    assert_eq!(
        renewed.headers()[LOCATION].to_str().unwrap(),
        format!("/ui/clusters/{ours}")
    );
    let after = json_of(app.get(&format!("/clusters/{ours}")).send().await.unwrap()).await;
    assert!(
        after["nodes"][0]["desired_generation"].as_i64()
            > before["nodes"][0]["desired_generation"].as_i64(),
        "{before} → {after}"
    );

    // A size the API does not take: its words and status, on the form.
    let scaled = post(
        &app,
        &format!("/ui/clusters/{ours}/actions/scale"),
        &cookie,
        &origin,
        &[
            ("form_key", &key),
            ("attempt", "e-1"),
            ("control_plane_count", "2"),
        ],
    )
    .await;
    let status = scaled.status();
    let scaled = scaled.text().await.unwrap();
    assert!(status.is_client_error(), "{status}: {scaled}");
    assert!(
        scaled.contains("control_plane_count must be 1, 3, 5 or 7"),
        "{scaled}"
    );

    // Not found: another org's cluster, an unknown action, a pool the cluster does not have.
    for path in [
        format!("/ui/clusters/{theirs}/actions/snapshot"),
        format!("/ui/clusters/{ours}/actions/explode"),
        format!("/ui/clusters/{ours}/actions/scale-pool?pool=none-such"),
        format!("/ui/clusters/{ours}/actions/scale-pool?pool=..%2F..%2Fclusters"),
    ] {
        assert_eq!(
            page(&app, &path, &cookie).await.status(),
            StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    let hidden_post = post(
        &app,
        &format!("/ui/clusters/{theirs}/actions/delete"),
        &cookie,
        &origin,
        &[("form_key", &key), ("confirm", "theirs")],
    )
    .await;
    assert_eq!(hidden_post.status(), StatusCode::NOT_FOUND);

    // A CA rotation under way shows on the certificates page, its phase marked.
    let calm = page(&app, &format!("/ui/clusters/{ours}/certificates"), &cookie)
        .await
        .text()
        .await
        .unwrap();
    assert!(!calm.contains("being rotated"), "{calm}");
    let rotating = crate::rotation::rotate(&app, ours, serde_json::json!({"ca": "cluster"})).await;
    assert!(rotating.status().is_success(), "{rotating:?}");
    let lives = page(&app, &format!("/ui/clusters/{ours}/certificates"), &cookie)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        lives.contains("The cluster CA is being rotated")
            && lives.contains("aria-current=\"step\">trust-both (now)</li>")
            && lives.contains("<li class=\"step-next\">drop-old</li>"),
        "{lives}"
    );

    // Signed out, a form leads to the login page and changes nothing.
    let out = post(
        &app,
        &format!("/ui/clusters/{ours}/actions/delete"),
        "",
        &origin,
        &[("form_key", &key), ("confirm", "shop")],
    )
    .await;
    assert_eq!(out.status(), StatusCode::SEE_OTHER);
    assert_eq!(out.headers()[LOCATION], "/ui/login");
    assert!(names(&app).await.contains(&"shop".to_owned()));

    // A delete wants the cluster's name typed; with it, the cluster goes.
    let unconfirmed = post(
        &app,
        &format!("/ui/clusters/{ours}/actions/delete"),
        &cookie,
        &origin,
        &[("form_key", &key), ("confirm", "made-here")],
    )
    .await;
    assert_eq!(unconfirmed.status(), StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        unconfirmed
            .text()
            .await
            .unwrap()
            .contains("type the cluster&#x27;s name, shop, to delete it")
    );
    assert!(names(&app).await.contains(&"shop".to_owned()));
    let deleted = post(
        &app,
        &format!("/ui/clusters/{ours}/actions/delete"),
        &cookie,
        &origin,
        &[("form_key", &key), ("confirm", "shop")],
    )
    .await;
    assert_eq!(
        deleted.status(),
        StatusCode::SEE_OTHER,
        "{:?}",
        deleted.text().await
    );
    assert_eq!(deleted.headers()[LOCATION], "/ui/clusters");
    assert!(!names(&app).await.contains(&"shop".to_owned()));
}

both_backends!(the_console_acts_through_the_api_with_its_own_forms);
