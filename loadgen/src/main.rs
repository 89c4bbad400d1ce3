//! `exk8s-loadgen`: measures exk8s the way a fleet stresses it. It starts an `exk8s-api serve`
//! with the compute, DNS and IMDS SIMULATORS (zero added latency) on SQLite or PostgreSQL,
//! founds clusters for each requested key algorithm IN THE SAME RUN (timing each `POST
//! /clusters`), obtains every VM's IMDS and bootstrap tokens through the simulated IMDS, then
//! plays bundle fetches with a fixed concurrency — each with its own nonce, each envelope
//! verified against `/bootstrap/keys` and checked for its VM and nonce — and prints
//! throughput, p50/p90/p99 latency and error counts, as text and (with `--json`) JSON. With
//! `--polls`, each VM's agent then asks for its generation with signed day-2 requests
//! ([`polls`]), measured the same way.
//!
//! Faults on demand: `--sim-latency-ms` slows every simulated compute call, `--db-latency-ms`
//! routes the API's PostgreSQL connections through a latency-injecting proxy ([`proxy`]).
//! Every failed fetch is classified: a *clean* refusal (429, or 5xx in the API's error format,
//! with `Retry-After` on 429/503), a *hung* request (passed `--timeout-secs`), or a *bad* one
//! (any other answer, a bundle that does not verify, or one for another VM or request).

#![allow(clippy::print_stdout, reason = "the report is the program's output")]

mod api;
mod cpu;
mod fetches;
mod fleet;
mod fleet_size;
mod floor;
mod idle;
mod polls;
mod proxy;
mod streams;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use serde_json::{Value, json};

use fetches::{CpuPerBundle, FetchError, FetchSet, Summary, await_key_pool, summarise};
use fleet::{credentials, node_vms};

#[derive(Debug, Parser)]
#[command(name = "exk8s-loadgen", version)]
struct Args {
    /// The exk8s-api binary to start.
    #[arg(long, default_value = "target/release/exk8s-api")]
    api_bin: PathBuf,
    /// Database URL for the API (default: a fresh SQLite file in a temp dir).
    #[arg(long)]
    database_url: Option<String>,
    /// `algorithm=clusters` pairs founded in the same run.
    #[arg(long, value_delimiter = ',', default_value = "ecdsa-p256=4,rsa-2048=1")]
    clusters: Vec<String>,
    /// Control-plane nodes per cluster (1 or 3).
    #[arg(long, default_value_t = 3)]
    nodes: u32,
    /// Workers per cluster, in one node pool added after founding: a boot storm of
    /// `nodes + workers` VMs, each fetching once, is `--fetches <alg>=<nodes + workers>`.
    #[arg(long, default_value_t = 0)]
    workers: u32,
    /// Before an algorithm's fetches, wait until the API's key pool holds every key its
    /// clusters want (as VMs booting after founding would find it), and report how long.
    #[arg(long)]
    await_key_pool: bool,
    /// Play every algorithm's fetches at the same time, each with its own `--concurrency`,
    /// once every cluster is founded (an RSA boot storm beside ECDSA traffic).
    #[arg(long)]
    together: bool,
    /// After each algorithm's fetches, report how soon the API's CPU fell idle (at most 5 % of
    /// a core over 200 ms) — with a short --timeout-secs, an abandoned storm.
    #[arg(long)]
    idle_check: bool,
    /// Idle clusters (ecdsa-p256, `--nodes` each) founded first, never fetched from: the
    /// measured clusters then live in a fleet of this size.
    #[arg(long, default_value_t = 0)]
    fleet: usize,
    /// Seconds to wait after founding the idle fleet, before the measured clusters: the
    /// database's autovacuum and statistics catch up with 10,000 new clusters, as they have
    /// in a fleet that grew over months.
    #[arg(long, default_value_t = 0)]
    settle_secs: u64,
    /// After founding the idle fleet, run `ANALYZE` on the PostgreSQL database (with psql):
    /// what autovacuum does by itself in a fleet that grew over months, for a server that runs
    /// without it (this machine's test PostgreSQL does).
    #[arg(long)]
    analyze: bool,
    /// After the fetches, give every node that has no recorded certificate the latest bundle's
    /// certificate rows of the last node fetched from (with psql, then `ANALYZE`): a fleet
    /// whose nodes all booted, 14 certificates each, for `--list-walks` to page through.
    #[arg(long)]
    boot_fleet: bool,
    /// After the fetches, walk `GET /clusters` page by page once cold (reported apart), then
    /// this many times, timing each page.
    #[arg(long, default_value_t = 0)]
    list_walks: usize,
    /// `algorithm=fetches` pairs: bundle fetches per algorithm.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ecdsa-p256=2000,rsa-2048=16"
    )]
    fetches: Vec<String>,
    /// After each algorithm's fetches, this many signed day-2 polls (`GET
    /// /nodes/{vm}/generation`) over its VMs, each VM's node key registered first: the request
    /// a booted fleet's agents repeat for years. An algorithm without a `--fetches` pair is
    /// neither fetched from nor polled.
    #[arg(long, default_value_t = 0)]
    polls: usize,
    /// Event streams (`GET /clusters/{id}/events`) held open and unread on the algorithm's
    /// first cluster while its polls run (the API needs `--event-streams-per-token=0`, or a
    /// bound above this, through `--api-arg`).
    #[arg(long, default_value_t = 0)]
    streams: usize,
    /// Fetches (and polls) in flight at once.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Also write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Latency the compute simulator adds to every call, in milliseconds.
    #[arg(long, default_value_t = 0)]
    sim_latency_ms: u64,
    /// Latency added to every chunk between the API and PostgreSQL, each way, in milliseconds
    /// (a proxy this program runs; needs a postgres:// --database-url).
    #[arg(long, default_value_t = 0)]
    db_latency_ms: u64,
    /// Client timeout of one fetch; a fetch that passes it counts as hung.
    #[arg(long, default_value_t = 30)]
    timeout_secs: u64,
    /// An extra argument for `exk8s-api serve` (repeatable), e.g.
    /// `--api-arg=--bootstrap-deadline-ms=300`.
    #[arg(long = "api-arg", allow_hyphen_values = true)]
    api_args: Vec<String>,
    /// Succeed when fetches fail only cleanly (429/5xx); hung or bad fetches still fail the run.
    #[arg(long)]
    allow_clean_errors: bool,
    /// The bundle route the fetches use, before `/{vm_id}`: `/bootstrap`, or the alias
    /// `/bootstrap/control-plane` that builds before the role-neutral route also serve (the
    /// same handler: `bench.sh floor` uses it to measure an older commit beside this one).
    #[arg(long, default_value = "/bootstrap")]
    bundle_route: String,
    /// Succeed when fetches pass --timeout-secs (an abandoned storm: the client leaves).
    #[arg(long)]
    allow_hung: bool,
    /// Before the API starts, measure each fetched algorithm's issuance floor (the
    /// cryptography one bundle needs, on this machine, with the issuer's crates); each fetch
    /// set then reports the API's CPU per bundle against it (issue 48's ratio).
    #[arg(long)]
    floor: bool,
    /// Start no API: run the issuance floor's calls for this many bundles of
    /// `--floor-payload-bytes` (each `--fetches` algorithm in turn) and exit — a fixed amount
    /// of work for callgrind to count (`scripts/bench.sh instructions`).
    #[arg(long, requires = "floor_payload_bytes")]
    floor_rounds: Option<u32>,
    /// The payload size `--floor-rounds` digests and signs (a fetched bundle's).
    #[arg(long)]
    floor_payload_bytes: Option<usize>,
    /// Stop the API with SIGTERM and wait this long for it to end before killing it (a
    /// profiler it runs under writes its counts as it ends); 0 kills it at once.
    #[arg(long, default_value_t = 0)]
    graceful_stop_secs: u64,
}

fn pairs(list: &[String]) -> Result<Vec<(String, usize)>, String> {
    list.iter()
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("`{p}` is not algorithm=number"))?;
            Ok((
                k.to_owned(),
                v.parse().map_err(|_| format!("`{p}`: not a number"))?,
            ))
        })
        .collect()
}

/// The CPU a fetch set's bundles cost, from the API's and PostgreSQL's ticks before and after
/// it, against the algorithm's `floor` when measured.
fn per_bundle(
    summary: &Summary,
    ((api_before, pg_before), (api_after, pg_after)): ((u64, Option<u64>), (u64, Option<u64>)),
    payload_bytes: u64,
    floor: Option<&floor::Floor>,
) -> CpuPerBundle {
    let bundles = (summary.count - summary.errors).max(1) as f64;
    let ms = |ticks: u64| ticks as f64 * cpu::TICK_MS / bundles;
    let api_ms = ms(api_after.saturating_sub(api_before));
    let floor_ms = floor.map(|f| f.per_bundle_ms(payload_bytes as f64));
    CpuPerBundle {
        api_ms,
        postgres_ms: pg_before
            .zip(pg_after)
            .map(|(before, after)| ms(after.saturating_sub(before))),
        payload_bytes,
        floor_ms,
        ratio: floor_ms.map(|f| api_ms / f),
    }
}

/// `ANALYZE` on the PostgreSQL database at `url`, through psql.
fn analyze(url: &str) -> Result<(), String> {
    fleet_size::psql(url, "--analyze", "ANALYZE")?;
    eprintln!("exk8s-loadgen: database analyzed");
    Ok(())
}

async fn run(args: Args) -> Result<Vec<Summary>, String> {
    if args.polls > 0 && args.together {
        return Err(
            "--polls follows each algorithm's own fetches; it cannot run with --together".into(),
        );
    }
    let clusters = pairs(&args.clusters)?;
    let fetches = pairs(&args.fetches)?;
    let mut floors = std::collections::HashMap::new();
    if args.floor {
        for (algorithm, _) in &fetches {
            let floor = floor::measure(algorithm)?;
            eprintln!(
                "exk8s-loadgen: {algorithm}: the floor is {:.3} ms of minting per bundle and \
                 {:.4} ms per KiB of payload (digests and signature)",
                floor.minting_ms, floor.per_kib_ms
            );
            floors.insert(algorithm.clone(), floor);
        }
    }
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(args.timeout_secs.max(1)))
        .build()
        .map_err(|e| e.to_string())?;
    let api::Served {
        api,
        base,
        token,
        db_url,
        keys,
        _dir,
    } = api::serve(&args, &http).await?;

    let mut summaries = Vec::new();
    if args.fleet > 0 {
        let started = Instant::now();
        let failed =
            fleet_size::found_idle(&http, &base, &token, args.fleet, args.nodes, 8).await?;
        if failed > 0 {
            return Err(format!(
                "{failed} of {} idle clusters were not founded",
                args.fleet
            ));
        }
        eprintln!(
            "exk8s-loadgen: {} idle clusters founded in {:.0} s",
            args.fleet,
            started.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(args.settle_secs)).await;
    }
    if args.analyze {
        analyze(&db_url)?;
    }
    let mut together = Vec::new();
    for (algorithm, count) in &clusters {
        let mut latencies = Vec::new();
        let mut failed = Vec::new();
        let mut vms = Vec::new();
        let mut first_cluster = None;
        let started = Instant::now();
        for _ in 0..*count {
            let body = json!({"control_plane_count": args.nodes, "control_plane_image_id": 1, "control_plane_instance_type": "bench", "subnet_id": 1, "key_algorithm": algorithm});
            let t = Instant::now();
            let response = http
                .post(format!("{base}/clusters"))
                .header("Prefer", "wait=300")
                .bearer_auth(&token)
                .json(&body)
                .timeout(Duration::from_secs(300))
                .send()
                .await
                .map_err(|e| e.to_string())?;
            if response.status().as_u16() != 201 {
                let status = response.status();
                let text = response.text().await.unwrap_or_default();
                let error = format!("founding answered HTTP {status}: {}", text.trim());
                if failed.is_empty() {
                    eprintln!("exk8s-loadgen: first failed founding for {algorithm}: {error}");
                }
                failed.push(FetchError::Bad(error));
                continue;
            }
            latencies.push(t.elapsed());
            let created: Value = response.json().await.map_err(|e| e.to_string())?;
            let cluster_id = created["cluster_id"].as_i64().ok_or("no cluster id")?;
            first_cluster.get_or_insert(cluster_id);
            for vm in node_vms(&http, &base, &token, cluster_id, args.nodes, args.workers).await? {
                vms.push(credentials(&http, &base, vm).await?);
            }
        }
        summaries.push(summarise(
            format!("found {}-node {algorithm}", args.nodes),
            latencies,
            &failed,
            started.elapsed(),
        ));

        let Some((_, total)) = fetches.iter().find(|(a, _)| a == algorithm) else {
            continue;
        };
        let polled = (args.polls > 0).then(|| polls::PollSet {
            algorithm: algorithm.clone(),
            vms: vms.clone(),
            total: args.polls,
        });
        let set = FetchSet {
            algorithm: algorithm.clone(),
            vms,
            total: *total,
            payload_bytes: Arc::default(),
            route: args.bundle_route.clone(),
        };
        if args.together {
            together.push(set);
            continue;
        }
        if args.await_key_pool {
            await_key_pool(&http, &base, algorithm).await?;
        }
        let payload_bytes = Arc::clone(&set.payload_bytes);
        // PostgreSQL's share only when it is the API's database.
        let server = || {
            db_url
                .starts_with("postgres")
                .then(cpu::postgres_ticks)
                .flatten()
        };
        let before = (cpu::ticks(api.child.id())?, server());
        let mut summary = set.play(&http, &base, &keys, args.concurrency).await?;
        let after = (cpu::ticks(api.child.id())?, server());
        summary.cpu = Some(per_bundle(
            &summary,
            (before, after),
            payload_bytes.load(std::sync::atomic::Ordering::Relaxed),
            floors.get(algorithm),
        ));
        if args.idle_check {
            let idle = idle::idle_after(api.child.id(), Instant::now()).await?;
            match idle {
                Some(s) => eprintln!(
                    "exk8s-loadgen: {algorithm}: the API's CPU was idle {s:.2} s after the last fetch ended"
                ),
                None => eprintln!(
                    "exk8s-loadgen: {algorithm}: the API's CPU was still busy 15 s after the last fetch ended"
                ),
            }
            summary.idle_after_s = Some(idle.unwrap_or(f64::INFINITY));
        }
        summaries.push(summary);
        if let Some(polled) = polled {
            let streams = match (args.streams, first_cluster) {
                (0, _) | (_, None) => None,
                (count, Some(cluster_id)) => {
                    let open = streams::open(&base, &token, cluster_id, count).await?;
                    eprintln!(
                        "exk8s-loadgen: {algorithm}: {} event streams open while the polls run",
                        open.len()
                    );
                    // The streams' first reads (status) settle before the polls are timed.
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    Some(open)
                }
            };
            let mut summary = polled.play(&http, &base, args.concurrency).await?;
            if let Some(open) = streams {
                summary.what = format!("{} with {} open event streams", summary.what, open.len());
            }
            summaries.push(summary);
        }
    }
    if !together.is_empty() {
        if args.await_key_pool {
            await_key_pool(&http, &base, "every algorithm").await?;
        }
        let mut sets = tokio::task::JoinSet::new();
        for (i, set) in together.into_iter().enumerate() {
            let (http, base, keys) = (http.clone(), base.clone(), Arc::clone(&keys));
            let concurrency = args.concurrency;
            sets.spawn(async move { (i, set.play(&http, &base, &keys, concurrency).await) });
        }
        let mut played = Vec::new();
        while let Some(done) = sets.join_next().await {
            let (i, summary) = done.map_err(|e| e.to_string())?;
            played.push((i, summary?));
        }
        played.sort_by_key(|(i, _)| *i);
        summaries.extend(played.into_iter().map(|(_, s)| s));
    }
    if args.boot_fleet {
        fleet_size::boot(&db_url)?;
    }
    if args.list_walks > 0 {
        let walked = fleet_size::list_pages(&http, &base, &token, args.list_walks).await?;
        let parsing_took = walked.parsing.iter().sum();
        summaries.push(summarise(
            format!("GET /clusters first walk, cold ({})", walked.clusters),
            walked.cold,
            &[],
            walked.cold_took,
        ));
        summaries.push(summarise(
            format!("GET /clusters pages ({})", walked.clusters),
            walked.pages,
            &[],
            walked.took,
        ));
        summaries.push(summarise(
            "  client's JSON parse".into(),
            walked.parsing,
            &[],
            parsing_took,
        ));
    }
    Ok(summaries)
}

/// `--floor-rounds`: the floor's calls for each fetched algorithm, untimed.
fn floor_rounds(args: &Args, rounds: u32) -> std::process::ExitCode {
    let payload_bytes = args.floor_payload_bytes.unwrap_or_default();
    let repeated = pairs(&args.fetches).and_then(|fetches| {
        fetches.iter().try_for_each(|(algorithm, _)| {
            floor::repeat(algorithm, rounds, payload_bytes)?;
            println!(
                "{algorithm}: the floor's calls for {rounds} bundles of {payload_bytes} bytes"
            );
            Ok(())
        })
    });
    match repeated {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("exk8s-loadgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    if let Some(rounds) = args.floor_rounds {
        return floor_rounds(&args, rounds);
    }
    let json_out = args.json.clone();
    let (allow_clean_errors, allow_hung) = (args.allow_clean_errors, args.allow_hung);
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("exk8s-loadgen: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(summaries) => {
            println!(
                "{:<28} {:>7} {:>6} {:>6} {:>5} {:>5} {:>9} {:>10} {:>9} {:>9} {:>9}",
                "what",
                "count",
                "errors",
                "clean",
                "hung",
                "bad",
                "seconds",
                "per sec",
                "p50 ms",
                "p90 ms",
                "p99 ms"
            );
            for s in &summaries {
                println!(
                    "{:<28} {:>7} {:>6} {:>6} {:>5} {:>5} {:>9.2} {:>10.1} {:>9.2} {:>9.2} {:>9.2}",
                    s.what,
                    s.count,
                    s.errors,
                    s.clean_errors,
                    s.hung,
                    s.bad,
                    s.seconds,
                    s.per_second,
                    s.p50_ms,
                    s.p90_ms,
                    s.p99_ms
                );
            }
            for s in &summaries {
                if let Some(cpu) = &s.cpu {
                    let postgres = cpu
                        .postgres_ms
                        .map_or_else(String::new, |ms| format!(", PostgreSQL {ms:.2} ms"));
                    let floor = match (cpu.floor_ms, cpu.ratio) {
                        (Some(floor), Some(ratio)) => {
                            format!("; floor {floor:.2} ms, API ÷ floor {ratio:.2}")
                        }
                        _ => String::new(),
                    };
                    println!(
                        "{}: CPU per bundle: API {:.2} ms{postgres} (payload {} bytes){floor}",
                        s.what, cpu.api_ms, cpu.payload_bytes
                    );
                }
            }
            if let Some(path) = json_out {
                if let Err(e) = std::fs::write(
                    &path,
                    serde_json::to_string_pretty(&summaries).unwrap_or_default(),
                ) {
                    eprintln!("exk8s-loadgen: writing {}: {e}", path.display());
                    return std::process::ExitCode::FAILURE;
                }
            }
            let failed = |s: &Summary| {
                s.bad > 0
                    || (s.clean_errors > 0 && !allow_clean_errors)
                    || (s.hung > 0 && !allow_hung)
            };
            if summaries.iter().any(failed) {
                return std::process::ExitCode::from(1);
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("exk8s-loadgen: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
