//! Idle event streams (`--streams`): this many `GET /clusters/{id}/events` opened and left
//! unread while the polls run, the way dashboards and `exk8s events` sessions sit open on a
//! busy API. Each is checked to have opened (200, `text/event-stream`); they close when the
//! returned set is dropped.

use std::time::Duration;

/// Open streams; dropping the set closes them.
pub(crate) struct OpenStreams(
    #[allow(dead_code, reason = "held open, never read")] Vec<reqwest::Response>,
);

impl OpenStreams {
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// Opens `count` event streams on cluster `cluster_id` with `token`, 64 at a time.
pub(crate) async fn open(
    base: &str,
    token: &str,
    cluster_id: i64,
    count: usize,
) -> Result<OpenStreams, String> {
    // A client of its own: the fetches' client times out whole requests, a stream never ends.
    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(0)
        .build()
        .map_err(|e| e.to_string())?;
    let url = format!("{base}/clusters/{cluster_id}/events");
    let mut open = Vec::with_capacity(count);
    while open.len() < count {
        let batch = (count - open.len()).min(64);
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..batch {
            let request = http.get(&url).bearer_auth(token);
            set.spawn(async move { request.send().await });
        }
        while let Some(done) = set.join_next().await {
            let response = done
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("opening an event stream: {e}"))?;
            if response.status().as_u16() != 200 {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                return Err(format!(
                    "an event stream answered HTTP {status}: {} (pass --api-arg=--event-streams-per-token=0 for many)",
                    text.trim()
                ));
            }
            open.push(response);
        }
    }
    Ok(OpenStreams(open))
}
