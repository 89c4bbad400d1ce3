//! Rendering the console's pages: the templates, compiled into the binary once and
//! HTML-escaped by their `.html` names, filled and answered with a status.

use std::sync::OnceLock;

use axum::http::StatusCode;
use axum::response::{Html, IntoResponse, Response};
use minijinja::{Environment, UndefinedBehavior, context};
use serde::Serialize;

use crate::http::error::ApiError;

const TEMPLATES: [(&str, &str); 8] = [
    ("layout.html", include_str!("templates/layout.html")),
    ("login.html", include_str!("templates/login.html")),
    ("clusters.html", include_str!("templates/clusters.html")),
    ("cluster.html", include_str!("templates/cluster.html")),
    (
        "certificates.html",
        include_str!("templates/certificates.html"),
    ),
    ("error.html", include_str!("templates/error.html")),
    ("action.html", include_str!("templates/action.html")),
    ("upgrades.html", include_str!("templates/upgrades.html")),
];

fn environment() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        // Lenient: a view leaves out what it does not have (`error_message`, a node's
        // version), which a page shows as nothing.
        let mut env = Environment::new();
        env.set_undefined_behavior(UndefinedBehavior::Lenient);
        // Unix seconds (a node's last request) as the RFC 3339 a `<time>` carries.
        env.add_filter("rfc3339", crate::http::conditions::rfc3339);
        for (name, source) in TEMPLATES {
            // Compiled into the binary and rendered by the console's tests: a syntax error is
            // a build defect, caught before it could ship.
            if let Err(e) = env.add_template(name, source) {
                panic!("embedded console template {name} does not compile: {e:#}");
            }
        }
        env
    })
}

/// `name` rendered with `ctx`, as a page with `status`.
pub(super) fn page(status: StatusCode, name: &str, ctx: impl Serialize) -> Response {
    let rendered = environment().get_template(name).and_then(|t| t.render(ctx));
    match rendered {
        Ok(html) => (status, Html(html)).into_response(),
        Err(e) => {
            tracing::error!(template = name, error = %e, "a console page did not render");
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
        }
    }
}

/// The page for an API error (internal errors logged, answered with a generic message).
pub(super) fn error_page(principal: Option<&str>, e: &ApiError) -> Response {
    if let ApiError::Internal(source) = e {
        tracing::error!(error = %crate::error_chain(source.as_ref()), "console: internal error");
    }
    let status = e.status_code();
    page(
        status,
        "error.html",
        context! { principal, status => status.to_string(), message => e.to_string() },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cluster as the API's view has it, enough for every template.
    fn cluster() -> serde_json::Value {
        serde_json::json!({
            "id": 1, "name": "shop", "phase": "founded", "version": "v1.35.3",
            "kubernetes_version": "v1.35.3", "replicas": 1, "ready_replicas": 1,
            "up_to_date_replicas": 1, "control_plane_dns_name": "cp.shop.example",
            "pod_network": "flannel",
            "conditions": [
                {"type": "Available", "status": "True", "reason": "Available", "message": "",
                 "lastTransitionTime": "2026-12-02T00:00:00Z"},
                {"type": "RollingOut", "status": "False", "reason": "NotRollingOut",
                 "message": "a <b>message</b>", "lastTransitionTime": "2026-12-02T00:00:00Z"}
            ],
            "nodes": [
                {"name": "cp-101", "vm_id": 101, "role": "control-plane", "phase": "complete",
                 "etcd_membership": "voter", "applied_generation": 1, "desired_generation": 1,
                 "kubernetes_version": "v1.35.3", "private_ipv4": "10.0.0.11",
                 "last_seen_at": 1_764_633_600_i64,
                 "conditions": [
                    {"type": "EtcdMemberHealthy", "status": "True", "reason": "Healthy"},
                    {"type": "KubeletHealthy", "status": "False", "reason": "KubeletDown",
                     "message": "<no answer>"},
                    {"type": "SchedulerPodHealthy", "status": "Unknown", "reason": "NotReported",
                     "message": "not reported yet"}
                 ]},
                {"name": "blue-102", "vm_id": 102, "role": "worker", "phase": "pending",
                 "applied_generation": 0, "desired_generation": 1,
                 "private_ipv4": "10.0.0.12", "conditions": [
                    {"type": "KubeletHealthy", "status": "Unknown", "reason": "NotReported",
                     "message": "not reported yet"}]},
                {"name": "blue-103", "vm_id": 103, "role": "worker", "phase": "complete",
                 "applied_generation": 1, "desired_generation": 1,
                 "private_ipv4": "10.0.0.13", "last_seen_at": 1_764_633_600_i64,
                 "conditions": [{"type": "KubeletHealthy", "status": "True", "reason": "Healthy"}]}
            ],
            "health_policy": policy()
        })
    }

    /// The default health policy as the view has it.
    fn policy() -> serde_json::Value {
        serde_json::to_value(exk8s_api_types::HealthPolicy::default()).unwrap()
    }

    fn render(name: &str, ctx: minijinja::Value) -> String {
        environment()
            .get_template(name)
            .and_then(|t| t.render(ctx))
            .unwrap_or_else(|e| panic!("{name}: {e:#}"))
    }

    #[test]
    fn every_page_renders_and_escapes_what_it_shows() {
        let principal = "<i>ops</i>";
        let list = render(
            "clusters.html",
            context! { principal, clusters => vec![cluster()] },
        );
        assert!(list.contains("href=\"/ui/clusters/1\">shop</a>"), "{list}");
        assert!(list.contains("RollingOut: NotRollingOut"), "{list}");
        assert!(
            list.contains("&lt;i&gt;ops") && !list.contains("<i>"),
            "{list}"
        );
        let changes = serde_json::json!([
            {"kind": "report", "at": "2026-12-02T00:00:01Z",
             "event": {"at": 1, "phase": "services", "state": "failed", "vm_id": 101,
                       "error_reason": null, "message": "etcd <did not> start"}},
            {"kind": "cluster", "at": "2026-12-02T00:00:00Z",
             "event": {"at": 0, "phase": "founded"}}
        ]);
        let one = render(
            "cluster.html",
            context! { principal, c => cluster(), changes, last_event => 7 },
        );
        assert!(
            one.contains("<th scope=\"row\">report</th>")
                && one.contains("services (failed)")
                && one.contains("etcd &lt;did not&gt; start"),
            "{one}"
        );
        let quiet = render(
            "cluster.html",
            context! { principal, c => cluster(), changes => Vec::<u8>::new() },
        );
        assert!(quiet.contains("No changes recorded yet."), "{quiet}");
        assert!(
            one.contains("a &lt;b&gt;message") && !one.contains("<b>"),
            "{one}"
        );
        assert!(one.contains("blue-102") && one.contains("voter"), "{one}");
        // Each node's health: what is not well and why, or nothing reported yet.
        assert!(
            one.contains(
                "<td class=\"health\">KubeletHealthy: KubeletDown (&lt;no answer&gt;); \
                 SchedulerPodHealthy: NotReported</td>"
            ) && one.contains("<td class=\"health\">not reported</td>")
                && one.contains("<td class=\"health\">healthy</td>")
                && one.contains("<time datetime=\"2025-12-02T00:00:00Z\">")
                && one.contains("<td>never</td>"),
            "{one}"
        );
        assert!(
            one.contains("Remediation is <strong>on</strong>")
                && one.contains("<td>40% of a set")
                && one.contains("<td>3 per 86400 s</td>"),
            "{one}"
        );
        assert!(
            one.contains("<main id=\"main\" data-live=\"/ui/clusters/1/events?after=7\">")
                && one.contains("<script src=\"/ui/live.js\" defer></script>"),
            "{one}"
        );
        assert!(
            list.contains("<main id=\"main\" data-live=\"/ui/events\">"),
            "{list}"
        );
        let empty = render(
            "clusters.html",
            context! { principal, clusters => Vec::<u8>::new() },
        );
        assert!(empty.contains("No clusters yet"), "{empty}");
        let life = |name: &str, kind: &str| {
            serde_json::json!({"name": name, "vm_id": 101, "kind": kind, "issuer": "<ca>",
                "not_before": "2026-01-01", "not_after": "2027-01-01", "days_left": 30,
                "x": 100, "width": 800, "expired": false})
        };
        let axis = |bars: Vec<serde_json::Value>| {
            serde_json::json!({"from": "2026-01-01", "to": "2036-01-01", "now": 500,
                "bars": bars})
        };
        let certificates = render(
            "certificates.html",
            context! {
                principal, id => 1, name => "shop", sa_key_age_days => 3, no_leaves => false,
                groups => vec![
                    serde_json::json!({"caption": "Certificate authorities",
                                       "axis": axis(vec![life("cluster-ca", "ca")])}),
                    serde_json::json!({"caption": "Serving and client certificates",
                                       "axis": axis(vec![life("apiserver", "serving")])}),
                ],
            },
        );
        assert!(
            certificates.contains("<rect class=\"span\" x=\"100\" y=\"3\" width=\"800\"")
                && certificates.contains("x1=\"500\"")
                && certificates.contains(">cluster-ca</th>")
                && certificates.contains(">apiserver</th>")
                && certificates.contains("&lt;ca&gt;"),
            "{certificates}"
        );
        let none_yet = render(
            "certificates.html",
            context! { principal, id => 1, name => "shop", sa_key_age_days => 0,
            groups => Vec::<u8>::new(), no_leaves => true },
        );
        assert!(
            none_yet.contains("No node certificates issued yet."),
            "{none_yet}"
        );
        let fields = serde_json::json!([
            {"name": "count", "label": "Machines", "kind": "number", "value": "<3>",
             "choices": [], "help": "how many"},
            {"name": "pod_network", "label": "Pod network", "kind": "choice", "value": "flannel",
             "choices": [{"value": "cilium", "label": "cilium"},
                         {"value": "flannel", "label": "flannel"}], "help": ""},
            {"name": "snapshot_first", "label": "Snapshot first", "kind": "check", "value": "",
             "choices": [], "help": ""}
        ]);
        let action = render(
            "action.html",
            context! {
                principal, fields, slug => "delete", pool => "blue",
                words => context! { title => "Delete the cluster", explains => "gone",
                                    button => "Delete the cluster", danger => true },
                c => context! { id => 1, name => "<shop>" },
                refusal => context! { message => "count is <bad>", field => "count" },
                form_key => "k3y", attempt => "a-1",
            },
        );
        for shown in [
            "<h1>Delete the cluster: &lt;shop&gt;, pool blue</h1>",
            "<a href=\"/ui/clusters/1\">&lt;shop&gt;</a>",
            "action=\"/ui/clusters/1/actions/delete?pool=blue\"",
            "role=\"alert\" id=\"refusal\">count is &lt;bad&gt;</p>",
            "name=\"form_key\" value=\"k3y\"",
            "name=\"attempt\" value=\"a-1\"",
            "value=\"&lt;3&gt;\"",
            "aria-describedby=\"count-help refusal\" aria-invalid=\"true\"",
            "<option value=\"flannel\" selected>",
            "<button type=\"submit\" class=\"danger\">Delete the cluster</button>",
        ] {
            assert!(action.contains(shown), "{shown}: {action}");
        }
        assert!(!action.contains("checked"), "{action}");
        assert_eq!(action.matches("aria-invalid").count(), 1, "{action}");
        let login = render("login.html", context! { principal => (), error => "<no>" });
        assert!(login.contains("&lt;no&gt;"), "{login}");
        let error = render(
            "error.html",
            context! { principal => (), status => "404 Not Found", message => "not found" },
        );
        assert!(error.contains("404 Not Found"), "{error}");
    }
}
