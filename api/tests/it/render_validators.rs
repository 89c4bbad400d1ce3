//! The rendered output checked by real tools: systemd-analyze, kubernetes-validate, and the
//! YAML/TOML/JSON parsers of each configuration file.

use std::path::Path;
use std::process::Command;

use exk8s_api::render::paths::PATHS;
use exk8s_api::render::render_userdata;
use exk8s_common::payload::BundlePayload;

use crate::helpers::{text, tool};
use crate::render::{flag, pod_command, real, yaml_docs};

// --- external validators --------------------------------------------------------------------

/// Writes a bundle's files under `root` with their modes.
pub fn write_root(bundle: &BundlePayload, root: &Path) {
    use std::os::unix::fs::PermissionsExt;
    for file in &bundle.files {
        let target = root.join(file.path.relative());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::write(&target, file.content.as_bytes()).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(file.mode.bits()))
            .unwrap();
    }
}

#[test]
fn systemd_analyze_verify_accepts_every_unit_without_a_warning() {
    let bundle = &real().bundles[0];
    let root = tempfile::tempdir().unwrap();
    write_root(bundle, root.path());
    // The root needs systemd's own units (targets) and the binaries the units start.
    let systemd_dir = root.path().join("usr/lib/systemd");
    std::fs::create_dir_all(&systemd_dir).unwrap();
    let copied = Command::new("cp")
        .args(["-r", "/usr/lib/systemd/system"])
        .arg(&systemd_dir)
        .status()
        .unwrap();
    assert!(
        copied.success(),
        "copying systemd's units into the test root"
    );
    for artifact in &bundle.artifacts {
        write_root_executable(root.path(), artifact.dest.as_str());
    }
    for unit in [PATHS.etcd_unit, PATHS.kubelet_unit] {
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(format!("--root={}", root.path().display()))
            .arg(unit)
            .output()
            .expect("systemd-analyze must be installed");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && said.trim().is_empty(),
            "{unit}: {said}"
        );
    }
}

pub(crate) fn write_root_executable(root: &Path, path: &str) {
    use std::os::unix::fs::PermissionsExt;
    let target = root.join(path.trim_start_matches('/'));
    std::fs::create_dir_all(target.parent().unwrap()).unwrap();
    std::fs::write(&target, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn kubernetes_validate_strict_accepts_every_manifest_for_1_35() {
    let bundle = &real().bundles[0];
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for path in [
        PATHS.apiserver_manifest,
        PATHS.controller_manager_manifest,
        PATHS.scheduler_manifest,
        PATHS.kube_proxy_manifest,
        PATHS.coredns_manifest,
        PATHS.rbac_manifest,
    ] {
        let name = dir.path().join(path.rsplit('/').next().unwrap());
        std::fs::write(&name, text(bundle, path)).unwrap();
        files.push(name);
    }
    // Flannel's, from a cluster that chose it.
    let (flannel, _) =
        crate::render_plan::addon_steps(exk8s_api::cluster::spec::PodNetwork::Flannel);
    let name = dir.path().join("flannel.yaml");
    std::fs::write(&name, text(&flannel, PATHS.flannel_manifest)).unwrap();
    files.push(name);
    let out = Command::new(tool("kubernetes-validate", "EXK8S_KUBERNETES_VALIDATE"))
        .args(["--strict", "-k", "1.35.0"])
        .args(&files)
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{said}");
    assert!(!said.contains("WARN") && !said.contains("ERROR"), "{said}");
    // Every resource was validated: the tool prints one line per resource it checked.
    assert_eq!(said.matches(" passed for resource ").count(), 17, "{said}");
}

#[test]
fn every_config_file_parses_in_its_format() {
    for bundle in &real().bundles {
        for file in &bundle.files {
            let path = file.path.as_str();
            let body = std::str::from_utf8(file.content.as_bytes()).unwrap();
            if path.ends_with(".yaml") || path.ends_with(".kubeconfig") {
                assert!(!yaml_docs(body).is_empty(), "{path} is empty YAML");
            } else if path.ends_with(".conflist.tmpl") {
                // containerd fills the ranges in (Go text/template; tests/tests/boot_cluster/nodes.rs
                // sees it on booted machines): with one range it is the bridge configuration, as JSON.
                let ranges = r#"[{{range $i, $range := .PodCIDRRanges}}{{if $i}}, {{end}}[{ "subnet": "{{$range}}" }]{{end}}]"#;
                assert!(body.contains(ranges), "{path}: {body}");
                let json = body.split_once("-}}").map_or(body, |(_, rest)| rest);
                let filled = json.replace(ranges, r#"[[{ "subnet": "10.244.3.0/24" }]]"#);
                let v: serde_json::Value = serde_json::from_str(&filled).unwrap();
                assert_eq!(v["plugins"][0]["type"], "bridge");
                assert_eq!(
                    v["plugins"][0]["ipam"]["ranges"][0][0]["subnet"],
                    "10.244.3.0/24"
                );
            } else if path.ends_with(".toml") {
                let v: toml::Value = toml::from_str(body).unwrap();
                let cri = &v["plugins"]["io.containerd.grpc.v1.cri"];
                assert_eq!(
                    cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"],
                    toml::Value::Boolean(true)
                );
            }
        }
        let enc = &yaml_docs(text(bundle, PATHS.encryption_config))[0];
        let key = enc["resources"][0]["providers"][0]["secretbox"]["keys"][0]["secret"]
            .as_str()
            .unwrap();
        use base64::Engine as _;
        assert_eq!(
            base64::engine::general_purpose::STANDARD
                .decode(key)
                .unwrap()
                .len(),
            32
        );
        let cmd = pod_command(text(bundle, PATHS.apiserver_manifest));
        assert_eq!(
            flag(&cmd, "encryption-provider-config"),
            [PATHS.encryption_config]
        );
        assert_eq!(flag(&cmd, "audit-policy-file"), [PATHS.audit_policy]);
    }
}

#[test]
fn userdata_is_cloud_config_that_carries_no_secret() {
    let userdata =
        render_userdata("https://k8sapi.example.com", "http://169.254.169.254", true).unwrap();
    assert!(userdata.starts_with("#cloud-config\n"));
    let doc = &yaml_docs(&userdata)[0];
    let content = doc["write_files"][0]["content"].as_str().unwrap();
    let config: toml::Value = toml::from_str(content).unwrap();
    assert_eq!(
        config["api_url"].as_str(),
        Some("https://k8sapi.example.com")
    );
    assert_eq!(config["insecure_http"].as_bool(), Some(true));
    for secret in [
        "BEGIN ",
        "PRIVATE",
        "Bearer",
        "access_token",
        "imds-token",
        "kubeconfig",
    ] {
        assert!(!userdata.contains(secret), "userdata mentions {secret}");
    }
}
