//! Day-2 polls as a fleet's agents make them ([`PollSet`]): every VM registers a node key with
//! one bootstrap fetch (not counted), then asks `GET /nodes/{vm}/generation`, each request
//! signed with that key over its own nonce and timestamp, each answer checked for 200 and the
//! node's generations.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use exk8s_common::contract::{IMDS_TOKEN_HEADER, NONCE_HEADER};
use exk8s_common::node_auth::{
    NODE_KEY_HEADER, NodeKey, SIGNATURE_HEADER, TIMESTAMP_HEADER, request_message,
};
use serde_json::Value;

use crate::fetches::{FetchError, Summary, drive, refusal, summarise, transport};
use crate::fleet::Vm;

/// A VM and the node key it registered.
struct Poller {
    vm: Vm,
    key: NodeKey,
}

/// One algorithm's polls over its clusters' VMs.
pub(crate) struct PollSet {
    pub(crate) algorithm: String,
    pub(crate) vms: Vec<Vm>,
    pub(crate) total: usize,
}

impl PollSet {
    /// Registers every VM's key, then plays the polls, at most `concurrency` in flight, each
    /// VM in turn.
    pub(crate) async fn play(
        self,
        http: &reqwest::Client,
        base: &str,
        concurrency: usize,
    ) -> Result<Summary, String> {
        let algorithm = self.algorithm;
        if self.vms.is_empty() {
            return Err(format!("no {algorithm} VM to poll from"));
        }
        let mut pollers = Vec::with_capacity(self.vms.len());
        for vm in self.vms {
            let key = NodeKey::generate().map_err(|e| format!("a node key: {e}"))?;
            register(http, base, &vm, &key)
                .await
                .map_err(|e| format!("registering VM {}'s node key: {e}", vm.id))?;
            pollers.push(Poller { vm, key });
        }
        let pollers = Arc::new(pollers);
        let (latencies, failed, elapsed) = drive(self.total, concurrency, |i| {
            let (http, base, pollers) = (http.clone(), base.to_owned(), Arc::clone(&pollers));
            async move {
                let poller = &pollers[i % pollers.len()];
                poll(&http, &base, poller, &format!("loadgen-poll-{i:016}")).await
            }
        })
        .await?;
        if let Some(e) = failed.first() {
            eprintln!("exk8s-loadgen: first failed poll for {algorithm}: {e}");
        }
        Ok(summarise(
            format!("poll {algorithm} c={concurrency}"),
            latencies,
            &failed,
            elapsed,
        ))
    }
}

/// The VM's bootstrap fetch that registers `key` as its node key.
async fn register(
    http: &reqwest::Client,
    base: &str,
    vm: &Vm,
    key: &NodeKey,
) -> Result<(), FetchError> {
    let response = http
        .get(format!("{base}/bootstrap/{}", vm.id))
        .header(IMDS_TOKEN_HEADER, &vm.imds)
        .bearer_auth(&vm.bearer)
        .header(NONCE_HEADER, format!("loadgen-register-{:016}", vm.id))
        .header(NODE_KEY_HEADER, key.public().to_text())
        .send()
        .await
        .map_err(transport)?;
    if response.status().as_u16() != 200 {
        return Err(refusal(response).await);
    }
    response.bytes().await.map_err(transport)?;
    Ok(())
}

/// One signed `GET /nodes/{vm}/generation`.
async fn poll(
    http: &reqwest::Client,
    base: &str,
    poller: &Poller,
    nonce: &str,
) -> Result<(), FetchError> {
    let path = format!("/nodes/{}/generation", poller.vm.id);
    let timestamp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()
        .and_then(|t| i64::try_from(t.as_secs()).ok())
        .ok_or_else(|| FetchError::Bad("the clock is before 1970 or past 2262".into()))?;
    let signature = poller
        .key
        .sign(&request_message("GET", &path, timestamp, nonce, b""));
    let response = http
        .get(format!("{base}{path}"))
        .header(IMDS_TOKEN_HEADER, &poller.vm.imds)
        .header(NONCE_HEADER, nonce)
        .header(TIMESTAMP_HEADER, timestamp.to_string())
        .header(SIGNATURE_HEADER, signature)
        .send()
        .await
        .map_err(transport)?;
    if response.status().as_u16() != 200 {
        return Err(refusal(response).await);
    }
    let body: Value = response.json().await.map_err(transport)?;
    if !body["desired_generation"].is_i64() || !body["up_to_date"].is_boolean() {
        return Err(FetchError::Bad(format!("not a node's generations: {body}")));
    }
    Ok(())
}
