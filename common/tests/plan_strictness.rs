//! The typed plan refuses steps and fields v1 does not define, including on field-less steps.

use exk8s_common::payload::PlanStep;

#[test]
fn plan_steps_refuse_unknown_steps_and_fields() {
    let ok: PlanStep = serde_json::from_str(r#"{"step":"daemon_reload"}"#).unwrap();
    assert_eq!(ok, PlanStep::DaemonReload {});
    for bad in [
        r#"{"step":"daemon_reload","extra":1}"#,
        r#"{"step":"enable_start","unit":"etcd.service","watch":[],"now":true}"#,
        r#"{"step":"run_shell","command":"curl | sh"}"#,
        r#"{"step":"enable_start","unit":"-x.service","watch":[]}"#,
        r#"{"step":"enable_start","unit":"etcd.service","watch":["/tmp/x"]}"#,
        r#"{"step":"kubectl_apply","kubeconfig":"/etc/exk8s/k","file":"/tmp/x.yaml"}"#,
    ] {
        assert!(
            serde_json::from_str::<PlanStep>(bad).is_err(),
            "accepted {bad}"
        );
    }
}
