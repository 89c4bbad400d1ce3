//! Machines that boot, for the dev stack's compute SIMULATOR (`exk8s-api dev --machines
//! nspawn`, Linux and root): every VM the compute API creates boots a copy of a baked node image
//! as a `systemd-nspawn` container with systemd as PID 1 ([`nspawn`]), on a LAN of network
//! namespaces at the address the simulator gave it ([`lan`]). In each machine's namespace the
//! cloud's services answer as on a cloud: the instance metadata at `169.254.169.254:80` (the
//! simulator's IMDS for exactly that VM), the cloud's DNS as `/etc/hosts` lines kept in step
//! with the DNS simulator's records, and the host's services the stack names (the API, a
//! package mirror, a registry) at `127.0.0.1` and their host port. Stop powers a machine off
//! through its systemd, start boots it again from its disk, delete ends it and removes its
//! disk; the VM's state says what the machine is doing ([`MachineState`]).

mod cpu;
mod disk;
mod hosts;
mod lan;
mod nspawn;
mod sysctl;

pub use cpu::CpuShare;
use hosts::{write_hosts, write_zone};

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Request, Uri};
use serde::Serialize;
use tokio::task::AbortHandle;

use super::{DnsSim, lock};

/// Where a cloud's instance metadata answers, inside every machine.
pub const IMDS_ADDRESS: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);

/// Why a machine could not be made, booted or ended.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("{tool} could not be run: {detail}")]
    Tool { tool: &'static str, detail: String },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("{what}: {detail}")]
    Io { what: String, detail: String },
    #[error("{0}")]
    Boot(String),
    #[error("{0}")]
    Unsupported(String),
}

/// What a machine is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MachineState {
    /// Its disk is being made, or it is starting systemd.
    Pending,
    Running,
    /// Powering off through its systemd.
    Stopping,
    Stopped,
    /// It could not be made or booted (the error says why); a start tries again.
    Failed,
}

impl MachineState {
    /// The state a cloud's VM API shows for it.
    pub fn cloud_state(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Running => "running",
            Self::Stopping => "stopping",
            Self::Stopped | Self::Failed => "stopped",
        }
    }
}

/// A machine as `GET /sim/machines/{id}` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct MachineInfo {
    pub hostname: String,
    pub state: MachineState,
    /// Its PID 1 (systemd) as the host numbers it, while it runs (`nsenter --target`).
    pub init_pid: Option<u32>,
    pub disk: PathBuf,
    pub console: PathBuf,
    /// Its network namespace, under `/run/netns`.
    pub netns: String,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// How the dev stack's machines are made.
#[derive(Debug, Clone)]
pub struct MachineConfig {
    /// The baked node image: a root with systemd and exk8s-agent (`packaging/bake-image.sh`).
    pub image: PathBuf,
    /// Where each machine's disk and console live.
    pub dir: PathBuf,
    /// The LAN's prefix length (the simulator's CIDR).
    pub prefix: u8,
    /// Host loopback ports each machine reaches at `127.0.0.1` and the same port (the API's
    /// first).
    pub forwards: Vec<u16>,
    /// The most CPU time each machine gets, as a VM's vCPUs cap it; unset, machines share
    /// every core of the host.
    pub cpus: Option<CpuShare>,
}

impl MachineConfig {
    /// Checks what booting machines needs before any VM is made, naming what is missing.
    pub fn check(&self) -> Result<(), MachineError> {
        if !cfg!(target_os = "linux") {
            return Err(MachineError::Unsupported(
                "--machines nspawn needs Linux (systemd-nspawn, network namespaces)".into(),
            ));
        }
        if !rustix::process::geteuid().is_root() {
            return Err(MachineError::Unsupported(
                "--machines nspawn needs root (network namespaces, cgroups, systemd-nspawn)".into(),
            ));
        }
        for (path, what) in [
            (
                "sbin/init",
                "systemd (scripts/node-image.sh makes such a root)",
            ),
            (
                "usr/bin/exk8s-agent",
                "exk8s-agent (bake it with packaging/bake-image.sh)",
            ),
            (
                "etc/exk8s/agent.toml",
                "an agent.toml naming the API (bake-image.sh --config)",
            ),
        ] {
            if !self.image.join(path).exists() {
                return Err(MachineError::Unsupported(format!(
                    "--node-image {}: no /{path}: the image needs {what}",
                    self.image.display()
                )));
            }
        }
        for (tool, package) in [
            ("systemd-nspawn", "systemd-container"),
            ("nsenter", "util-linux"),
            ("ip", "iproute2"),
        ] {
            let found = std::env::var_os("PATH")
                .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(tool).is_file()));
            if !found {
                return Err(MachineError::Unsupported(format!(
                    "--machines nspawn needs {tool} (Debian's {package})"
                )));
            }
        }
        Ok(())
    }
}

#[derive(Debug)]
struct Slot {
    hostname: String,
    address: String,
    state: MachineState,
    booted: Option<nspawn::Booted>,
    /// The tasks serving the machine's namespace (forwards, IMDS).
    services: Vec<AbortHandle>,
    error: Option<String>,
    /// The network settings last set in its namespace ([`sysctl`]).
    sysctls: Vec<String>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.services.iter().for_each(AbortHandle::abort);
    }
}

/// The dev stack's booted machines. Shared (`Arc`); every slow step runs on a blocking thread.
#[derive(Debug)]
pub struct NspawnMachines {
    config: MachineConfig,
    lan: lan::Lan,
    slots: Mutex<BTreeMap<i64, Slot>>,
    /// The IMDS simulator's routes (`/sim/imds/{vm}/…`), set once the stack is built.
    imds: OnceLock<Router>,
    dns: DnsSim,
    runtime: tokio::runtime::Handle,
}

impl NspawnMachines {
    /// Machines made as `config` says, on a LAN of their own, their `/etc/hosts` following
    /// `dns`. Call from inside the runtime that serves their namespaces.
    pub fn new(config: MachineConfig, dns: DnsSim) -> Result<Arc<Self>, MachineError> {
        config.check()?;
        std::fs::create_dir_all(&config.dir).map_err(|e| MachineError::Io {
            what: format!("creating {}", config.dir.display()),
            detail: e.to_string(),
        })?;
        end_leftovers(&config.dir);
        for change in sysctl::set_kubelet_kernel(Path::new("/proc/sys"))? {
            tracing::warn!(%change, "set a host kernel parameter the machines' kubelets need");
        }
        for change in sysctl::raise_host_limits(Path::new("/proc/sys"))? {
            tracing::warn!(%change, "raised a host limit the machines share");
        }
        let tag = format!("{:x}", std::process::id());
        let lan = lan::Lan::new(&tag, config.prefix)?;
        // The gateway refuses every lookup sent to it (`Lan::resolver`) with an ICMP port
        // unreachable, which the kernel sends at most one a second per machine by default: a
        // burst of lookups (a chart pull tries a name several times, CoreDNS forwards its own)
        // would otherwise wait out its timeouts after all.
        sysctl::apply(&lan.switch(), &["net.ipv4.icmp_ratelimit=0".to_owned()])?;
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            MachineError::Unsupported(format!("machines need a tokio runtime: {e}"))
        })?;
        Ok(Arc::new(Self {
            config,
            lan,
            slots: Mutex::new(BTreeMap::new()),
            imds: OnceLock::new(),
            dns,
            runtime,
        }))
    }

    /// Serves `imds` (the IMDS simulator's routes) inside every machine from now on, and keeps
    /// each machine's state and `/etc/hosts` up to date until the runtime ends.
    pub fn serve(self: &Arc<Self>, imds: Router) {
        let _ = self.imds.set(imds);
        let this = Arc::downgrade(self);
        self.runtime.spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tick.tick().await;
                let Some(this) = this.upgrade() else { return };
                let _ = tokio::task::spawn_blocking(move || this.look_after()).await;
            }
        });
    }

    fn disk(&self, id: i64) -> PathBuf {
        self.config.dir.join(format!("vm-{id}"))
    }

    fn console(&self, id: i64) -> PathBuf {
        self.config.dir.join(format!("vm-{id}.console"))
    }

    /// What machine `id` is doing; `None` when there is no such machine.
    pub fn state(&self, id: i64) -> Option<MachineState> {
        lock(&self.slots).get(&id).map(|s| s.state)
    }

    pub fn info(&self, id: i64) -> Option<MachineInfo> {
        let slots = lock(&self.slots);
        let slot = slots.get(&id)?;
        Some(MachineInfo {
            hostname: slot.hostname.clone(),
            state: slot.state,
            init_pid: slot.booted.as_ref().map(|b| b.init),
            disk: self.disk(id),
            console: self.console(id),
            netns: self.lan.netns(id),
            error: slot.error.clone(),
        })
    }

    /// Boots VM `id` (a new machine, or a stopped one from its disk) as `hostname` at
    /// `address`; nothing when it is booting or running.
    pub fn power_on(self: &Arc<Self>, id: i64, hostname: &str, address: &str) {
        {
            let mut slots = lock(&self.slots);
            let slot = slots.entry(id).or_insert_with(|| Slot {
                hostname: hostname.to_owned(),
                address: address.to_owned(),
                state: MachineState::Stopped,
                booted: None,
                services: Vec::new(),
                error: None,
                sysctls: Vec::new(),
            });
            if !matches!(slot.state, MachineState::Stopped | MachineState::Failed) {
                return;
            }
            slot.state = MachineState::Pending;
            slot.error = None;
        }
        let this = Arc::clone(self);
        self.runtime.spawn_blocking(move || {
            let booted = this.boot(id);
            let mut slots = lock(&this.slots);
            let Some(slot) = slots.get_mut(&id) else {
                // Deleted while it booted: it ends here, and so does what it left.
                drop(slots);
                drop(booted);
                this.remove(id);
                return;
            };
            match booted {
                Ok(booted) => {
                    tracing::info!(vm = id, init = booted.init, "machine booted");
                    slot.booted = Some(booted);
                    slot.state = MachineState::Running;
                }
                Err(e) => {
                    tracing::warn!(vm = id, error = %e, "machine failed to boot");
                    slot.error = Some(e.to_string());
                    slot.state = MachineState::Failed;
                }
            }
        });
    }

    /// Makes machine `id`'s disk and namespace when missing, and boots it.
    fn boot(&self, id: i64) -> Result<nspawn::Booted, MachineError> {
        let (hostname, address, served) = {
            let slots = lock(&self.slots);
            let slot = slots
                .get(&id)
                .ok_or_else(|| MachineError::Boot(format!("VM {id} was deleted")))?;
            (
                slot.hostname.clone(),
                slot.address.clone(),
                !slot.services.is_empty(),
            )
        };
        let disk = self.disk(id);
        let resolver = self.lan.resolver(&address)?;
        disk::make(&self.config.image, &disk, &hostname, &resolver)?;
        if !served {
            self.lan
                .attach(id, &address, &[&format!("{IMDS_ADDRESS}/32")])?;
            let services = self.services(id)?;
            match lock(&self.slots).get_mut(&id) {
                Some(slot) => slot.services = services,
                None => services.iter().for_each(AbortHandle::abort),
            }
        }
        write_hosts(&disk, &self.dns.records());
        // Named as its namespace, which no other stack's machine is: two machines' systemd in
        // one cgroup tree fail each other's units.
        let name = self.lan.netns(id);
        nspawn::Booted::boot(&disk, &name, &name, &self.console(id), self.config.cpus)
    }

    /// The listeners of machine `id`'s namespace: every forwarded port and the IMDS.
    fn services(&self, id: i64) -> Result<Vec<AbortHandle>, MachineError> {
        let netns = self.lan.netns(id);
        let _entered = self.runtime.enter();
        let mut services = Vec::new();
        for &port in &self.config.forwards {
            let listener = lan::listen_in(&netns, SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
            services.push(
                self.runtime
                    .spawn(lan::relay(listener, port))
                    .abort_handle(),
            );
        }
        if let Some(imds) = self.imds.get() {
            let listener = lan::listen_in(&netns, SocketAddr::from((IMDS_ADDRESS, 80)))?;
            let service = imds_of(imds.clone(), id);
            let serving = async move {
                let _ = axum::serve(
                    listener,
                    axum::ServiceExt::<Request<Body>>::into_make_service(service),
                )
                .await;
            };
            services.push(self.runtime.spawn(serving).abort_handle());
        }
        Ok(services)
    }

    /// Powers machine `id` off through its systemd; its disk, address and namespace stay.
    pub fn power_off(self: &Arc<Self>, id: i64) {
        let booted = {
            let mut slots = lock(&self.slots);
            let Some(slot) = slots.get_mut(&id) else {
                return;
            };
            let Some(booted) = slot.booted.take() else {
                return;
            };
            slot.state = MachineState::Stopping;
            booted
        };
        let this = Arc::clone(self);
        self.runtime.spawn_blocking(move || {
            match booted.power_off() {
                Ok(()) => tracing::info!(vm = id, "machine powered off"),
                Err(e) => tracing::warn!(vm = id, error = %e, "machine power-off"),
            }
            if let Some(slot) = lock(&this.slots).get_mut(&id)
                && slot.state == MachineState::Stopping
            {
                slot.state = MachineState::Stopped;
            }
        });
    }

    /// Deletes machine `id` as a cloud's delete does: its systemd shuts it down first (the
    /// kubelet stops its pods, an apiserver fails `/readyz` before its listener closes), then
    /// its disk, console and namespace are removed. A machine still booting is removed by its
    /// boot, once that ends.
    pub fn destroy(self: &Arc<Self>, id: i64) {
        let Some(mut slot) = lock(&self.slots).remove(&id) else {
            return;
        };
        if slot.state == MachineState::Pending {
            return;
        }
        let this = Arc::clone(self);
        self.runtime.spawn_blocking(move || {
            if let Some(booted) = slot.booted.take() {
                match booted.power_off() {
                    Ok(()) => tracing::info!(vm = id, "machine shut down for its delete"),
                    Err(e) => {
                        tracing::warn!(vm = id, error = %e, "machine shutdown for its delete")
                    }
                }
            }
            drop(slot);
            this.remove(id);
        });
    }

    /// Removes what machine `id` leaves on the host: its namespace, disk and console.
    fn remove(&self, id: i64) {
        self.lan.detach(id);
        for path in [self.disk(id), self.disk(id).with_extension("partial")] {
            if path.exists()
                && let Err(e) = std::fs::remove_dir_all(&path)
            {
                tracing::warn!(vm = id, path = %path.display(), error = %e, "removing a disk");
            }
        }
        let _ = std::fs::remove_file(self.console(id));
        tracing::info!(vm = id, "machine deleted");
    }

    /// Powers every machine off (the dev stack stopping), all at once, and removes the LAN;
    /// their disks stay for the next start.
    pub fn power_off_all(&self) {
        let slots = std::mem::take(&mut *lock(&self.slots));
        std::thread::scope(|s| {
            for (id, mut slot) in slots {
                s.spawn(move || {
                    if let Some(booted) = slot.booted.take() {
                        match booted.power_off() {
                            Ok(()) => tracing::info!(vm = id, "machine powered off"),
                            Err(e) => tracing::warn!(vm = id, error = %e, "machine power-off"),
                        }
                    }
                    drop(slot);
                    self.lan.detach(id);
                });
            }
        });
        self.lan.remove();
    }

    /// One round of looking after the machines: one that went down by itself is `stopped`,
    /// each running one's `/etc/hosts` says what the DNS simulator says, and its namespace has
    /// the network settings its `/etc/sysctl.d` asks for.
    fn look_after(&self) {
        let records = self.dns.records();
        write_zone(&self.config.dir, &records);
        let mut running = Vec::new();
        for (id, slot) in lock(&self.slots).iter_mut() {
            if let Some(booted) = slot.booted.as_mut() {
                if booted.running() {
                    running.push(*id);
                } else {
                    tracing::info!(vm = id, "machine went down by itself");
                    slot.booted = None;
                    slot.state = MachineState::Stopped;
                }
            }
        }
        for id in running {
            let disk = self.disk(id);
            write_hosts(&disk, &records);
            self.set_sysctls(id, sysctl::wanted(&disk));
        }
    }

    /// Sets `wanted` in machine `id`'s namespace unless that is what was set last.
    fn set_sysctls(&self, id: i64, wanted: Vec<String>) {
        let changed = lock(&self.slots)
            .get(&id)
            .is_some_and(|slot| slot.sysctls != wanted);
        if !changed || wanted.is_empty() {
            return;
        }
        let netns = self.lan.netns(id);
        match sysctl::apply(&netns, &wanted) {
            Ok(()) => tracing::info!(vm = id, settings = ?wanted, "machine's network settings"),
            Err(e) => tracing::warn!(vm = id, error = %e, "machine's network settings"),
        }
        // Not tried again until the files change: the warning says what failed.
        if let Some(slot) = lock(&self.slots).get_mut(&id) {
            slot.sysctls = wanted;
        }
    }
}

/// Ends every machine a killed stack left running in `dir` (each recorded beside its disk) and
/// removes the namespaces it left: a restarted stack must not boot a disk that still runs.
fn end_leftovers(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for record in entries.flatten().map(|e| e.path()) {
        if record.extension().is_none_or(|x| x != "pid") {
            continue;
        }
        let disk = record.with_extension("");
        if let Some(netns) = nspawn::end_leftover(&record, &disk) {
            let lan = netns
                .rsplit_once("-vm")
                .map(|(tag, _)| format!("{tag}-lan"));
            for namespace in [Some(netns), lan].into_iter().flatten() {
                if Path::new("/run/netns").join(&namespace).exists() {
                    let _ = lan::ip(&["netns", "del", &namespace]);
                }
            }
        }
    }
}

/// The IMDS routes as VM `id` sees them: its requests for `/…` are the simulator's
/// `/sim/imds/{id}/…`.
fn imds_of(
    imds: Router,
    id: i64,
) -> tower::util::MapRequest<Router, impl FnMut(Request<Body>) -> Request<Body> + Clone> {
    tower::ServiceExt::map_request(imds, move |mut request: Request<Body>| {
        let path = request
            .uri()
            .path_and_query()
            .map_or("/", |p| p.as_str())
            .to_owned();
        if let Ok(uri) = format!("/sim/imds/{id}{path}").parse::<Uri>() {
            *request.uri_mut() = uri;
        }
        request
    })
}

#[cfg(test)]
mod tests;
