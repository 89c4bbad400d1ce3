//! What the agent's real host runs commands with: helm and kubectl get a `HOME` the agent's
//! sandbox does not hide (`ProtectHome=yes` hides `/root`), private to root, and their
//! `KUBECONFIG`; package installs keep a conffile the bundle already wrote.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use exk8s_agent::apply::host::{Host as _, HostAction, SystemHost};

#[test]
fn helm_and_kubectl_run_with_a_private_home_under_the_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let seen = root.join("seen");
    // A stand-in for helm that says what it was given: the variables are the host's, the
    // program is any program (the host runs an argument vector, never a shell of its own).
    let mut host = SystemHost {
        root: root.to_owned(),
        request_timeout: Duration::from_secs(5),
    };
    host.perform(&HostAction::Command {
        program: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            r#"printf '%s\n%s\n' "$HOME" "$KUBECONFIG" > "$0" && mkdir -p "$HOME/.cache/helm""#
                .into(),
            seen.display().to_string(),
        ],
        kubeconfig: root.join("etc/exk8s/kubeconfig/admin.kubeconfig"),
        timeout: Duration::from_secs(30),
    })
    .unwrap();
    let said = std::fs::read_to_string(&seen).unwrap();
    let home = root.join("var/lib/exk8s/home");
    assert_eq!(
        said,
        format!(
            "{}\n{}\n",
            home.display(),
            root.join("etc/exk8s/kubeconfig/admin.kubeconfig").display()
        )
    );
    let mode = std::fs::metadata(&home).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o700, "{mode:o}");
    assert!(
        home.join(".cache/helm").is_dir(),
        "helm's cache is writable"
    );
}

#[test]
fn a_package_install_keeps_the_conffile_the_bundle_wrote() {
    let containerd = exk8s_common::names::PackageName::new("containerd").unwrap();
    let action = HostAction::InstallPackages(vec![&containerd]);
    assert_eq!(
        action.to_string(),
        "apt-get install -y --no-install-recommends -o Dpkg::Options::=--force-confdef \
         -o Dpkg::Options::=--force-confold containerd"
    );
}
