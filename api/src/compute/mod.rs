//! The compute API (VMs, subnets, security groups): a trait with an HTTP client
//! ([`http::HttpCompute`]) and a simulator (`crate::sim::ComputeSim`).
//!
//! # REST contract assumed of the real service
//!
//! | call | request | answer |
//! |---|---|---|
//! | `POST /v1/vms` | [`CreateVm`] (JSON) | 201 [`Vm`]; the same `client_token` twice yields the same VM; 422 for an unknown subnet or security group |
//! | `GET /v1/vms/{id}` | | 200 [`Vm`] (addresses may be null until assigned), 404 |
//! | `GET /v1/vms?client_token=T` | | 200 `[Vm]` |
//! | `GET /v1/vms?tag=K=V` | | 200 `[Vm]`: every VM carrying tag `K` with value `V` (one call per cluster for the health checks, not one per VM) |
//! | `DELETE /v1/vms/{id}` | | 204, 404 (already gone) |
//! | `GET /v1/subnets/{id}` | | 200 [`Subnet`], 404 |
//! | `POST /v1/security-groups` | [`CreateSecurityGroup`] | 201 [`SecurityGroup`]; idempotent by `client_token` |
//! | `GET /v1/security-groups/{id}` | | 200 [`SecurityGroup`], 404 |
//! | `GET /v1/security-groups?client_token=T` | | 200 `[SecurityGroup]` |
//! | `DELETE /v1/security-groups/{id}` | | 204, 404 |
//!
//! Timeouts: 10 s per request. 5xx answers and transport errors are retried (three attempts,
//! 200 ms then 400 ms apart) — safe because every create carries a client token; 4xx answers
//! are final.

pub mod http;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateVm {
    pub name: String,
    pub image_id: i64,
    pub instance_type: String,
    pub zone_id: i64,
    pub subnet_id: i64,
    pub security_group_ids: Vec<i64>,
    pub allocate_public_ipv4: bool,
    pub ssh_pubkey: Option<String>,
    pub root_volume_size_gib: i64,
    /// cloud-config: where the API is, nothing secret.
    pub userdata: String,
    pub tags: BTreeMap<String, String>,
    /// Makes the create idempotent and lets a crashed caller find what it created.
    pub client_token: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Vm {
    pub id: i64,
    pub name: String,
    /// `pending`, `running`, `stopping`, `stopped`, `terminated` (what clouds say; anything
    /// else is read as not running).
    pub state: String,
    pub private_ipv4: Option<String>,
    pub private_ipv6: Option<String>,
    pub public_ipv4: Option<String>,
    #[serde(default)]
    pub client_token: Option<String>,
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subnet {
    pub id: i64,
    pub cidr: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    /// `all` or `tcp`.
    pub protocol: String,
    pub port: Option<u16>,
    pub source_cidr: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateSecurityGroup {
    pub name: String,
    pub subnet_id: i64,
    pub rules: Vec<Rule>,
    pub client_token: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecurityGroup {
    pub id: i64,
    pub name: String,
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub client_token: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum ComputeError {
    /// Timeouts, 5xx, connection failures (after retries).
    #[error("the compute API is unavailable: {0}")]
    Unavailable(String),
    /// A 4xx answer: the request itself was refused.
    #[error("the compute API refused the request ({status}): {message}")]
    Rejected { status: u16, message: String },
}

/// What founding needs of a compute service.
#[async_trait::async_trait]
pub trait Compute: Send + Sync + std::fmt::Debug {
    async fn create_vm(&self, request: &CreateVm) -> Result<Vm, ComputeError>;
    async fn get_vm(&self, id: i64) -> Result<Option<Vm>, ComputeError>;
    async fn find_vm(&self, client_token: &str) -> Result<Option<Vm>, ComputeError>;
    /// Every VM tagged `key` = `value`.
    async fn vms_tagged(&self, key: &str, value: &str) -> Result<Vec<Vm>, ComputeError>;
    /// Deleting a VM that is already gone succeeds.
    async fn delete_vm(&self, id: i64) -> Result<(), ComputeError>;
    async fn get_subnet(&self, id: i64) -> Result<Option<Subnet>, ComputeError>;
    async fn get_security_group(&self, id: i64) -> Result<Option<SecurityGroup>, ComputeError>;
    async fn create_security_group(
        &self,
        request: &CreateSecurityGroup,
    ) -> Result<SecurityGroup, ComputeError>;
    async fn find_security_group(
        &self,
        client_token: &str,
    ) -> Result<Option<SecurityGroup>, ComputeError>;
    async fn delete_security_group(&self, id: i64) -> Result<(), ComputeError>;
}
