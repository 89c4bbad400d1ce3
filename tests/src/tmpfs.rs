//! A real, small filesystem for disk-full tests: a size-limited tmpfs mounted on a temp dir
//! (root only — CI runs as root; a test that cannot mount fails, it never skips), filled to
//! the last byte on demand and unmounted on drop.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    /// Mounts a tmpfs of `kib` KiB; `owner` (`user:group`) owns its root when given.
    pub fn mount(kib: u64, owner: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("a temp dir");
        let out = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={kib}k,mode=0755"),
                "tmpfs",
            ])
            .arg(dir.path())
            .output()
            .expect("running mount");
        assert!(
            out.status.success(),
            "mounting a {kib} KiB tmpfs failed (disk-full tests need root, as CI has): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        if let Some(owner) = owner {
            let status = Command::new("chown")
                .arg(owner)
                .arg(dir.path())
                .status()
                .expect("running chown");
            assert!(status.success(), "chown {owner} {}", dir.path().display());
        }
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Writes a filler file until the filesystem refuses another byte; returns its path.
    pub fn fill(&self) -> PathBuf {
        let path = self.path().join("filler");
        let mut file = std::fs::File::create(&path).expect("creating the filler");
        let block = vec![0xa5u8; 4096];
        loop {
            match file.write(&block) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(28) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        // Byte by byte into the last partial block.
        while file.write(&[0]).is_ok_and(|n| n == 1) {}
        let _ = file.sync_all();
        path
    }

    /// Bytes still free.
    pub fn free_bytes(&self) -> u64 {
        let out = Command::new("df")
            .args(["--output=avail", "-B1"])
            .arg(self.path())
            .output()
            .expect("running df");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .nth(1)
            .and_then(|l| l.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}
