//! Artifacts through `prereqs --root`: a digest mismatch installs nothing, the `.sha256`
//! published beside a download is used when no digest is pinned (and its absence fails closed),
//! a `.tar.gz` member is extracted, and an installed artifact costs no network on the next run.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use exk8s_common::names::{FileMode, Sha256Digest};
use exk8s_common::payload::Artifact;

use crate::helpers::{VM_ID, agent, bundle_file, code, files, payload, sign, stderr};
use crate::server::{Reply, Request, Server};

const BINARY: &[u8] = b"#!/bin/sh\necho etcd\n";

fn tarball() -> Vec<u8> {
    let mut builder = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut header = tar::Header::new_gnu();
    header.set_size(BINARY.len() as u64);
    header.set_mode(0o755);
    header.set_cksum();
    builder
        .append_data(&mut header, "etcd-v3.6.10-linux-amd64/etcd", BINARY)
        .unwrap();
    builder.into_inner().unwrap().finish().unwrap()
}

fn serve() -> Server {
    Server::start(|r: &Request| match r.path.as_str() {
        "/etcd" => Reply::ok(BINARY),
        "/etcd.sha256" => Reply::ok(format!("{}  etcd\n", Sha256Digest::of(BINARY))),
        "/unpublished" => Reply::ok(BINARY),
        "/wrong" => Reply::ok(BINARY),
        "/wrong.sha256" => Reply::ok(format!("{}\n", Sha256Digest::of(b"other"))),
        "/etcd.tar.gz" => Reply::ok(tarball()),
        _ => Reply::status(404),
    })
}

fn artifact(
    server: &Server,
    path: &str,
    sha256: Option<Sha256Digest>,
    member: Option<&str>,
) -> Artifact {
    Artifact {
        name: "etcd".parse().unwrap(),
        version: "v3.6.10".parse().unwrap(),
        url: format!("{}{path}", server.url).parse().unwrap(),
        sha256,
        archive_member: member.map(|m| m.parse().unwrap()),
        dest: "/usr/local/bin/etcd".parse().unwrap(),
        mode: FileMode::EXECUTABLE,
    }
}

fn prereqs(scratch: &Path, artifact: Artifact) -> (std::process::Output, std::path::PathBuf) {
    let mut bundle = payload(VM_ID, 1, files("a"));
    bundle.artifacts = vec![artifact];
    let path = bundle_file(scratch, "b.json", &sign(&bundle));
    let root = scratch.join("image");
    let out = agent(scratch)
        .args(["prereqs", "--bundle"])
        .arg(&path)
        .arg("--root")
        .arg(&root)
        .output()
        .unwrap();
    (out, root)
}

#[test]
fn a_pinned_digest_that_does_not_match_installs_nothing() {
    let scratch = tempfile::tempdir().unwrap();
    let server = serve();
    let (out, root) = prereqs(
        scratch.path(),
        artifact(&server, "/etcd", Some(Sha256Digest::of(b"not etcd")), None),
    );
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(stderr(&out).contains("digest mismatch"), "{}", stderr(&out));
    assert!(!root.join("usr/local/bin/etcd").exists());
}

#[test]
fn the_published_sha256_is_used_when_none_is_pinned_and_a_second_run_is_offline() {
    let scratch = tempfile::tempdir().unwrap();
    let server = serve();
    let (out, root) = prereqs(scratch.path(), artifact(&server, "/etcd", None, None));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let dest = root.join("usr/local/bin/etcd");
    assert_eq!(std::fs::read(&dest).unwrap(), BINARY);
    assert_eq!(
        std::fs::metadata(&dest).unwrap().permissions().mode() & 0o7777,
        0o755
    );
    let requests = server.paths().len();
    let (out, _) = prereqs(scratch.path(), artifact(&server, "/etcd", None, None));
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        server.paths().len(),
        requests,
        "an installed artifact was downloaded again"
    );
}

#[test]
fn without_any_digest_the_install_fails_closed() {
    for path in ["/unpublished", "/wrong"] {
        let scratch = tempfile::tempdir().unwrap();
        let server = serve();
        let (out, root) = prereqs(scratch.path(), artifact(&server, path, None, None));
        assert_eq!(code(&out), 5, "{path}: {}", stderr(&out));
        assert!(
            !root.join("usr/local/bin/etcd").exists(),
            "{path} installed"
        );
    }
}

#[test]
fn a_tarball_member_is_extracted_after_the_archive_digest_checks_out() {
    let scratch = tempfile::tempdir().unwrap();
    let server = serve();
    let digest = Sha256Digest::of(&tarball());
    let (out, root) = prereqs(
        scratch.path(),
        artifact(
            &server,
            "/etcd.tar.gz",
            Some(digest),
            Some("etcd-v3.6.10-linux-amd64/etcd"),
        ),
    );
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_eq!(
        std::fs::read(root.join("usr/local/bin/etcd")).unwrap(),
        BINARY
    );

    let scratch = tempfile::tempdir().unwrap();
    let (out, _) = prereqs(
        scratch.path(),
        artifact(&server, "/etcd.tar.gz", Some(digest), Some("etcd/missing")),
    );
    assert_eq!(code(&out), 5, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no file etcd/missing"),
        "{}",
        stderr(&out)
    );
}
