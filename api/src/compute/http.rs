//! The compute API over HTTP (the contract is in the parent module's docs).

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{Compute, ComputeError, CreateSecurityGroup, CreateVm, SecurityGroup, Subnet, Vm};

const ATTEMPTS: u32 = 3;

/// A JSON-over-HTTP client with retries on 5xx and transport errors.
#[derive(Debug, Clone)]
pub struct RestClient {
    base: String,
    http: reqwest::Client,
}

impl RestClient {
    pub fn new(base: &str) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(5))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Self {
            base: base.trim_end_matches('/').to_owned(),
            http,
        })
    }

    /// Sends a request; `Ok(None)` for 404.
    pub async fn call<B: Serialize + ?Sized, T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<Option<T>, ComputeError> {
        let url = format!("{}{path}", self.base);
        let mut last = String::new();
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(200 << (attempt - 1))).await;
            }
            let mut request = self.http.request(method.clone(), &url);
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = match request.send().await {
                Ok(r) => r,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let status = response.status();
            if status == StatusCode::NOT_FOUND {
                return Ok(None);
            }
            if status.is_server_error() {
                last = format!("HTTP {status}");
                continue;
            }
            if status.is_client_error() {
                let message: String = response
                    .text()
                    .await
                    .unwrap_or_default()
                    .chars()
                    .take(300)
                    .collect();
                return Err(ComputeError::Rejected {
                    status: status.as_u16(),
                    message,
                });
            }
            if status == StatusCode::NO_CONTENT {
                return Ok(serde_json::from_str("null").ok());
            }
            return response.json::<T>().await.map(Some).map_err(|e| {
                ComputeError::Unavailable(format!("{method} {path}: unreadable answer: {e}"))
            });
        }
        Err(ComputeError::Unavailable(format!(
            "{method} {path}: {last}"
        )))
    }
}

/// The compute API at a base URL.
#[derive(Debug, Clone)]
pub struct HttpCompute {
    rest: RestClient,
}

impl HttpCompute {
    pub fn new(base: &str) -> Result<Self, String> {
        Ok(Self {
            rest: RestClient::new(base)?,
        })
    }
}

fn missing(what: &str) -> ComputeError {
    ComputeError::Rejected {
        status: 404,
        message: format!("{what} not found"),
    }
}

#[async_trait::async_trait]
impl Compute for HttpCompute {
    async fn create_vm(&self, request: &CreateVm) -> Result<Vm, ComputeError> {
        self.rest
            .call(Method::POST, "/v1/vms", Some(request))
            .await?
            .ok_or_else(|| missing("the VM endpoint"))
    }

    async fn get_vm(&self, id: i64) -> Result<Option<Vm>, ComputeError> {
        self.rest
            .call::<(), Vm>(Method::GET, &format!("/v1/vms/{id}"), None)
            .await
    }

    async fn find_vm(&self, client_token: &str) -> Result<Option<Vm>, ComputeError> {
        let found: Option<Vec<Vm>> = self
            .rest
            .call::<(), _>(
                Method::GET,
                &format!("/v1/vms?client_token={client_token}"),
                None,
            )
            .await?;
        Ok(found.and_then(|vms| vms.into_iter().next()))
    }

    async fn vms_tagged(&self, key: &str, value: &str) -> Result<Vec<Vm>, ComputeError> {
        let tag = format!("{key}={value}");
        let query: String = form_urlencoded::Serializer::new(String::new())
            .append_pair("tag", &tag)
            .finish();
        let found: Option<Vec<Vm>> = self
            .rest
            .call::<(), _>(Method::GET, &format!("/v1/vms?{query}"), None)
            .await?;
        Ok(found.unwrap_or_default())
    }

    async fn delete_vm(&self, id: i64) -> Result<(), ComputeError> {
        self.rest
            .call::<(), serde_json::Value>(Method::DELETE, &format!("/v1/vms/{id}"), None)
            .await?;
        Ok(())
    }

    async fn get_subnet(&self, id: i64) -> Result<Option<Subnet>, ComputeError> {
        self.rest
            .call::<(), Subnet>(Method::GET, &format!("/v1/subnets/{id}"), None)
            .await
    }

    async fn get_security_group(&self, id: i64) -> Result<Option<SecurityGroup>, ComputeError> {
        self.rest
            .call::<(), SecurityGroup>(Method::GET, &format!("/v1/security-groups/{id}"), None)
            .await
    }

    async fn create_security_group(
        &self,
        request: &CreateSecurityGroup,
    ) -> Result<SecurityGroup, ComputeError> {
        self.rest
            .call(Method::POST, "/v1/security-groups", Some(request))
            .await?
            .ok_or_else(|| missing("the security-group endpoint"))
    }

    async fn find_security_group(
        &self,
        client_token: &str,
    ) -> Result<Option<SecurityGroup>, ComputeError> {
        let found: Option<Vec<SecurityGroup>> = self
            .rest
            .call::<(), _>(
                Method::GET,
                &format!("/v1/security-groups?client_token={client_token}"),
                None,
            )
            .await?;
        Ok(found.and_then(|groups| groups.into_iter().next()))
    }

    async fn delete_security_group(&self, id: i64) -> Result<(), ComputeError> {
        self.rest
            .call::<(), serde_json::Value>(
                Method::DELETE,
                &format!("/v1/security-groups/{id}"),
                None,
            )
            .await?;
        Ok(())
    }
}
