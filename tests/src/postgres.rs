//! PostgreSQL for tests. [`fresh_shared_database`] makes a new database on the suite's shared
//! server (`EXK8S_TEST_POSTGRES_URL`, which scripts/test.sh starts). [`PrivatePostgres`] is a
//! server of its own for tests that stop and start their database: its own data directory and
//! loopback port, made with `initdb` and driven with `pg_ctl`, so stopping it never disturbs
//! the shared server. It runs as the `postgres` user when the tests run as root (PostgreSQL
//! refuses to run as root).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::procs::free_port;

/// Creates `exk8s_test_<label>_<pid>` on the shared server (dropping a leftover of that name);
/// returns its URL.
pub fn fresh_shared_database(label: &str) -> String {
    let admin = std::env::var("EXK8S_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let name = format!("exk8s_test_{label}_{}", std::process::id());
    let created = Command::new("psql")
        .arg(&admin)
        .args([
            "-q",
            "-c",
            &format!("DROP DATABASE IF EXISTS {name}"),
            "-c",
            &format!("CREATE DATABASE {name}"),
        ])
        .output()
        .expect("running psql (scripts/test.sh installs postgresql-client)");
    assert!(
        created.status.success(),
        "PostgreSQL must answer at {admin}: {}",
        String::from_utf8_lossy(&created.stderr)
    );
    let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
    format!("{base}/{name}")
}

pub struct PrivatePostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    run_as_postgres: bool,
    _dir: tempfile::TempDir,
}

/// The newest installed server's bin directory (Debian: /usr/lib/postgresql/<major>/bin).
fn server_bin_dir() -> PathBuf {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let major = e.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((major, bin))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, bin)| bin).expect(
        "no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql: \
         scripts/test.sh installs the `postgresql` package",
    )
}

fn is_root() -> bool {
    let out = Command::new("id")
        .arg("-u")
        .output()
        .expect("running id -u");
    String::from_utf8_lossy(&out.stdout).trim() == "0"
}

impl PrivatePostgres {
    /// Initialises a cluster (trust auth, loopback only) and starts it.
    pub fn start() -> Self {
        let bin = server_bin_dir();
        let dir = tempfile::tempdir().expect("a temp dir");
        let run_as_postgres = is_root();
        if run_as_postgres {
            let status = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .status()
                .expect("running chown");
            assert!(status.success(), "chown postgres {}", dir.path().display());
        }
        let data = dir.path().join("data");
        let pg = Self {
            bin,
            data,
            port: free_port(),
            run_as_postgres,
            _dir: dir,
        };
        pg.run(
            "initdb",
            &[
                "-D",
                &pg.data.display().to_string(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--no-sync",
            ],
        );
        pg.start_again();
        pg
    }

    fn run(&self, tool: &str, args: &[&str]) -> Output {
        let program = self.bin.join(tool);
        let mut command = if self.run_as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&program);
            c
        } else {
            Command::new(&program)
        };
        let out = command
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", program.display()));
        assert!(
            out.status.success(),
            "{tool} {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn socket_dir(&self) -> &Path {
        self.data.parent().unwrap_or(&self.data)
    }

    /// Starts the server (again) and waits until it accepts connections.
    pub fn start_again(&self) {
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=100",
            self.port,
            self.socket_dir().display()
        );
        let log = self.socket_dir().join("server.log").display().to_string();
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data.display().to_string(),
                "-o",
                &options,
                "-l",
                &log,
                "-w",
                "-t",
                "60",
                "start",
            ],
        );
    }

    /// Stops the server the hard way (`-m immediate`: connections cut, no checkpoint — as if
    /// its machine lost power) and waits until it is gone.
    pub fn stop(&self) {
        self.run(
            "pg_ctl",
            &[
                "-D",
                &self.data.display().to_string(),
                "-m",
                "immediate",
                "-w",
                "stop",
            ],
        );
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A URL of the built-in `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let program = self.bin.join("pg_ctl");
        let data = self.data.display().to_string();
        let args = ["-D", data.as_str(), "-m", "immediate", "stop"];
        let _ = if self.run_as_postgres {
            Command::new("runuser")
                .args(["-u", "postgres", "--"])
                .arg(&program)
                .args(args)
                .output()
        } else {
            Command::new(&program).args(args).output()
        };
    }
}
