# shellcheck shell=bash
# Helpers for scripts/*.sh: install what is missing, idempotently, on a Debian machine.
# Sourced, not run.

log() { printf '\n==> [%s] %s\n' "$(date +%T)" "$*" >&2; }

have() { command -v "$1" >/dev/null 2>&1; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif have sudo; then sudo "$@"; else
    echo "need root (or sudo) to run: $*" >&2
    return 1
  fi
}

_apt_updated=0
# ensure_packages CMD:PACKAGE ... — installs PACKAGE when CMD is not on PATH.
ensure_packages() {
  local missing=() spec cmd pkg
  for spec in "$@"; do
    cmd=${spec%%:*}
    pkg=${spec#*:}
    # A command, or an absolute path of a file the package installs.
    case $cmd in
      /*) [ -e "$cmd" ] || missing+=("$pkg") ;;
      *) have "$cmd" || missing+=("$pkg") ;;
    esac
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing Debian packages: ${missing[*]}"
  # Another installer may hold dpkg's lock (scripts/test.sh installs beside its builds): wait.
  if [ "$_apt_updated" -eq 0 ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq
    _apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq \
    --no-install-recommends "${missing[@]}"
}

# ensure_rust_components — rustfmt and clippy for the active toolchain.
ensure_rust_components() {
  if ! have cargo; then
    echo "cargo is not installed; install Rust with rustup first" >&2
    return 1
  fi
  local component
  for component in rustfmt clippy; do
    if ! rustup component list --installed 2>/dev/null | grep -q "^${component}"; then
      log "installing rust component ${component}"
      rustup component add "${component}"
    fi
  done
}

# ensure_venv_tool PYPI_PACKAGE COMMAND — installs a Python tool into the repository's .venv.
ensure_venv_tool() {
  local package=$1 command=$2
  if [ ! -x .venv/bin/python ]; then
    log "creating .venv for Python validators"
    python3 -m venv .venv || {
      ensure_packages python3-venv:python3-venv
      python3 -m venv .venv
    }
  fi
  if [ ! -x ".venv/bin/${command}" ]; then
    log "installing ${package} into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "${package}"
  fi
}

# ensure_venv_module PYPI_PACKAGE MODULE — installs a Python library into the repository's .venv
# (for test helpers that import it, such as pyca/cryptography, the strict DER parser).
ensure_venv_module() {
  local package=$1 module=$2
  ensure_venv_tool pip pip
  if ! .venv/bin/python -c "import ${module}" 2>/dev/null; then
    log "installing ${package} into .venv"
    .venv/bin/python -m pip install --quiet --disable-pip-version-check "${package}"
  fi
}

# ensure_postgres — a PostgreSQL server answering on 127.0.0.1:5432 with trust auth for the
# postgres user over loopback (tests create and drop their own databases). Starts the local
# cluster when it is stopped; installs and configures one when none exists.
ensure_postgres() {
  if pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; then return 0; fi
  if ! have pg_ctlcluster || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
    ensure_packages pg_ctlcluster:postgresql
  fi
  local version
  version=$(find /etc/postgresql -mindepth 1 -maxdepth 1 -printf "%f\n" | sort -V | tail -n 1)
  local hba="/etc/postgresql/$version/main/pg_hba.conf"
  if ! grep -q '^host all postgres 127.0.0.1/32 trust' "$hba"; then
    log "allowing trust auth for postgres on 127.0.0.1 (test machine)"
    as_root sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
  fi
  # After a crash (a machine stopped with the server running) the start replays the WAL after
  # syncing the data directory; syncfs syncs each file system once instead of every file of every
  # database (95 s for this cluster's 1.8 GB once, under a build's load; pg_ctl gives up at 60 s).
  local conf="/etc/postgresql/$version/main/conf.d/exk8s-tests.conf"
  if [ ! -f "$conf" ]; then
    printf '# exk8s test machine (scripts/lib/ensure.sh): fast crash recovery\nrecovery_init_sync_method = syncfs\n' |
      as_root tee "$conf" >/dev/null
  fi
  log "starting PostgreSQL $version"
  # --no-wait: the wait below tells a server still recovering from one that died.
  as_root pg_ctlcluster --skip-systemctl-redirect "$version" main start -- --no-wait || true
  local waited=0 status
  until pg_isready -q -h 127.0.0.1 -p 5432; do
    status=$(pg_lsclusters --no-header "$version" main 2>/dev/null | awk '{print $4}')
    # (The first seconds excepted: the server writes its pid file, which says online, as it starts.)
    if { [ "${status%%,*}" != online ] && [ "$waited" -ge 5 ]; } || [ "$waited" -ge 600 ]; then
      echo "PostgreSQL $version does not answer on 127.0.0.1:5432 after ${waited} s (cluster status: ${status:-unknown}); its log ends:" >&2
      as_root tail -n 20 "/var/log/postgresql/postgresql-$version-main.log" >&2 || true
      return 1
    fi
    if [ "$waited" -gt 0 ] && [ $((waited % 30)) -eq 0 ]; then
      log "PostgreSQL $version is still starting after ${waited} s (recovering: its log says how far)"
    fi
    sleep 1
    waited=$((waited + 1))
  done
}

# drop_test_databases — removes databases earlier test runs created (exk8s_test_*).
drop_test_databases() {
  local dbs db
  dbs=$(psql -h 127.0.0.1 -U postgres -At -c "SELECT datname FROM pg_database WHERE datname LIKE 'exk8s_test_%'")
  [ -n "$dbs" ] || return 0
  log "dropping the $(wc -l <<<"$dbs") databases earlier test runs left (exk8s_test_*)"
  for db in $dbs; do
    psql -h 127.0.0.1 -U postgres -q -c "DROP DATABASE IF EXISTS \"$db\"" >/dev/null
  done
}

# ensure_postgres_server_binaries — initdb and pg_ctl, for tests that run a PRIVATE PostgreSQL
# server they can stop and start (the database-fault tests).
ensure_postgres_server_binaries() {
  if compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null; then return 0; fi
  log "installing the PostgreSQL server binaries (initdb, pg_ctl)"
  if [ "$_apt_updated" -eq 0 ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get update -qq
    _apt_updated=1
  fi
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends postgresql
}

# install_tool ARGS...: `cargo install ARGS` of a tool the checks run (with --debug: a tool's
# speed does not matter here, a fresh machine's build time does), without debug information,
# which nobody reads and which costs a sixth of the compile (s3s-fs: 118 CPU-seconds with it, 99
# without).
install_tool() {
  CARGO_PROFILE_DEV_DEBUG=false cargo install "$@"
}

# ensure_cargo_deb — cargo-deb (and dpkg-shlibdeps, which it runs), for the Debian packages.
ensure_cargo_deb() {
  ensure_packages dpkg-shlibdeps:dpkg-dev
  if ! have cargo-deb; then
    log "installing cargo-deb"
    # Debug builds: a test tool's speed does not matter, a fresh machine's build time does.
    install_tool --locked --debug cargo-deb --version 3.8.0
  fi
}

# ensure_mdbook — mdBook, which builds the documentation as a book (book.toml): without its
# live-reload server, which the build does not need.
ensure_mdbook() {
  if ! have mdbook || [ "$(mdbook --version 2>/dev/null)" != "mdbook v0.5.4" ]; then
    log "installing mdbook 0.5.4"
    install_tool --locked --debug mdbook --version 0.5.4 --no-default-features --features search
  fi
}

# ensure_cargo_deny — cargo-deny, which checks the dependency graph against deny.toml.
ensure_cargo_deny() {
  if ! have cargo-deny || [ "$(cargo deny --version 2>/dev/null)" != "cargo-deny 0.20.2" ]; then
    log "installing cargo-deny 0.20.2"
    install_tool --locked --debug cargo-deny --version 0.20.2
  fi
}

# ensure_check_tools — cargo-deny and mdBook, built in one target directory (removed after):
# the dependencies they share (serde, syn, clap, regex…) compile once.
ensure_check_tools() {
  local CARGO_TARGET_DIR rc=0
  CARGO_TARGET_DIR=$(mktemp -d)
  export CARGO_TARGET_DIR
  ensure_cargo_deny && ensure_mdbook || rc=$?
  rm -rf "$CARGO_TARGET_DIR"
  return "$rc"
}

# ensure_axe — axe-core (the accessibility checker the console's browser test runs), from npm,
# once per machine into /var/cache/exk8s/axe-core-<version> (EXK8S_AXE_CACHE); prints the path
# of its axe.min.js.
ensure_axe() {
  local version=4.11.0
  local dir=${EXK8S_AXE_CACHE:-/var/cache/exk8s}/axe-core-$version
  local script=$dir/node_modules/axe-core/axe.min.js
  if [ ! -f "$script" ]; then
    have npm || ensure_packages npm:npm
    log "installing axe-core $version from npm into $dir"
    mkdir -p "$dir"
    npm install --no-audit --no-fund --silent --prefix "$dir" "axe-core@$version" >&2
  fi
  echo "$script"
}

# package_profile — the Cargo profile the Debian packages are made from: release (as they
# ship), or dev when EXK8S_PACKAGE_PROFILE=dev (scripts/test.sh: the packaging checks are of
# what the packages hold, install and run, so they take the binaries the test build made instead
# of compiling every dependency again). Sets package_profile and package_dir (its directory
# under target/).
# shellcheck disable=SC2034 # package_dir is the caller's
package_profile() {
  package_profile=${EXK8S_PACKAGE_PROFILE:-release}
  case "$package_profile" in
    release) package_dir=release ;;
    dev) package_dir=debug ;;
    *) echo "EXK8S_PACKAGE_PROFILE must be release or dev, not \"$package_profile\"" >&2; return 1 ;;
  esac
}
