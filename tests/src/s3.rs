//! A real S3-compatible server (`s3s-fs`: SigV4, multipart uploads) over a directory on the
//! machine's loopback, a bucket made, and the environment the API reads to use it.

use std::path::Path;
use std::time::Duration;

use crate::procs::{Proc, free_port, wait_until};

/// The bucket [`serve`] makes.
pub const BUCKET: &str = "exk8s-snapshots";

/// A running `s3s-fs` over `root` (its log beside it) with [`BUCKET`] made.
pub struct S3 {
    pub server: Proc,
    /// The environment the API reads (its credentials, region and endpoint).
    pub env: Vec<(&'static str, String)>,
}

/// Serves `root` on a free loopback port.
pub fn serve(root: &Path) -> S3 {
    let port = free_port();
    std::fs::create_dir_all(root.join(BUCKET)).unwrap();
    let log = std::fs::File::create(root.with_extension("log")).unwrap();
    let server = Proc(
        std::process::Command::new(crate::bins::s3_server())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--access-key",
                "exk8s-test",
                "--secret-key",
                "exk8s-test-secret",
            ])
            .arg(root)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap(),
    );
    wait_until("the S3 server", Duration::from_secs(30), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
    let env = vec![
        ("AWS_ACCESS_KEY_ID", "exk8s-test".to_owned()),
        ("AWS_SECRET_ACCESS_KEY", "exk8s-test-secret".to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        ("AWS_ENDPOINT", format!("http://127.0.0.1:{port}")),
        ("AWS_ALLOW_HTTP", "true".to_owned()),
    ];
    S3 { server, env }
}
