//! The DNS simulator: a zone's A records in memory (or in `sim-dns.json`, to outlive the API
//! process), and a knob that makes every call fail.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{lock, store, unavailable};
use crate::compute::ComputeError;
use crate::dns::Dns;

/// The DNS simulator.
#[derive(Debug, Clone, Default)]
pub struct DnsSim {
    records: Arc<Mutex<BTreeMap<String, Vec<String>>>>,
    fail: Arc<Mutex<bool>>,
    store: store::Store,
}

impl DnsSim {
    /// A DNS simulator whose records live in `path`.
    pub fn persistent(path: std::path::PathBuf) -> Result<Self, String> {
        let sim = Self {
            store: store::Store::at(path),
            ..Self::default()
        };
        if let Some(saved) = sim.store.load()? {
            *lock(&sim.records) = saved;
        }
        Ok(sim)
    }

    pub fn set_failing(&self, failing: bool) {
        *lock(&self.fail) = failing;
    }

    pub fn records(&self) -> BTreeMap<String, Vec<String>> {
        lock(&self.records).clone()
    }
}

#[async_trait::async_trait]
impl Dns for DnsSim {
    async fn upsert_a(&self, name: &str, values: &[String]) -> Result<(), ComputeError> {
        if *lock(&self.fail) {
            return Err(unavailable("DNS upsert"));
        }
        let mut records = lock(&self.records);
        records.insert(name.to_owned(), values.to_vec());
        self.store.save(&*records);
        Ok(())
    }

    async fn delete_a(&self, name: &str) -> Result<(), ComputeError> {
        if *lock(&self.fail) {
            return Err(unavailable("DNS delete"));
        }
        let mut records = lock(&self.records);
        if records.remove(name).is_some() {
            self.store.save(&*records);
        }
        Ok(())
    }
}
