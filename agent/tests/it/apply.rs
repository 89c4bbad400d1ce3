//! `apply --root`: exact files and modes, idempotence, dry runs, refusals that write nothing,
//! symlinks, and crash safety under SIGKILL-like aborts at every file operation.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use exk8s_agent::commands::{LocalCheck, apply_file};

use crate::helpers::{Tree, VM_ID, agent, bundle_file, code, files, payload, sign, stderr, tree};

fn actions(root: &Path) -> String {
    std::fs::read_to_string(root.join("var/lib/exk8s/recorded-actions.log")).unwrap_or_default()
}

fn apply(scratch: &Path, bundle: &Path, root: &Path, extra: &[&str]) -> std::process::Output {
    agent(scratch)
        .args(["apply", "--bundle"])
        .arg(bundle)
        .arg("--root")
        .arg(root)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn applies_every_file_with_its_exact_content_and_mode() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let bundle = payload(VM_ID, 5, files("a"));
    let path = bundle_file(scratch.path(), "b.json", &sign(&bundle));
    let out = apply(scratch.path(), &path, &root, &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    for file in &bundle.files {
        let target = root.join(file.path.relative());
        assert_eq!(
            std::fs::read(&target).unwrap(),
            file.content.as_bytes(),
            "{}",
            file.path
        );
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, file.mode.bits(), "{}", file.path);
    }
    let pki = std::fs::metadata(root.join("etc/exk8s/pki"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(pki, 0o700, "the directory holding keys is private");
    let state = std::fs::read_to_string(root.join("var/lib/exk8s/state.json")).unwrap();
    assert!(state.contains("\"applied_serial\": 5"), "{state}");
    assert!(root.join("var/lib/exk8s/bootstrap.done").exists());
    let log = actions(&root);
    assert!(log.contains("systemctl daemon-reload"), "{log}");
    assert!(
        log.contains("systemctl start --no-block etcd.service"),
        "{log}"
    );
}

#[test]
fn applying_again_changes_nothing_and_restarts_nothing() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    let first = payload(VM_ID, 5, files("a"));
    let path = bundle_file(scratch.path(), "b.json", &sign(&first));
    assert_eq!(code(&apply(scratch.path(), &path, &root, &[])), 0);
    let before = tree(&root);
    let log_before = actions(&root);

    // The same bundle: already applied, nothing at all happens.
    let out = apply(scratch.path(), &path, &root, &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(stderr(&out).contains("already applied"), "{}", stderr(&out));
    assert_eq!(tree(&root), before);
    assert_eq!(actions(&root), log_before);

    // A newer bundle with identical contents: every file unchanged, no reload, no restart.
    let second = payload(VM_ID, 6, files("a"));
    let path = bundle_file(scratch.path(), "b2.json", &sign(&second));
    let out = apply(scratch.path(), &path, &root, &[]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        stdout.matches("unchanged").count(),
        second.files.len(),
        "{stdout}"
    );
    let new_actions = actions(&root)[log_before.len()..].to_owned();
    assert!(
        !new_actions.contains("start") && !new_actions.contains("daemon-reload"),
        "{new_actions}"
    );

    // A watched file changed: the running unit is restarted, after a daemon-reload.
    let third = payload(VM_ID, 7, files("b"));
    let path = bundle_file(scratch.path(), "b3.json", &sign(&third));
    let log_before = actions(&root);
    assert_eq!(code(&apply(scratch.path(), &path, &root, &[])), 0);
    let new_actions = actions(&root)[log_before.len()..].to_owned();
    assert!(
        new_actions.contains("systemctl daemon-reload"),
        "{new_actions}"
    );
    assert!(
        new_actions.contains("systemctl restart --no-block etcd.service"),
        "{new_actions}"
    );
}

#[test]
fn dry_run_shows_the_plan_and_writes_nothing() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let path = bundle_file(
        scratch.path(),
        "b.json",
        &sign(&payload(VM_ID, 5, files("a"))),
    );
    let out = apply(scratch.path(), &path, &root, &["--dry-run"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert!(tree(&root).is_empty(), "a dry run wrote {:?}", tree(&root));
    insta::assert_snapshot!("dry_run", String::from_utf8_lossy(&out.stdout));
}

fn refused(scratch: &Path, envelope: &[u8], extra: &[&str]) -> (i32, String, Tree) {
    let root = scratch.join(format!("root-{}", extra.join("-")));
    std::fs::create_dir_all(&root).unwrap();
    let path = bundle_file(scratch, "r.json", envelope);
    let out = apply(scratch, &path, &root, extra);
    (code(&out), stderr(&out), tree(&root))
}

#[test]
fn refused_bundles_write_nothing() {
    let scratch = tempfile::tempdir().unwrap();
    let s = scratch.path();
    let other_vm = sign(&payload(VM_ID + 1, 5, files("a")));
    let (status, said, written) = refused(s, &other_vm, &["--vm-id", "101"]);
    assert_eq!(status, 4, "{said}");
    assert!(said.contains("is for vm 102"), "{said}");
    assert!(written.is_empty());

    let mut stale = payload(VM_ID, 5, files("a"));
    stale.freshness.issued_at -= 7200;
    stale.freshness.expires_at -= 7200;
    let (status, said, written) = refused(s, &sign(&stale), &[]);
    assert_eq!(status, 4, "{said}");
    assert!(said.contains("expired"), "{said}");
    assert!(written.is_empty());

    let untrusted = exk8s_common::BundleSigner::from_seed(&[0x22; 32])
        .sign_bundle(&payload(VM_ID, 5, files("a")))
        .unwrap();
    let (status, said, written) = refused(s, &untrusted, &[]);
    assert_eq!(status, 4, "{said}");
    assert!(said.contains("no signature is by a trusted key"), "{said}");
    assert!(written.is_empty());

    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../common/tests/data");
    for attack in [
        "path-traversal",
        "path-outside-allow-list",
        "bad-mode",
        "duplicate-path",
        "digest-mismatch",
        "truncated",
        "bad-signature",
    ] {
        let envelope = std::fs::read(fixtures.join(attack).join("envelope.json")).unwrap();
        let (status, said, written) = refused(s, &envelope, &["--at", "1767225700"]);
        assert_eq!(status, 4, "{attack}: {said}");
        assert!(written.is_empty(), "{attack} wrote {written:?}");
    }
}

#[test]
fn a_lower_serial_is_refused_as_rollback() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    let newer = bundle_file(
        scratch.path(),
        "n.json",
        &sign(&payload(VM_ID, 9, files("new"))),
    );
    assert_eq!(code(&apply(scratch.path(), &newer, &root, &[])), 0);
    let before = tree(&root);
    let older = bundle_file(
        scratch.path(),
        "o.json",
        &sign(&payload(VM_ID, 8, files("old"))),
    );
    let out = apply(scratch.path(), &older, &root, &[]);
    assert_eq!(code(&out), 4, "{}", stderr(&out));
    assert!(stderr(&out).contains("rollback"), "{}", stderr(&out));
    assert_eq!(tree(&root), before);
}

/// Every single-byte change to the envelope is refused and leaves the root empty.
#[test]
fn every_byte_flip_is_refused_before_anything_is_written() {
    let scratch = tempfile::tempdir().unwrap();
    let root = scratch.path().join("root");
    std::fs::create_dir(&root).unwrap();
    let envelope = sign(&payload(VM_ID, 5, files("a")));
    let path = scratch.path().join("flip.json");
    let check = LocalCheck {
        vm_id: Some(VM_ID),
        at: None,
        clock_skew_secs: 300,
    };
    for i in 0..envelope.len() {
        let mut flipped = envelope.clone();
        flipped[i] ^= 0x01;
        std::fs::write(&path, &flipped).unwrap();
        let result = apply_file(
            &path,
            &crate::helpers::keys_dir(),
            Some(&root),
            false,
            &check,
        );
        let err = result.expect_err(&format!("byte {i} flipped was applied"));
        assert_eq!(err.exit_code(), 4, "byte {i}: {err}");
        assert!(tree(&root).is_empty(), "byte {i} flipped wrote files");
    }
}

#[test]
fn a_symlink_on_the_way_is_never_followed() {
    let scratch = tempfile::tempdir().unwrap();
    let outside = scratch.path().join("outside");
    std::fs::create_dir(&outside).unwrap();
    let path = bundle_file(
        scratch.path(),
        "b.json",
        &sign(&payload(VM_ID, 5, files("a"))),
    );

    // A planted directory symlink: /etc/exk8s -> outside.
    let root = scratch.path().join("root1");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::os::unix::fs::symlink(&outside, root.join("etc/exk8s")).unwrap();
    let out = apply(scratch.path(), &path, &root, &[]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(stderr(&out).contains("symlink"), "{}", stderr(&out));
    assert!(
        tree(&outside).is_empty(),
        "wrote through the symlink: {:?}",
        tree(&outside)
    );
    assert!(
        !root.join("var/lib/kubelet/config.yaml").exists(),
        "refused, yet other files landed"
    );

    // A planted file symlink at a target.
    let root = scratch.path().join("root2");
    std::fs::create_dir_all(root.join("etc/exk8s/config")).unwrap();
    std::os::unix::fs::symlink(
        outside.join("stolen"),
        root.join("etc/exk8s/config/cluster.env"),
    )
    .unwrap();
    let out = apply(scratch.path(), &path, &root, &[]);
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(!outside.join("stolen").exists());
}

/// The agent's own state directory gets the same rule as bundle files: with `var/lib/exk8s`
/// (or a parent) planted as a symlink, nothing is written through it — not `state.json`, not
/// the done-marker, not the action log.
#[test]
fn a_symlinked_state_directory_is_refused_and_nothing_lands_outside() {
    let scratch = tempfile::tempdir().unwrap();
    let path = bundle_file(
        scratch.path(),
        "b.json",
        &sign(&payload(VM_ID, 5, files("a"))),
    );
    for planted in ["var/lib/exk8s", "var/lib", "var"] {
        let outside = scratch
            .path()
            .join(format!("outside-{}", planted.replace('/', "-")));
        std::fs::create_dir(&outside).unwrap();
        let root = scratch
            .path()
            .join(format!("root-{}", planted.replace('/', "-")));
        let link = root.join(planted);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        std::os::unix::fs::symlink(&outside, &link).unwrap();
        let out = apply(scratch.path(), &path, &root, &[]);
        assert_eq!(code(&out), 5, "{planted}: {}", stderr(&out));
        assert!(stderr(&out).contains("symlink"), "{}", stderr(&out));
        assert!(
            tree(&outside).is_empty(),
            "{planted}: wrote through the symlink: {:?}",
            tree(&outside)
        );
    }
}

/// Aborts the agent after each possible number of file operations while it replaces every
/// file; each target must then hold its old or its new content, and a re-run converges.
#[test]
fn a_crash_at_any_file_operation_leaves_old_or_new_and_a_rerun_converges() {
    let scratch = tempfile::tempdir().unwrap();
    let old = payload(VM_ID, 5, files("old"));
    let mut new_files = files("new");
    new_files.push(exk8s_common::payload::BundleFile::new(
        "/etc/exk8s/config/extra.env".parse().unwrap(),
        exk8s_common::names::FileMode::PUBLIC,
        "EXTRA=1\n",
    ));
    let new = payload(VM_ID, 6, new_files);
    let old_path = bundle_file(scratch.path(), "old.json", &sign(&old));
    let new_path = bundle_file(scratch.path(), "new.json", &sign(&new));
    let mut crashed = 0;
    for ops in 1.. {
        let root = scratch.path().join(format!("crash-{ops}"));
        assert_eq!(code(&apply(scratch.path(), &old_path, &root, &[])), 0);
        let out = agent(scratch.path())
            .env("EXK8S_AGENT_TEST_ABORT_AFTER_FILE_OPS", ops.to_string())
            .args(["apply", "--bundle"])
            .arg(&new_path)
            .arg("--root")
            .arg(&root)
            .output()
            .unwrap();
        let finished = out.status.success();
        for file in &new.files {
            let target = root.join(file.path.relative());
            let now = std::fs::read(&target).ok();
            let before = old
                .file(file.path.as_str())
                .map(|f| f.content.as_bytes().to_vec());
            assert!(
                now.as_deref() == Some(file.content.as_bytes()) || now == before,
                "after {ops} ops {} is neither old nor new",
                file.path
            );
        }
        // A re-run converges to the new bundle and leaves no temp file behind.
        let out = apply(scratch.path(), &new_path, &root, &[]);
        assert_eq!(code(&out), 0, "re-run after {ops} ops: {}", stderr(&out));
        for file in &new.files {
            assert_eq!(
                std::fs::read(root.join(file.path.relative())).unwrap(),
                file.content.as_bytes()
            );
        }
        let leftovers: Vec<_> = tree(&root)
            .into_iter()
            .filter(|(p, ..)| p.contains(".exk8s-"))
            .collect();
        assert!(leftovers.is_empty(), "temp files left: {leftovers:?}");
        if finished {
            break;
        }
        crashed += 1;
    }
    // 7 changed files: two operations each to stage, one each to rename; the hook aborts at
    // the Nth operation, so runs 1..=21 crash and run 22 completes.
    assert_eq!(
        crashed, 21,
        "expected a crash at each of the 21 file operations"
    );
}
