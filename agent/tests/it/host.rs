//! What the agent's real host runs commands with: helm and kubectl get a `HOME` the agent's
//! sandbox does not hide (`ProtectHome=yes` hides `/root`), private to root, and their
//! `KUBECONFIG`; package installs keep a conffile the bundle already wrote; a lane of actions
//! that fails abandons the lanes beside it.

use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use exk8s_agent::apply::host::{Host as _, HostAction, SystemHost};
use exk8s_agent::error::AgentError;
use exk8s_common::names::{FileMode, Sha256Digest};
use exk8s_common::payload::Artifact;

use crate::server::{Reply, Server};

#[test]
fn helm_and_kubectl_run_with_a_private_home_under_the_state_directory() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    let seen = root.join("seen");
    // A stand-in for helm that says what it was given: the variables are the host's, the
    // program is any program (the host runs an argument vector, never a shell of its own).
    let mut host = SystemHost::new(root.to_owned(), Duration::from_secs(5));
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

fn artifact(server: &Server, name: &str) -> Artifact {
    Artifact {
        name: name.parse().unwrap(),
        version: "v1.0.0".parse().unwrap(),
        url: format!("{}/{name}", server.url).parse().unwrap(),
        sha256: Some(Sha256Digest::of(b"anything")),
        archive_member: None,
        dest: format!("/usr/local/bin/{name}").parse().unwrap(),
        mode: FileMode::EXECUTABLE,
    }
}

/// The prerequisites' package lane and download lane run side by side: when one fails for
/// good, the other's download stops retrying (its deadline is 15 minutes) and the failure is
/// the error returned, so the boot is tried again at once. Were the busy download not given
/// up, the lanes would end only at its deadline, with its own error.
#[test]
fn a_failed_lane_abandons_the_download_beside_it() {
    let root = tempfile::tempdir().unwrap();
    let busy_asked = Arc::new(AtomicBool::new(false));
    let asked = Arc::clone(&busy_asked);
    let server = Server::start(move |r| {
        if r.path == "/busy" {
            // Unavailable for as long as anyone asks: retried with a growing pause.
            asked.store(true, Ordering::SeqCst);
            return Reply::status(503);
        }
        // The other download fails for good once the busy one is retrying.
        while !asked.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        Reply::status(404)
    });
    let (busy, gone) = (artifact(&server, "busy"), artifact(&server, "gone"));
    let mut host = SystemHost::new(root.path().to_owned(), Duration::from_secs(5));
    let err = host
        .perform_lanes(&[
            vec![HostAction::InstallArtifact(&busy)],
            vec![HostAction::InstallArtifact(&gone)],
        ])
        .unwrap_err();
    assert!(
        matches!(err, AgentError::Rejected { status: 404, .. }),
        "the failed lane's error: {err}"
    );
    assert!(busy_asked.load(Ordering::SeqCst));
    let retries = server.count("/busy");
    assert!(retries < 10, "the busy download was asked {retries} times");
    assert!(!root.path().join("usr/local/bin/busy").exists());
}
