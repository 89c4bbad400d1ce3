//! The console in a real browser: Debian's Chromium, driven through chromedriver by Selenium
//! (`tests/tools/console_browser.py`), against the dev stack, as an operator uses it with only a
//! keyboard: `/ui` leads to the login form; a wrong token is refused on it, saying why; the
//! operator's token, typed and sent with Tab and Enter, signs in, and no page script can read
//! the cookie that keeps it; the org's cluster is listed and another org's is not (and its page
//! is "not found"), and a cluster founded through the API joins the list without a reload; Tab
//! and Enter open the cluster, whose conditions, node and latest changes are shown, and which
//! follows the cluster (a health policy put through the API shows on it without a reload, the
//! keyboard's focus kept), and whose certificates' lives are drawn on a timeline; logging out
//! leads back to the form. A cluster is founded with the console's form, by keyboard: sent
//! half-filled, the API's own refusal is on the form with what was typed kept and the field
//! marked invalid; completed, it leads to the new cluster's page, which follows the founding
//! to `founded` in place; a snapshot asked for there is refused in the API's words (nothing
//! reports on the dev stack's simulated machines); its node's agent, run as on the simulated
//! stack, then reports each phase of its boot and the page follows them in place to
//! `complete`, after which a snapshot asked for is taken (its member asked, listed on the
//! page); a delete with the name typed leads back to the list without it. axe-core
//! (`EXK8S_AXE`, `scripts/test.sh` installs it once per machine) finds no serious or critical
//! accessibility violation on the login form, the list, the cluster page, the certificates
//! page, the founding form (before and after its refusal) or an action's page. The cluster
//! page's screenshot is kept as `target/console.png`, the refused founding form's as
//! `target/console-found.png`.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test: failures should stop it loudly"
)]

use std::path::{Path, PathBuf};
use std::process::Command;

use exk8s_tests::dev::{http, start_dev};
use exk8s_tests::procs::binary;
use serde_json::Value;

/// A file the environment names, which must exist.
fn named(variable: &str, what: &str) -> PathBuf {
    let path = std::env::var_os(variable)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{variable} is not set: {what} (scripts/test.sh sets it)"));
    assert!(path.is_file(), "{variable}={}: not a file", path.display());
    path
}

/// Violations axe-core rates serious or critical.
fn serious(violations: &Value) -> Vec<&Value> {
    violations
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| matches!(v["impact"].as_str(), Some("serious" | "critical")))
        .collect()
}

#[test]
fn the_console_works_in_a_real_browser_with_a_keyboard() {
    let python = named("EXK8S_PYTHON", "a Python with selenium");
    let axe = named("EXK8S_AXE", "axe-core's axe.min.js");
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("dev");
    let stack = start_dev(&data, "127.0.19.0/24", &dir.path().join("api.log"), &[]);
    let (status, ours) = stack.found(1);
    assert_eq!(status, 201, "{ours}");
    let ours = ours["name"].as_str().unwrap().to_owned();

    // Another org's operator and cluster.
    let made = Command::new(binary("exk8s-api"))
        .args([
            "tokens",
            "create",
            "--org",
            "8",
            "--principal",
            "other",
            "--scope",
            "operator",
        ])
        .arg("--database-url")
        .arg(format!("sqlite://{}/exk8s.db?mode=rwc", data.display()))
        .output()
        .unwrap();
    assert!(made.status.success(), "{made:?}");
    let theirs_token = String::from_utf8(made.stdout).unwrap().trim().to_owned();
    let theirs: Value = http()
        .post(&format!("{}/clusters", stack.base))
        .set("Authorization", &format!("Bearer {theirs_token}"))
        .set("Prefer", "wait=600")
        .send_json(
            serde_json::json!({"name": "theirs", "control_plane_count": 1,
            "control_plane_image_id": 1, "control_plane_instance_type": "dev.small",
            "subnet_id": 1}),
        )
        .unwrap()
        .into_json()
        .unwrap();
    let theirs_id = theirs["cluster_id"].as_i64().unwrap().to_string();

    let screenshot = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/console.png");
    let run = Command::new(&python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/console_browser.py"))
        .env("CONSOLE_URL", &stack.base)
        .env("CONSOLE_TOKEN", &stack.token)
        .env("CONSOLE_OURS", &ours)
        .env("CONSOLE_THEIRS", &theirs_id)
        .env("CONSOLE_AXE", &axe)
        .env("CONSOLE_SCREENSHOT", &screenshot)
        .env("CONSOLE_AGENT", binary("exk8s-agent"))
        .env("CONSOLE_AGENT_KEYS", data.join("trusted-keys"))
        .env("CONSOLE_AGENT_DIR", dir.path())
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "the browser run failed:\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let seen: Value = serde_json::from_slice(&run.stdout).unwrap();
    let url = |key: &str| seen[key].as_str().unwrap().to_owned();

    assert_eq!(url("signed_out_url"), format!("{}/ui/login", stack.base));
    assert!(
        seen["refused"]
            .as_str()
            .unwrap()
            .contains("unknown, expired or revoked"),
        "{seen}"
    );
    assert_eq!(url("signed_in_url"), format!("{}/ui/clusters", stack.base));
    assert_eq!(
        seen["cookie_seen_by_script"], "",
        "the session cookie is HttpOnly"
    );
    assert_eq!(seen["clusters"], serde_json::json!([ours]), "{seen}");
    assert_eq!(
        seen["list_live_stayed"], true,
        "the list updated in place: {seen}"
    );
    assert!(url("cluster_url").starts_with(&format!("{}/ui/clusters/", stack.base)));
    assert!(seen["cluster_heading"].as_str().unwrap().starts_with(&ours));
    let conditions: Vec<&str> = seen["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c.as_str().unwrap())
        .collect();
    assert!(
        conditions.contains(&"Available") && conditions.contains(&"RemediationAllowed"),
        "{conditions:?}"
    );
    assert_eq!(seen["nodes"].as_array().unwrap().len(), 1, "{seen}");
    let changes = seen["changes"].as_array().unwrap();
    assert!(
        changes.contains(&"cluster".into()) && changes.contains(&"node".into()),
        "{seen}"
    );
    assert_eq!(seen["live_stayed"], true, "updated in place: {seen}");
    assert!(seen["live_updated"].is_string(), "{seen}");
    assert_eq!(seen["live_focus"], "Clusters", "focus kept: {seen}");
    assert!(
        seen["theirs"].as_str().unwrap().starts_with("404"),
        "{seen}"
    );
    assert_eq!(
        url("signed_out_again_url"),
        format!("{}/ui/login", stack.base)
    );
    assert_eq!(url("after_logout_url"), format!("{}/ui/login", stack.base));
    let groups = seen["certificate_groups"].as_array().unwrap();
    assert!(
        groups[0]
            .as_str()
            .unwrap()
            .starts_with("Certificate authorities"),
        "{seen}"
    );
    assert!(seen["certificate_bars"].as_u64().unwrap() >= 3, "{seen}");
    // Founded with the console's form: the API's refusal on the half-filled form, what was
    // typed kept and the field named; then the cluster's page following its founding.
    assert_eq!(url("found_url"), format!("{}/ui/clusters/new", stack.base));
    assert_eq!(
        seen["found_refused"],
        serde_json::json!(["control_plane_image_id is required"]),
        "{seen}"
    );
    assert_eq!(seen["found_kept"], "made-in-browser", "{seen}");
    assert_eq!(seen["found_invalid"], "control_plane_image_id", "{seen}");
    assert!(
        url("founded_url").starts_with(&format!("{}/ui/clusters/", stack.base))
            && url("founded_url") != url("cluster_url"),
        "{seen}"
    );
    let phases = seen["founding_phases"].as_array().unwrap();
    eprintln!("the founded cluster's page showed the phases {phases:?}");
    assert_eq!(phases.last().unwrap(), "founded", "{seen}");
    assert_eq!(seen["founding_stayed"], true, "followed in place: {seen}");
    let refused = seen["snapshot_refused"][0].as_str().unwrap();
    assert!(
        refused.starts_with("no etcd voter of cluster") && refused.contains("is healthy"),
        "the API's words: {seen}"
    );
    // Its node booted by its agent: the page followed the reports in place to `complete`.
    assert_eq!(
        seen["agent_status"], 0,
        "the agent's log is in the test's directory: {seen}"
    );
    let node_phases: Vec<&str> = seen["node_phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    eprintln!("the node's phases the page showed: {node_phases:?}");
    assert!(
        node_phases.len() >= 2 && node_phases.last().unwrap().starts_with("complete"),
        "{node_phases:?}"
    );
    assert_eq!(seen["node_stayed"], true, "followed in place: {seen}");
    let reports: std::collections::BTreeSet<&str> = seen["node_reports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect();
    eprintln!("the reports the page listed: {reports:?}");
    assert!(
        reports.len() >= 4 && reports.iter().any(|r| r.starts_with("complete")),
        "each phase reported is listed: {reports:?}"
    );
    // Then a snapshot asked for is taken: the node's member is asked, and the page lists it.
    assert_eq!(url("snapshot_taken_url"), url("founded_url"), "{seen}");
    let snapshots = seen["snapshots"].as_array().unwrap();
    assert_eq!(snapshots.len(), 1, "{seen}");
    assert_eq!(snapshots[0][1], "requested", "{seen}");
    assert_eq!(snapshots[0][2], "operator", "{seen}");
    assert_eq!(url("deleted_url"), format!("{}/ui/clusters", stack.base));
    assert!(
        !seen["after_delete"]
            .as_array()
            .unwrap()
            .contains(&"made-in-browser".into()),
        "{seen}"
    );
    for page in [
        "axe_login",
        "axe_clusters",
        "axe_cluster",
        "axe_certificates",
        "axe_found",
        "axe_found_refused",
        "axe_snapshot",
    ] {
        assert!(serious(&seen[page]).is_empty(), "{page}: {:#}", seen[page]);
    }
    assert!(screenshot.is_file());
    assert!(screenshot.with_file_name("console-found.png").is_file());
}
