//! SIMULATORS of services exk8s does not own — compute, DNS (and, in the dev stack, instance
//! metadata). For a laptop and for tests only; `serve` uses them only when asked by flag.
//!
//! [`ComputeSim`] hands out VM ids from 101 and private addresses from a configurable CIDR
//! (default `127.0.10.0/24`, so rendered units work on loopback), and has fault knobs: fail the
//! Nth VM create, fail security-group creation, delay address assignment, add latency; and a
//! VM can be stopped, started or destroyed behind exk8s's back ([`ComputeSim::befall`]).
//! [`server::router`] serves the same REST contract as the real service over HTTP, so the
//! simulator can outlive a killed API process.

mod dns;
pub mod imds;
pub mod machines;
pub mod server;
mod store;

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::compute::{
    Compute, ComputeError, CreateSecurityGroup, CreateVm, SecurityGroup, Subnet, Vm,
};

pub use dns::DnsSim;

/// Fault injection for tests and load experiments.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct Faults {
    /// Fail the Nth `create_vm` call (1-based, counted over the simulator's life).
    pub fail_vm_create_nth: Option<u32>,
    pub fail_group_create: bool,
    /// Fail `get_subnet` (the first founding call) with a 503.
    pub fail_subnet_lookup: bool,
    /// A VM reports no address for this many `get_vm` calls after creation.
    pub address_after_polls: u32,
    /// Added to every call.
    pub latency_ms: u64,
    pub fail_dns: bool,
    /// `create_vm` waits while this is set (a test holds founding at its first VM).
    pub hold_vm_create: bool,
    /// With `hold_vm_create`, only calls made once this many got through are held (counted
    /// over the simulator's life, as `fail_vm_create_nth`): a test holds founding with its
    /// first VMs made.
    pub hold_vm_create_after: u32,
    /// `delete_vm` waits while this is set (a test looks at what was done before a delete).
    pub hold_vm_delete: bool,
}

/// Something that happens to a VM outside exk8s ([`ComputeSim::befall`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum VmEvent {
    Stop,
    Start,
    Destroy,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct ComputeState {
    next_vm: i64,
    next_group: i64,
    /// Where the search for a free address starts: addresses are handed out in turn, so a
    /// deleted VM's address is reused only once the range wrapped (as clouds avoid quick reuse).
    #[serde(default)]
    next_host: u32,
    vm_creates: u32,
    /// id → (VM, polls left before it shows addresses, its security groups).
    vms: BTreeMap<i64, (Vm, u32, Vec<i64>)>,
    groups: BTreeMap<i64, SecurityGroup>,
}

/// The compute simulator. Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct ComputeSim {
    state: Arc<Mutex<ComputeState>>,
    faults: Arc<Mutex<Faults>>,
    network: Ipv4Addr,
    prefix: u8,
    store: store::Store,
    /// Booted machines behind the VMs (`dev --machines nspawn`); none: VMs are rows only.
    machines: Option<Arc<machines::NspawnMachines>>,
}

/// The first host number handed out: .1 to .10 are the cloud's (gateway, DNS, reserved).
const FIRST_HOST: u32 = 11;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the simulator's maps half-updated in a way
    // that matters; keep serving.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn unavailable(what: &str) -> ComputeError {
    ComputeError::Unavailable(format!("simulated failure: {what}"))
}

impl ComputeSim {
    /// VMs get addresses from `cidr` (an IPv4 network, e.g. `127.0.10.0/24`), starting at .11.
    pub fn new(cidr: &str) -> Result<Self, String> {
        let (addr, prefix) = cidr.split_once('/').ok_or("expected a.b.c.d/prefix")?;
        let network: Ipv4Addr = addr.parse().map_err(|_| format!("bad address in {cidr}"))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| format!("bad prefix in {cidr}"))?;
        if !(8..=28).contains(&prefix) {
            return Err(format!("{cidr}: prefix must be 8–28"));
        }
        let state = ComputeState {
            next_vm: 101,
            next_group: 1,
            ..ComputeState::default()
        };
        // The network's own address, whatever host bits the flag carried.
        let network = Ipv4Addr::from(u32::from(network) & (u32::MAX << (32 - prefix)));
        Ok(Self {
            state: Arc::new(Mutex::new(state)),
            faults: Arc::new(Mutex::new(Faults::default())),
            network,
            prefix,
            store: store::Store::default(),
            machines: None,
        })
    }

    /// The simulator with its VMs booted as machines by `machines`: creates, stops, starts and
    /// deletes do to the machine what a cloud does ([`Self::boot_machines`] boots the VMs it
    /// holds already).
    pub fn with_machines(mut self, machines: Arc<machines::NspawnMachines>) -> Self {
        self.machines = Some(machines);
        self
    }

    /// Boots every running VM's machine (a restarted stack's VMs boot again from their disks).
    pub fn boot_machines(&self) {
        let Some(machines) = &self.machines else {
            return;
        };
        for vm in self.vms() {
            if let (true, Some(address)) = (vm.state == "running", vm.private_ipv4.as_deref()) {
                machines.power_on(vm.id, &vm.name, address);
            }
        }
    }

    /// The booted machines behind the VMs, when there are.
    pub fn machines(&self) -> Option<&Arc<machines::NspawnMachines>> {
        self.machines.as_ref()
    }

    /// `vm` as the cloud shows it: a booted machine's state is what it is doing.
    fn shown(&self, mut vm: Vm) -> Vm {
        if let Some(state) = self.machines.as_ref().and_then(|m| m.state(vm.id)) {
            vm.state = state.cloud_state().to_owned();
        }
        vm
    }

    /// A simulator whose VMs and groups live in `path` and survive a restart: ids continue
    /// where they stopped, and VMs made before still have their instance metadata.
    pub fn persistent(cidr: &str, path: std::path::PathBuf) -> Result<Self, String> {
        let mut sim = Self::new(cidr)?;
        sim.store = store::Store::at(path);
        if let Some(saved) = sim.store.load::<ComputeState>()? {
            *lock(&sim.state) = saved;
        }
        Ok(sim)
    }

    /// Saves the state after a change (no-op for an in-memory simulator).
    fn saved(&self, state: &ComputeState) {
        self.store.save(state);
    }

    pub fn set_faults(&self, faults: Faults) {
        *lock(&self.faults) = faults;
    }

    pub fn faults(&self) -> Faults {
        lock(&self.faults).clone()
    }

    pub fn vms(&self) -> Vec<Vm> {
        let vms: Vec<Vm> = lock(&self.state)
            .vms
            .values()
            .map(|(vm, ..)| vm.clone())
            .collect();
        vms.into_iter().map(|vm| self.shown(vm)).collect()
    }

    pub fn security_groups(&self) -> Vec<SecurityGroup> {
        lock(&self.state).groups.values().cloned().collect()
    }

    /// Every VM still waiting for its address shows it at its next poll (a test's way to say
    /// "the cloud catches up now", whatever `address_after_polls` said at creation).
    pub fn assign_addresses_now(&self) {
        for (_, polls_left, _) in lock(&self.state).vms.values_mut() {
            *polls_left = 0;
        }
    }

    /// What happens to a VM outside exk8s (a test's or the dev stack's way to kill a machine):
    /// `Stop` leaves it `stopped` (its address kept, as a cloud does), `Destroy` removes it as
    /// if the cloud lost it (every later call answers 404). False when there is no such VM.
    pub fn befall(&self, id: i64, event: VmEvent) -> bool {
        let mut state = lock(&self.state);
        let happened = match event {
            VmEvent::Stop => state
                .vms
                .get_mut(&id)
                .map(|(vm, ..)| vm.state = "stopped".into()),
            VmEvent::Start => state
                .vms
                .get_mut(&id)
                .map(|(vm, ..)| vm.state = "running".into()),
            VmEvent::Destroy => state.vms.remove(&id).map(drop),
        }
        .is_some();
        if happened {
            self.saved(&state);
        }
        if let (true, Some(machines)) = (happened, &self.machines) {
            match event {
                VmEvent::Stop => machines.power_off(id),
                VmEvent::Start => {
                    if let Some((vm, ..)) = state.vms.get(&id)
                        && let Some(address) = vm.private_ipv4.as_deref()
                    {
                        machines.power_on(id, &vm.name, address);
                    }
                }
                VmEvent::Destroy => machines.destroy(id),
            }
        }
        happened
    }

    /// `create_vm` calls so far (what `Faults::fail_vm_create_nth` counts).
    pub fn vm_creates(&self) -> u32 {
        lock(&self.state).vm_creates
    }

    /// The id the next created VM gets.
    pub fn next_vm_id(&self) -> i64 {
        lock(&self.state).next_vm
    }

    pub fn cidr(&self) -> String {
        format!("{}/{}", self.network, self.prefix)
    }

    /// The next host number (from .11, below the broadcast address, after the last one handed
    /// out and wrapping around) that no live VM holds: every address stays inside the CIDR.
    fn free_host(&self, state: &ComputeState) -> Option<u32> {
        let size = 1u32 << (32 - self.prefix);
        let hosts = FIRST_HOST..size - 1;
        let network = u32::from(self.network);
        let used: std::collections::BTreeSet<u32> = state
            .vms
            .values()
            .filter_map(|(vm, ..)| vm.private_ipv4.as_deref()?.parse::<Ipv4Addr>().ok())
            .map(|ip| u32::from(ip).wrapping_sub(network))
            .collect();
        let start = state.next_host.clamp(hosts.start, hosts.end);
        (start..hosts.end)
            .chain(hosts.start..start)
            .find(|host| !used.contains(host))
    }

    async fn delay(&self) {
        let latency = lock(&self.faults).latency_ms;
        if latency > 0 {
            tokio::time::sleep(Duration::from_millis(latency)).await;
        }
    }
}

#[async_trait::async_trait]
impl Compute for ComputeSim {
    async fn create_vm(&self, request: &CreateVm) -> Result<Vm, ComputeError> {
        self.delay().await;
        loop {
            let faults = self.faults();
            let made = lock(&self.state).vm_creates;
            if !faults.hold_vm_create || made < faults.hold_vm_create_after {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let faults = self.faults();
        let mut state = lock(&self.state);
        if let Some((vm, ..)) = state
            .vms
            .values()
            .find(|(vm, ..)| vm.client_token.as_deref() == Some(&request.client_token))
        {
            return Ok(vm.clone());
        }
        if !(1..=1000).contains(&request.subnet_id) {
            return Err(ComputeError::Rejected {
                status: 422,
                message: format!("subnet {} does not exist", request.subnet_id),
            });
        }
        if let Some(unknown) = request
            .security_group_ids
            .iter()
            .find(|id| !state.groups.contains_key(id))
        {
            return Err(ComputeError::Rejected {
                status: 422,
                message: format!("security group {unknown} does not exist"),
            });
        }
        state.vm_creates += 1;
        if faults.fail_vm_create_nth == Some(state.vm_creates) {
            return Err(unavailable("VM create"));
        }
        let Some(host) = self.free_host(&state) else {
            // A cloud's answer when a subnet is full (AWS: InsufficientFreeAddressesInSubnet).
            return Err(ComputeError::Rejected {
                status: 409,
                message: format!(
                    "subnet {} ({}) has no free address: InsufficientFreeAddressesInSubnet",
                    request.subnet_id,
                    self.cidr()
                ),
            });
        };
        let id = state.next_vm;
        state.next_vm += 1;
        state.next_host = host + 1;
        let ip = Ipv4Addr::from(u32::from(self.network) + host);
        let public = request
            .allocate_public_ipv4
            .then(|| Ipv4Addr::new(203, 0, 113, (host % 250) as u8).to_string());
        let vm = Vm {
            id,
            name: request.name.clone(),
            state: "running".into(),
            private_ipv4: Some(ip.to_string()),
            private_ipv6: None,
            public_ipv4: public,
            client_token: Some(request.client_token.clone()),
            tags: request.tags.clone(),
        };
        state.vms.insert(
            id,
            (
                vm.clone(),
                faults.address_after_polls,
                request.security_group_ids.clone(),
            ),
        );
        self.saved(&state);
        if let Some(machines) = &self.machines {
            machines.power_on(id, &vm.name, &ip.to_string());
        }
        Ok(self.shown(Vm {
            private_ipv4: None,
            public_ipv4: None,
            ..vm
        }))
    }

    async fn get_vm(&self, id: i64) -> Result<Option<Vm>, ComputeError> {
        self.delay().await;
        let mut state = lock(&self.state);
        let Some((vm, polls_left, _)) = state.vms.get_mut(&id) else {
            return Ok(None);
        };
        if *polls_left > 0 {
            *polls_left -= 1;
            let hidden = Vm {
                private_ipv4: None,
                public_ipv4: None,
                ..vm.clone()
            };
            drop(state);
            return Ok(Some(self.shown(hidden)));
        }
        let vm = vm.clone();
        drop(state);
        Ok(Some(self.shown(vm)))
    }

    async fn find_vm(&self, client_token: &str) -> Result<Option<Vm>, ComputeError> {
        self.delay().await;
        let found = lock(&self.state)
            .vms
            .values()
            .map(|(vm, ..)| vm)
            .find(|vm| vm.client_token.as_deref() == Some(client_token))
            .cloned();
        Ok(found.map(|vm| self.shown(vm)))
    }

    async fn vms_tagged(&self, key: &str, value: &str) -> Result<Vec<Vm>, ComputeError> {
        self.delay().await;
        let tagged: Vec<Vm> = lock(&self.state)
            .vms
            .values()
            .map(|(vm, ..)| vm)
            .filter(|vm| vm.tags.get(key).is_some_and(|v| v == value))
            .cloned()
            .collect();
        Ok(tagged.into_iter().map(|vm| self.shown(vm)).collect())
    }

    async fn delete_vm(&self, id: i64) -> Result<(), ComputeError> {
        self.delay().await;
        while lock(&self.faults).hold_vm_delete {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let mut state = lock(&self.state);
        if state.vms.remove(&id).is_some() {
            self.saved(&state);
            if let Some(machines) = &self.machines {
                machines.destroy(id);
            }
        }
        Ok(())
    }

    async fn get_subnet(&self, id: i64) -> Result<Option<Subnet>, ComputeError> {
        self.delay().await;
        if self.faults().fail_subnet_lookup {
            return Err(unavailable("subnet lookup"));
        }
        // Subnets 1–1000 exist, all on the simulator's network.
        Ok((1..=1000).contains(&id).then(|| Subnet {
            id,
            cidr: self.cidr(),
        }))
    }

    async fn get_security_group(&self, id: i64) -> Result<Option<SecurityGroup>, ComputeError> {
        self.delay().await;
        Ok(lock(&self.state).groups.get(&id).cloned())
    }

    async fn create_security_group(
        &self,
        request: &CreateSecurityGroup,
    ) -> Result<SecurityGroup, ComputeError> {
        self.delay().await;
        if self.faults().fail_group_create {
            return Err(unavailable("security group create"));
        }
        let mut state = lock(&self.state);
        if let Some(group) = state
            .groups
            .values()
            .find(|g| g.client_token.as_deref() == Some(&request.client_token))
        {
            return Ok(group.clone());
        }
        let id = state.next_group;
        state.next_group += 1;
        let group = SecurityGroup {
            id,
            name: request.name.clone(),
            rules: request.rules.clone(),
            client_token: Some(request.client_token.clone()),
        };
        state.groups.insert(id, group.clone());
        self.saved(&state);
        Ok(group)
    }

    async fn find_security_group(
        &self,
        client_token: &str,
    ) -> Result<Option<SecurityGroup>, ComputeError> {
        self.delay().await;
        Ok(lock(&self.state)
            .groups
            .values()
            .find(|g| g.client_token.as_deref() == Some(client_token))
            .cloned())
    }

    async fn delete_security_group(&self, id: i64) -> Result<(), ComputeError> {
        self.delay().await;
        let mut state = lock(&self.state);
        if state
            .vms
            .values()
            .any(|(_, _, groups)| groups.contains(&id))
        {
            return Err(ComputeError::Rejected {
                status: 409,
                message: "security group in use".into(),
            });
        }
        if state.groups.remove(&id).is_some() {
            self.saved(&state);
        }
        Ok(())
    }
}

/// Both simulators, as the dev stack and tests hold them.
#[derive(Debug, Clone)]
pub struct Simulators {
    pub compute: ComputeSim,
    pub dns: DnsSim,
}

impl Simulators {
    pub fn new(cidr: &str) -> Result<Self, String> {
        Ok(Self {
            compute: ComputeSim::new(cidr)?,
            dns: DnsSim::default(),
        })
    }

    /// Simulators whose state lives in `dir` (`sim-compute.json`, `sim-dns.json`).
    pub fn persistent(cidr: &str, dir: &std::path::Path) -> Result<Self, String> {
        Ok(Self {
            compute: ComputeSim::persistent(cidr, dir.join("sim-compute.json"))?,
            dns: DnsSim::persistent(dir.join("sim-dns.json"))?,
        })
    }

    /// Sets every fault knob, compute and DNS.
    pub fn set_faults(&self, faults: Faults) {
        self.dns.set_failing(faults.fail_dns);
        self.compute.set_faults(faults);
    }
}

#[cfg(test)]
mod tests;
