//! The DNS API: A records for a cluster's shared control-plane name. Best effort by design: a
//! DNS failure never undoes a founded cluster (it reports `dns_configured = false`).
//!
//! # REST contract assumed
//!
//! | call | request | answer |
//! |---|---|---|
//! | `PUT /v1/records/{name}/A` | `{"values": ["10.0.0.11", …], "ttl": 60}` | 200 |
//! | `DELETE /v1/records/{name}/A` | | 204, 404 |

use reqwest::Method;
use serde::{Deserialize, Serialize};

use crate::compute::ComputeError;
use crate::compute::http::RestClient;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ARecord {
    pub values: Vec<String>,
    pub ttl: u32,
}

#[async_trait::async_trait]
pub trait Dns: Send + Sync + std::fmt::Debug {
    async fn upsert_a(&self, name: &str, values: &[String]) -> Result<(), ComputeError>;
    /// Deleting a record that does not exist succeeds.
    async fn delete_a(&self, name: &str) -> Result<(), ComputeError>;
}

#[derive(Debug, Clone)]
pub struct HttpDns {
    rest: RestClient,
}

impl HttpDns {
    pub fn new(base: &str) -> Result<Self, String> {
        Ok(Self {
            rest: RestClient::new(base)?,
        })
    }
}

#[async_trait::async_trait]
impl Dns for HttpDns {
    async fn upsert_a(&self, name: &str, values: &[String]) -> Result<(), ComputeError> {
        let record = ARecord {
            values: values.to_vec(),
            ttl: 60,
        };
        self.rest
            .call::<_, serde_json::Value>(
                Method::PUT,
                &format!("/v1/records/{name}/A"),
                Some(&record),
            )
            .await?
            .map(|_| ())
            .ok_or_else(|| ComputeError::Rejected {
                status: 404,
                message: "DNS zone not found".into(),
            })
    }

    async fn delete_a(&self, name: &str) -> Result<(), ComputeError> {
        self.rest
            .call::<(), serde_json::Value>(Method::DELETE, &format!("/v1/records/{name}/A"), None)
            .await?;
        Ok(())
    }
}
