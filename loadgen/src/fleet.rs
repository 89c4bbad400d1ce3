//! The fleet a run measures: each founded cluster's VMs (its control plane and any workers
//! added in a pool), their credentials from the simulated IMDS, and the API's key pool filled
//! before a storm, as it is when real VMs boot.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[derive(Clone)]
pub(crate) struct Vm {
    pub(crate) id: i64,
    pub(crate) imds: String,
    pub(crate) bearer: String,
}

/// `GET url` (with `imds`, the simulated IMDS session header), its body as text.
pub(crate) async fn get_text(
    http: &reqwest::Client,
    url: &str,
    imds: Option<&str>,
) -> Result<String, String> {
    let mut request = http.get(url);
    if let Some(token) = imds {
        request = request.header("X-exc-imds-token", token);
    }
    request
        .send()
        .await
        .map_err(|e| e.to_string())?
        .text()
        .await
        .map_err(|e| e.to_string())
}

pub(crate) async fn credentials(http: &reqwest::Client, base: &str, vm: i64) -> Result<Vm, String> {
    let imds = format!("{base}/sim/imds/{vm}");
    let token = get_text(http, &format!("{imds}/token"), None).await?;
    let access = get_text(
        http,
        &format!("{imds}/latest/identity/access-token"),
        Some(&token),
    )
    .await?;
    let access: Value = serde_json::from_str(&access).map_err(|e| e.to_string())?;
    let bearer = access["access_token"]
        .as_str()
        .ok_or("no access token")?
        .to_owned();
    Ok(Vm {
        id: vm,
        imds: token,
        bearer,
    })
}

/// Every VM of a founded cluster: its control plane, and `workers` more added in one pool
/// (waited for until the pool has made them all).
pub(crate) async fn node_vms(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    cluster_id: i64,
    nodes: u32,
    workers: u32,
) -> Result<Vec<i64>, String> {
    let url = format!("{base}/clusters/{cluster_id}");
    if workers > 0 {
        let pool = json!({"name": "storm", "count": workers, "instance_type": "bench", "image_id": 1, "subnet_id": 1});
        let response = http
            .post(format!("{url}/node-pools"))
            .bearer_auth(token)
            .json(&pool)
            .send()
            .await
            .map_err(|e| e.to_string())?;
        if response.status().as_u16() != 202 {
            return Err(format!(
                "adding workers answered HTTP {}",
                response.status()
            ));
        }
    }
    let want = usize::try_from(nodes + workers).map_err(|e| e.to_string())?;
    let start = Instant::now();
    loop {
        let view: Value = http
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| e.to_string())?
            .json()
            .await
            .map_err(|e| e.to_string())?;
        let vms: Vec<i64> = view["nodes"]
            .as_array()
            .ok_or("a cluster without nodes")?
            .iter()
            .filter_map(|n| n["vm_id"].as_i64())
            .collect();
        if vms.len() >= want {
            return Ok(vms);
        }
        if start.elapsed() > Duration::from_secs(300) {
            return Err(format!(
                "cluster {cluster_id} has {} of {want} nodes after 300 s",
                vms.len()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until the API's key pool holds every key wanted; returns the seconds waited.
pub(crate) async fn key_pool_filled(http: &reqwest::Client, base: &str) -> Result<f64, String> {
    let start = Instant::now();
    let mut full_since = None;
    loop {
        let text = get_text(http, &format!("{base}/metrics"), None).await?;
        let value = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse::<u64>().ok())
        };
        match (
            value("exk8s_key_pool_ready_keys"),
            value("exk8s_key_pool_wanted_keys"),
        ) {
            // Full twice in a row: a worker recorded just now may not have added its demand.
            (Some(ready), Some(wanted)) if ready >= wanted => {
                if full_since.is_some_and(|t: Instant| t.elapsed() >= Duration::from_millis(500)) {
                    return Ok(start.elapsed().as_secs_f64());
                }
                full_since = full_since.or(Some(Instant::now()));
            }
            (Some(_), Some(_)) => full_since = None,
            _ => return Err("the API's /metrics has no key pool figures".into()),
        }
        if start.elapsed() > Duration::from_secs(600) {
            return Err("the key pool did not fill within 600 s".into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
