//! A bounded selection of Kubernetes' conformance tests run against the booted cluster: the
//! real `e2e.test` of the cluster's release (`scripts/e2e-binaries.sh --selected`: the suite's
//! main with the spec packages below; where it is: [`exk8s_tests::bins::e2e_test`]), from the
//! first machine's LAN with its admin kubeconfig.
//! Services, networking across nodes, pod DNS settings, pods, ConfigMaps and Secrets, service
//! account tokens, authorization and an admission webhook (the apiserver reaching a Service from its
//! host's network) — each a `[Conformance]` spec whose images the node registry serves
//! (agnhost, busybox, pause). Judged by the suite's own JUnit report: every selected spec ran
//! and passed. The whole suite is `scripts/conformance.sh`'s.

use std::path::Path;
use std::time::Instant;

use exk8s_tests::machine::Machine;

/// The selected specs (the start of each name; each is `[Conformance]`).
const SELECTED: [&str; 13] = [
    "[sig-network] Services should serve a basic endpoint from pods",
    "[sig-network] Services should serve multiport endpoints from pods",
    "[sig-network] Services should be able to create a functioning NodePort service",
    "[sig-network] Networking Granular Checks: Pods should function for intra-pod communication: http",
    "[sig-network] Networking Granular Checks: Pods should function for node-pod communication: http",
    "[sig-network] DNS should support configurable pod DNS nameservers",
    "[sig-node] Pods should get a host IP",
    "[sig-node] ConfigMap should be consumable via environment variable",
    "[sig-storage] ConfigMap should be consumable from pods in volume [NodeConformance]",
    "[sig-storage] Secrets should be consumable from pods in volume [NodeConformance]",
    "[sig-auth] ServiceAccounts should mount an API token into pods",
    "[sig-auth] SubjectReview should support SubjectReview API operations",
    "[sig-api-machinery] AdmissionWebhook [Privileged:ClusterAdmin] should be able to deny pod and configmap creation",
];

/// `text` as a regular expression matching itself.
fn escaped(text: &str) -> String {
    text.chars().fold(String::new(), |mut out, c| {
        if "\\^$.|?*+()[]{}".contains(c) {
            out.push('\\');
        }
        out.push(c);
        out
    })
}

/// Each test case's name and status (`passed`, `failed`, `skipped`, …) in a Ginkgo JUnit
/// report, read with an XML parser.
fn cases(report: &Path) -> Vec<(String, String)> {
    use quick_xml::events::Event;

    let text = std::fs::read_to_string(report).unwrap();
    let mut reader = quick_xml::Reader::from_str(&text);
    let mut found = Vec::new();
    loop {
        match reader.read_event().unwrap() {
            Event::Start(e) | Event::Empty(e) if e.name().as_ref() == b"testcase" => {
                let attribute = |key: &[u8]| {
                    e.try_get_attribute(key)
                        .unwrap()
                        .map(|a| a.unescape_value().unwrap().into_owned())
                        .unwrap_or_default()
                };
                found.push((attribute(b"name"), attribute(b"status")));
            }
            Event::Eof => break,
            _ => {}
        }
    }
    found
}

/// Runs the selection; `dir` keeps the suite's log and report.
pub(crate) fn run_conformance(first: &Machine, dir: &Path) {
    let focus = SELECTED.map(escaped).join("|");
    let kubeconfig = first.root.join("etc/exk8s/kubeconfig/admin.kubeconfig");
    let (log, report) = (dir.join("e2e.log"), dir.join("junit.xml"));
    let started = Instant::now();
    let status = first
        .on_lan(exk8s_tests::bins::e2e_test().to_str().unwrap())
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args([
            "--provider=skeleton",
            "--ginkgo.no-color",
            "--ginkgo.timeout=15m",
        ])
        .arg(format!("--ginkgo.focus={focus}"))
        .arg("--ginkgo.skip=\\[Serial\\]|\\[Disruptive\\]|\\[Slow\\]")
        .arg(format!("--ginkgo.junit-report={}", report.display()))
        .arg(format!("--report-dir={}", dir.display()))
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(dir.join("e2e.stderr")).unwrap())
        .status()
        .unwrap();
    let tail = || {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(80)..].join("\n")
    };
    assert!(status.success(), "e2e.test: {status}\n{}", tail());
    let cases = cases(&report);
    let ran: Vec<&(String, String)> = cases.iter().filter(|(_, s)| s != "skipped").collect();
    for (name, status) in &ran {
        assert_eq!(status, "passed", "{name}\n{}", tail());
    }
    // Each selected spec ran (and nothing else did): the suite's setup and teardown are cases
    // of their own in its report.
    for selected in SELECTED {
        assert!(
            ran.iter()
                .any(|(name, _)| name.contains(selected) && name.contains("[Conformance]")),
            "{selected} did not run: {ran:?}"
        );
    }
    let specs = ran
        .iter()
        .filter(|(n, _)| n.contains("[Conformance]"))
        .count();
    assert_eq!(specs, SELECTED.len(), "{ran:?}");
    eprintln!(
        "conformance: {specs} specs passed in {} s",
        started.elapsed().as_secs()
    );
}
