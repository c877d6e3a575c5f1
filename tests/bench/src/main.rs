//! `baton-bench`: parses the flags into a `Plan`, runs the steps of `baton_bench`, prints the
//! table and writes the JSON. Exit status: 0 the run completed; 1 the run failed (the error
//! chain is printed); 2 usage.
//!
//! Its length is the figures' names: every figure the table prints is named, described and
//! set against its ceiling here, in the order of the run, so that one file reads as the table
//! does. The work of each step lives in the library (`ceiling`, `e2e`, `backlog`, …); a step
//! that grows figures of its own would move its `record_*` function beside it.

use anyhow::Context;
use baton_bench::cluster::{self, NodeSettings};
use baton_bench::figures::Figures;
use baton_bench::{backlog, ceiling, e2e, fairness, pg_ceiling, procfs, stats};
use baton_testkit::{Binaries, Harness};
use clap::Parser;
use serde_json::json;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Measure Baton end to end (real hub, real nodes, mTLS on loopback) against the SQLite
/// ceiling of the same disk, and print the figures.
#[derive(Debug, Parser)]
#[command(name = "baton-bench", version, after_help = "Exit status: 0 completed; 1 the run failed; 2 usage.")]
struct Cli {
    /// Hosts, each served by its own baton-node process.
    #[arg(long = "hosts", value_name = "K", default_value_t = 4)]
    hosts: usize,
    /// Concurrent producers (tasks with their own mTLS client).
    #[arg(long = "producers", value_name = "C", default_value_t = 16)]
    producers: usize,
    /// Messages in the main (no-op harness) pass [default: 40000, or 2000 with --quick].
    #[arg(long = "messages", value_name = "N")]
    messages: Option<usize>,
    /// Messages in the /bin/true pass [default: a tenth of --messages].
    #[arg(long, value_name = "N")]
    true_messages: Option<usize>,
    /// Seconds of the half-load pass [default: 10, or 2 with --quick].
    #[arg(long, value_name = "S")]
    half_load_seconds: Option<f64>,
    /// Offer the half-load pass this many messages per second instead of half the
    /// single-submit pass's rate (to see the latency of a lightly loaded hub).
    #[arg(long, value_name = "R")]
    half_load_rate: Option<f64>,
    /// Seconds of each storage-ceiling measurement [default: 3, or 1 with --quick].
    #[arg(long, value_name = "S")]
    ceiling_seconds: Option<f64>,
    /// `parallel_conversations` of each node.
    #[arg(long, value_name = "N", default_value_t = 64)]
    node_parallel: u32,
    /// `claim_batch_max` of each node.
    #[arg(long, value_name = "N", default_value_t = 64)]
    node_batch: u32,
    /// Each node's `handoff`: `combined` (`mirrored` and `ack` in one request, the default) or
    /// `separate` (two requests, as before), to compare the two in one build.
    #[arg(long, value_name = "WORD", default_value = "combined", value_parser = ["combined", "separate"])]
    node_handoff: String,
    /// Each node's `handoffs_in_flight` (claim batches handed off while the next claim waits)
    /// [default: the node's own default]
    #[arg(long, value_name = "N")]
    node_handoffs_in_flight: Option<u32>,
    /// Messages per producer request in the batched passes (`POST /v1/batch/messages`); the
    /// single-submit pass sends one per request whatever this says.
    #[arg(long, value_name = "N", default_value_t = 64)]
    submit_batch: usize,
    /// Timed claims at each backlog size [default: 200, or 50 with --quick].
    #[arg(long, value_name = "N")]
    backlog_claims: Option<usize>,
    /// A reduced run (small N, backlogs of 1k and 10k, short ceilings) for CI.
    #[arg(long)]
    quick: bool,
    /// Also write the figures as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Where the run's temporary directory is made (the disk under test) [default: system temp].
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// Keep the end-to-end hub's record in the PostgreSQL database at URL (empty; its schema is
    /// created) instead of an SQLite file. Steps 2b and 3 read and fill an SQLite file
    /// directly and are skipped; the SQLite ceiling of step 1 is still measured, as the ratio's
    /// baseline on the same machine.
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,
    /// Hubs serving the end-to-end passes, all on the one PostgreSQL record of
    /// --database-url (more than one needs it): node I prefers hub I mod N and falls back to
    /// the others, producer task J submits through hub J mod N.
    #[arg(long, value_name = "N", default_value_t = 1)]
    hubs: usize,
    /// Skip step 3 (the backlog claims).
    #[arg(long)]
    skip_backlog: bool,
    /// Skip step 2 (the end-to-end passes); with --skip-backlog only the ceiling runs, which
    /// is how the store cycle is profiled (valgrind --tool=callgrind baton-bench --skip-e2e …).
    #[arg(long)]
    skip_e2e: bool,
    /// Skip step 2b (fairness), e.g. when profiling the end-to-end passes alone
    /// (`tests/bench/profile.py`).
    #[arg(long)]
    skip_fairness: bool,
    /// Keep the temporary directory (databases, logs, configs) and print where it is; a failed
    /// run always keeps it.
    #[arg(long)]
    keep: bool,
    /// The baton-hub binary [default: next to this executable].
    #[arg(long, env = "BATON_HUB_BIN", value_name = "PATH")]
    hub_bin: Option<PathBuf>,
    /// The baton-node binary [default: next to this executable].
    #[arg(long, env = "BATON_NODE_BIN", value_name = "PATH")]
    node_bin: Option<PathBuf>,
}

/// The most hubs `--hubs` starts (each is a process with its own connections to the database).
const HUBS_MAX: usize = 8;

/// The highest rate `--half-load-rate` offers, messages per second.
const HALF_LOAD_RATE_MAX: f64 = 100_000.0;

/// A validated run plan: every count and duration resolved.
#[derive(Debug, Clone)]
struct Plan {
    hosts: Vec<String>,
    producers: usize,
    messages: usize,
    true_messages: usize,
    half_load: Duration,
    half_load_rate: Option<f64>,
    ceiling: Duration,
    node_parallel: u32,
    node_batch: u32,
    node_handoff: String,
    node_handoffs_in_flight: Option<u32>,
    submit_batch: usize,
    backlog_sizes: Vec<usize>,
    backlog_claims: usize,
    skip_e2e: bool,
    skip_fairness: bool,
    quick: bool,
    database_url: Option<String>,
    hubs: usize,
}

impl Plan {
    fn from_cli(cli: &Cli) -> anyhow::Result<Plan> {
        let q = cli.quick;
        anyhow::ensure!((1..=64).contains(&cli.hosts), "--hosts {} is out of range; allowed 1..=64", cli.hosts);
        anyhow::ensure!(
            (1..=1024).contains(&cli.producers),
            "--producers {} is out of range; allowed 1..=1024",
            cli.producers
        );
        let messages = cli.messages.unwrap_or(if q { 2_000 } else { 40_000 });
        let batch_max = baton_shared::limits::BATCH_ITEMS_MAX;
        anyhow::ensure!(
            (1..=batch_max).contains(&cli.submit_batch),
            "--submit-batch {} is out of range; allowed 1..={batch_max}",
            cli.submit_batch
        );
        anyhow::ensure!(messages >= 1, "--messages must be at least 1");
        anyhow::ensure!(
            (1..=HUBS_MAX).contains(&cli.hubs),
            "--hubs {} is out of range; allowed 1..={HUBS_MAX}",
            cli.hubs
        );
        anyhow::ensure!(
            cli.hubs == 1 || cli.database_url.is_some(),
            "--hubs {} needs --database-url: several hubs share one PostgreSQL record, never an SQLite file",
            cli.hubs
        );
        let seconds = |v: Option<f64>, full: f64, quick: f64, flag: &str| -> anyhow::Result<Duration> {
            let s = v.unwrap_or(if q { quick } else { full });
            anyhow::ensure!(s > 0.0 && s <= 3600.0, "{flag} {s} is out of range; allowed (0, 3600]");
            Ok(Duration::from_secs_f64(s))
        };
        Ok(Plan {
            hosts: (0..cli.hosts).map(|i| format!("host-{i}")).collect(),
            producers: cli.producers,
            messages,
            true_messages: cli.true_messages.unwrap_or((messages / 10).max(100)),
            half_load: seconds(cli.half_load_seconds, 10.0, 2.0, "--half-load-seconds")?,
            half_load_rate: match cli.half_load_rate {
                Some(r) if !(r > 0.0 && r <= HALF_LOAD_RATE_MAX) => {
                    anyhow::bail!("--half-load-rate {r} is out of range; allowed (0, {HALF_LOAD_RATE_MAX}]")
                }
                r => r,
            },
            ceiling: seconds(cli.ceiling_seconds, 3.0, 1.0, "--ceiling-seconds")?,
            node_parallel: cli.node_parallel,
            node_batch: cli.node_batch,
            node_handoff: cli.node_handoff.clone(),
            node_handoffs_in_flight: cli.node_handoffs_in_flight,
            submit_batch: cli.submit_batch,
            backlog_sizes: if cli.skip_backlog || cli.database_url.is_some() {
                Vec::new()
            } else if q {
                vec![1_000, 10_000]
            } else {
                vec![10_000, 100_000, 1_000_000]
            },
            backlog_claims: cli.backlog_claims.unwrap_or(if q { 50 } else { 200 }).max(1),
            skip_e2e: cli.skip_e2e,
            skip_fairness: cli.skip_fairness || cli.database_url.is_some(),
            quick: q,
            database_url: cli.database_url.clone(),
            hubs: cli.hubs,
        })
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "baton-bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let plan = Plan::from_cli(cli)?;
    let bins = Binaries::at(cli.hub_bin.clone(), cli.node_bin.clone())?;
    let parent = cli.dir.clone().unwrap_or_else(std::env::temp_dir);
    let tmp =
        tempfile::Builder::new().prefix("baton-bench-").tempdir_in(&parent).context("making the run directory")?;
    let root = tmp.path().to_path_buf();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    rt.spawn(baton_testkit::proc::stop_all_on_signal("baton-bench"));
    let mut figs = Figures::default();
    describe(&mut figs, &plan, &root);
    let result = measure(&rt, &bins, &plan, &root, &mut figs);
    // Other work on the machine skews every figure; the load averages say how much there was.
    figs.context("loadavg_at_end", json!(loadavg()));
    derive(&mut figs, &plan);
    let mut out = std::io::stdout().lock();
    figs.print_table(&mut out)?;
    if let Some(path) = &cli.json {
        let text = serde_json::to_string_pretty(&figs.to_json())?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))?;
    }
    // A failed run keeps its directory: the hub's and nodes' logs say what went wrong.
    if cli.keep || result.is_err() {
        let kept = tmp.keep();
        writeln!(out, "# kept: {}", kept.display())?;
    }
    result
}

/// The machine and the parameters, for the table and the JSON.
fn describe(figs: &mut Figures, plan: &Plan, root: &std::path::Path) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find_map(|l| l.strip_prefix("model name")?.split_once(':').map(|(_, m)| m.trim()));
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    figs.context("cpus", json!(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)));
    figs.context("cpu_model", json!(model.unwrap_or("unknown")));
    figs.context("mem_total_bytes", json!(procfs::parse_status_bytes(&meminfo, "MemTotal")));
    figs.context("clk_tck", json!(procfs::clock_ticks()));
    figs.context("loadavg_at_start", json!(loadavg()));
    figs.context("dir", json!(root.display().to_string()));
    figs.context("quick", json!(plan.quick));
    figs.context("hosts", json!(plan.hosts.len()));
    figs.context("hubs", json!(plan.hubs));
    figs.context("backend", json!(if plan.database_url.is_some() { "postgres" } else { "sqlite" }));
    figs.context("producers", json!(plan.producers));
    figs.context("messages", json!(plan.messages));
    figs.context("true_messages", json!(plan.true_messages));
    figs.context("node_parallel_conversations", json!(plan.node_parallel));
    figs.context("node_claim_batch_max", json!(plan.node_batch));
    figs.context("node_handoff", json!(plan.node_handoff));
    figs.context("node_handoffs_in_flight", json!(plan.node_handoffs_in_flight));
    figs.context("submit_batch", json!(plan.submit_batch));
    figs.context("backlog_sizes", json!(plan.backlog_sizes));
    figs.context(
        "notes",
        json!(
            "hub and nodes at synchronous=FULL; backlog prefill connection at synchronous=OFF; \
             latencies from hub timestamps (1 ms resolution); claim_ms_backlog_* from the real hub (p50 of \
             POST /v1/claims max=1, durable commit included), inproc_* from store::lifecycle::claim::claim without commit"
        ),
    );
}

/// The first three fields of `/proc/loadavg` (1, 5 and 15 minutes).
fn loadavg() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn progress(what: &str) {
    let _ = writeln!(std::io::stderr(), "baton-bench: {what}");
}

/// Runs every step, recording figures as they come, so a failure late keeps the early ones.
fn measure(
    rt: &tokio::runtime::Runtime,
    bins: &Binaries,
    plan: &Plan,
    root: &std::path::Path,
    figs: &mut Figures,
) -> anyhow::Result<()> {
    let e2e_root = root.join("e2e");
    std::fs::create_dir_all(&e2e_root)?;
    progress("step 1: storage ceiling");
    let c = ceiling::measure(&e2e_root, plan.ceiling)?;
    figs.put("sqlite_commits_per_s", Some(c.commits_per_s), "durable commits/s, 1 small insert each (FULL, WAL)");
    figs.put("sqlite_rows_per_s_batch64", Some(c.rows_per_s_batch64), "rows/s at 64 inserts per durable commit");
    figs.put("sqlite_commit_ms", Some(1000.0 / c.commits_per_s), "one durable commit, ms (1000 / commits/s)");
    figs.put(
        "hub_store_cycle_per_s_single",
        Some(c.store_cycle_per_s_single),
        "accept+fan-out+claim+handoff+report via the hub's Store, 1 message per operation (a commit each)",
    );
    figs.put(
        "hub_store_cycle_per_s_batch64",
        Some(c.store_cycle_per_s_batch64),
        "the same, 64 messages per operation (the batch operations)",
    );

    if let Some(url) = plan.database_url.as_deref() {
        progress("step 1: the PostgreSQL queue ceiling");
        let jobs_per_s = pg_ceiling::measure(rt, url, plan.ceiling)?;
        figs.put(
            "pg_ceiling_jobs_per_s",
            Some(jobs_per_s),
            &format!(
                "bare PostgreSQL queue, same server: {} connections each enqueue {} jobs (one commit), then take, \
                 delete and complete them with FOR UPDATE SKIP LOCKED (one commit)",
                pg_ceiling::PG_CEILING_WORKERS,
                pg_ceiling::PG_CEILING_BATCH
            ),
        );
    }
    if !plan.skip_e2e {
        end_to_end(rt, bins, plan, &e2e_root, figs)?;
    }
    if !plan.skip_e2e && !plan.skip_fairness {
        let (heavy, light) = if plan.quick { FAIRNESS_QUICK } else { FAIRNESS_FULL };
        progress(&format!("step 2b: fairness, {light} light turns while {heavy} heavy ones drain"));
        let f = fairness::run(
            rt,
            bins,
            &root.join("fairness"),
            heavy,
            light,
            &fairness::node_settings(plan.node_parallel, &plan.node_handoff, plan.node_handoffs_in_flight),
        )?;
        figs.put(
            "light_conversation_p99_ms",
            Some(f.light_accept_to_report_ms.p99),
            "p99 accept->report of a light conversation while a heavy one drains on its host, ms",
        );
        figs.put(
            "light_conversation_heavy_left_share",
            Some(f.heavy_left_share),
            "share of the heavy backlog still waiting when the light conversation was done",
        );
    }
    if plan.backlog_sizes.is_empty() {
        return Ok(());
    }
    progress("step 3: claim latency with a backlog");
    let points =
        backlog::run(rt, bins, &root.join("backlog"), &plan.backlog_sizes, plan.backlog_claims, backlog::Queue::Host)?;
    record_backlog(figs, "", &points);
    if let Some(last) = points.last() {
        figs.put(
            "hub_peak_rss_bytes",
            Some(last.hub_peak_rss_bytes as f64),
            &format!("hub VmHWM serving the {} backlog", size_label(last.size)),
        );
    }
    progress("step 3: claim latency with a backlog in a pool");
    let points = backlog::run(
        rt,
        bins,
        &root.join("backlog-pool"),
        &plan.backlog_sizes,
        plan.backlog_claims,
        backlog::Queue::Pool,
    )?;
    record_backlog(figs, "pool_", &points);
    Ok(())
}

/// Records step 3's figures at each backlog size under `prefix` (`pool_` for the pool's
/// backlog).
fn record_backlog(figs: &mut Figures, prefix: &str, points: &[backlog::BacklogPoint]) {
    let queue = if prefix.is_empty() { "the host's own queue" } else { "a pool's queue (one member)" };
    for p in points {
        let k = |name: &str| format!("{prefix}{name}_backlog_{}", size_label(p.size));
        figs.put(
            &k("claim_ms"),
            Some(p.hub_ms.p50),
            &format!("p50 POST /v1/claims max=1 via the real hub, {queue}, ms"),
        );
        figs.put(&k("claim_ms_p99"), Some(p.hub_ms.p99), "p99 of the same, ms");
        figs.put(
            &k("inproc_claim_ms"),
            Some(p.inproc_ms.p50),
            &format!("p50 store::lifecycle::claim::claim, {queue}, ms"),
        );
        figs.put(&k("inproc_claim_ms_p99"), Some(p.inproc_ms.p99), "p99 of the same, ms");
        figs.put(&k("hub_start_s"), Some(p.hub_start_s), "hub spawn to ready (/readyz answers), s");
        figs.put(
            &k("prefill_s"),
            Some(p.prefill_s),
            &format!("prefill time to this size, {queue}, with the prefill's own index, s"),
        );
        figs.put(&k("hub_peak_rss_bytes"), Some(p.hub_peak_rss_bytes as f64), "hub VmHWM, bytes");
    }
}

/// Step 2: the hub and its nodes, three passes (no-op, half load, /bin/true).
/// Step 2b sizes (heavy queued turns, light turns) of a full run.
const FAIRNESS_FULL: (usize, usize) = (50_000, 200);
/// Step 2b sizes of a `--quick` run.
const FAIRNESS_QUICK: (usize, usize) = (5_000, 20);

fn end_to_end(
    rt: &tokio::runtime::Runtime,
    bins: &Binaries,
    plan: &Plan,
    e2e_root: &std::path::Path,
    figs: &mut Figures,
) -> anyhow::Result<()> {
    progress("step 2: end to end (init, enroll, serve)");
    let first = cluster::create_hub(bins, e2e_root, &plan.hosts, &[e2e::PRODUCER], plan.database_url.as_deref())?;
    let mut hubs = vec![first];
    if let Some(url) = plan.database_url.as_deref() {
        for i in 1..plan.hubs {
            let extra = cluster::add_hub(bins, &e2e_root.join(format!("hub-{i}")), &hubs[0], url)?;
            hubs.push(extra);
        }
    }
    let urls: Vec<String> =
        hubs.iter_mut().map(|h| cluster::start_hub(h).map(|(url, _)| url)).collect::<anyhow::Result<_>>()?;
    let producers: Vec<baton_client::Client> = (0..plan.producers)
        .map(|j| cluster::client(&hubs[0], &urls[j % urls.len()], e2e::PRODUCER))
        .collect::<anyhow::Result<_>>()?;
    let settings = |harness| NodeSettings {
        harness,
        parallel_conversations: plan.node_parallel,
        claim_batch_max: plan.node_batch,
        handoff: plan.node_handoff.clone(),
        handoffs_in_flight: plan.node_handoffs_in_flight,
        otlp_endpoint: None,
    };
    let convs_per_host = (plan.node_parallel as usize * 2).max(1);
    let pass = |name: &str, messages, rate_per_s, harness| e2e::Pass {
        name: name.into(),
        messages,
        rate_per_s,
        convs_per_host,
        submit_batch: plan.submit_batch,
        node: settings(harness),
        pool: None,
    };
    let rig = e2e::Rig {
        rt,
        bins,
        hubs: &hubs,
        urls: &urls,
        hosts: &plan.hosts,
        producers: &producers,
        work_dir: e2e_root,
        database_url: plan.database_url.as_deref(),
    };
    let run = |p: &e2e::Pass| e2e::run_pass(&rig, p);

    progress(&format!("step 2: no-op pass, {} messages", plan.messages));
    let r = run(&pass("noop", plan.messages, None, Harness::Noop))?;
    record_pass(figs, "", &r);

    // The same pass addressed to one pool of every host: the same messages, conversations and
    // nodes, each message one delivery any member's claim may take. It runs right after the
    // host-addressed pass, on the same hub, so the two figures are of one run.
    progress(&format!("step 2: no-op pass to a pool of {} hosts, {} messages", plan.hosts.len(), plan.messages));
    let mut add = vec!["pools", "add", "--pool", e2e::POOL];
    add.extend(plan.hosts.iter().map(String::as_str));
    add.extend(["--reason", "benchmark: one pool of every host"]);
    hubs[0].cli(add).context("baton-hub pools add")?;
    let p = run(&e2e::Pass { pool: Some(e2e::POOL.into()), ..pass("pool", plan.messages, None, Harness::Noop) })?;
    // The later passes address hosts by name and measure claims that look at no pool.
    let mut remove = vec!["pools", "remove", "--pool", e2e::POOL];
    remove.extend(plan.hosts.iter().map(String::as_str));
    remove.extend(["--reason", "benchmark: the pool pass is over"]);
    hubs[0].cli(remove).context("baton-hub pools remove")?;
    // The host-addressed pass once more, after the pool pass: every pass runs on a larger record
    // than the one before it, and the pool pass sits between these two.
    progress(&format!("step 2: no-op pass again, {} messages, each to one host", plan.messages));
    let again = run(&pass("again", plan.messages, None, Harness::Noop))?;
    record_pass(figs, "host_again_", &again);
    record_pass(figs, "pool_", &p);
    let reported = p.per_host.iter().sum::<usize>().max(1);
    figs.put("pool_hosts_working", Some(p.per_host.len() as f64), "members that ran at least one pool delivery");
    figs.put(
        "pool_busiest_host_share",
        p.per_host.first().map(|n| *n as f64 / reported as f64),
        "share of the pool's deliveries the busiest member ran (1/hosts is an even spread)",
    );
    let single_messages = (plan.messages / 4).max(100);
    progress(&format!("step 2: no-op pass, {single_messages} messages, one per request"));
    let single = e2e::Pass { submit_batch: 1, ..pass("single", single_messages, None, Harness::Noop) };
    let s = run(&single)?;
    record_pass(figs, "single_submit_", &s);
    figs.put(
        "e2e_single_submit_deliveries_per_s",
        Some(s.e2e_deliveries_per_s),
        "as e2e_deliveries_per_s, producers sending one message per request",
    );

    // Half of what this pass's own kind of load reaches: one message per request (the
    // single-submit pass), not the batched no-op pass, whose rate one-message requests cannot
    // reach (half of it kept the machine about 80 % busy and measured queueing).
    let rate = plan.half_load_rate.unwrap_or((s.e2e_deliveries_per_s / 2.0).max(1.0));
    let half_messages = ((rate * plan.half_load.as_secs_f64()) as usize).max(20);
    progress(&format!("step 2: half-load pass, {half_messages} messages at {rate:.0}/s"));
    // A steady stream: each message in its own request on its own schedule, as many
    // independent producers offer load. A batch of 64 arriving at once would measure how long
    // one burst takes to drain, not the latency of a hub at half load.
    let half = e2e::Pass { submit_batch: 1, ..pass("half", half_messages, Some(rate), Harness::Noop) };
    let h = run(&half)?;
    figs.put(
        "half_load_rate_per_s",
        Some(rate),
        "offered rate, one message per request: half the single-submit pass's e2e deliveries/s, or --half-load-rate",
    );
    record_pass(figs, "half_load_", &h);

    progress(&format!("step 2: /bin/true pass, {} messages", plan.true_messages));
    let t = run(&pass("true", plan.true_messages, None, Harness::Command(vec!["/bin/true".into()])))?;
    record_pass(figs, "true_harness_", &t);

    // Progress: a shell harness writing 10 progress events per turn beside the same shell
    // writing none, so the difference is the progress alone (its node forwards them with its
    // renewals, one request per pass for every running turn).
    let shell = |script: &str| Harness::Command(vec!["sh".into(), "-c".into(), script.into()]);
    progress(&format!("step 2: sh pass without progress, {} messages", plan.true_messages));
    let quiet = run(&pass("sh", plan.true_messages, None, shell(":")))?;
    record_pass(figs, "sh_harness_", &quiet);
    record_progress(figs, "sh_harness_", &quiet);
    progress(&format!("step 2: sh pass with 10 progress events per turn, {} messages", plan.true_messages));
    let emits = "i=0; while [ $i -lt 10 ]; do echo \"{\\\"i\\\":$i}\" >&3; i=$((i+1)); done";
    let chatty = run(&pass("progress", plan.true_messages, None, shell(emits)))?;
    record_pass(figs, "progress10_", &chatty);
    record_progress(figs, "progress10_", &chatty);

    let clk = procfs::clock_ticks();
    let rss = procfs::sample(hubs[0].proc().pid().context("the hub is not running")?, clk)?.peak_rss_bytes;
    figs.put("e2e_hub_peak_rss_bytes", Some(rss as f64), "(first) hub VmHWM after the end-to-end passes");
    figs.put("hub_peak_rss_bytes", Some(rss as f64), "hub VmHWM (e2e hub; replaced by the largest backlog below)");

    // The cost of traces: the single-submit pass again, the hubs and the nodes exporting every
    // span to a local OTLP receiver, beside the same pass without (the default) above.
    progress(&format!("step 2: no-op pass, {single_messages} messages, one per request, tracing on"));
    let sink = baton_testkit::otlp::OtlpSink::start(baton_testkit::otlp::Keep::Counts)?;
    for hub in &mut hubs {
        let addr = hub.addr().context("a hub is not serving")?;
        let status = hub.proc_mut().stop(cluster::STOP_GRACE)?.context("a hub never ran")?;
        anyhow::ensure!(status.success(), "a hub exited with {status} at the end of the untraced passes");
        hub.set_env("BATON_HUB_OTLP_ENDPOINT", &sink.endpoint());
        hub.listen_on(addr);
        cluster::start_hub(hub)?;
    }
    let traced_producers: Vec<baton_client::Client> = (0..plan.producers)
        .map(|j| cluster::client(&hubs[0], &urls[j % urls.len()], e2e::PRODUCER))
        .collect::<anyhow::Result<_>>()?;
    let traced_rig = e2e::Rig {
        rt,
        bins,
        hubs: &hubs,
        urls: &urls,
        hosts: &plan.hosts,
        producers: &traced_producers,
        work_dir: e2e_root,
        database_url: plan.database_url.as_deref(),
    };
    let mut traced = e2e::Pass { submit_batch: 1, ..pass("traced", single_messages, None, Harness::Noop) };
    traced.node.otlp_endpoint = Some(sink.endpoint());
    let t = e2e::run_pass(&traced_rig, &traced)?;
    record_pass(figs, "traced_single_submit_", &t);
    // The spans leave in batches; the hubs' last ones at their stop.
    for hub in &mut hubs {
        let status = hub.proc_mut().stop(cluster::STOP_GRACE)?.context("a hub never ran")?;
        anyhow::ensure!(status.success(), "a hub exited with {status} at the end of the passes");
    }
    let (spans, exports) = sink.counts();
    figs.put("trace_spans_exported", Some(spans as f64), "spans the traced pass's hubs and nodes exported");
    figs.put("trace_export_requests", Some(exports as f64), "OTLP/HTTP export requests that carried them");
    figs.put(
        "trace_spans_per_delivery",
        Some(spans as f64 / (t.deliveries.max(1) as f64)),
        "spans per delivery with tracing on (accept, fan-out, claim, handoff, start, run, report)",
    );
    anyhow::ensure!(sink.refused().is_empty(), "the OTLP receiver refused exports: {:?}", sink.refused());
    Ok(())
}

/// Records one pass's figures under `prefix`.
fn record_pass(figs: &mut Figures, prefix: &str, r: &e2e::PassResult) {
    let k = |name: &str| format!("{prefix}{name}");
    figs.put(&k("messages_accepted"), Some(r.accepted as f64), "messages accepted (201)");
    figs.put(&k("submit_errors"), Some(r.errors as f64), r.first_error.as_deref().unwrap_or("none"));
    figs.put(&k("accepted_per_s"), Some(r.accepted_per_s), "accepted messages/s");
    figs.put(&k("e2e_deliveries_per_s"), Some(r.e2e_deliveries_per_s), "first submit to last report committed");
    let s = |v: Option<stats::Summary>, f: fn(&stats::Summary) -> f64| v.as_ref().map(f);
    figs.put(&k("accept_to_claim_p50_ms"), s(r.accept_to_claim, |x| x.p50), "ms");
    figs.put(&k("accept_to_claim_p99_ms"), s(r.accept_to_claim, |x| x.p99), "ms");
    figs.put(&k("accept_to_claim_max_ms"), s(r.accept_to_claim, |x| x.max), "ms");
    figs.put(&k("accept_to_report_p50_ms"), s(r.accept_to_report, |x| x.p50), "ms");
    figs.put(&k("accept_to_report_p99_ms"), s(r.accept_to_report, |x| x.p99), "ms");
    figs.put(&k("accept_to_report_max_ms"), s(r.accept_to_report, |x| x.max), "ms");
    figs.put(&k("hub_cpu_s_per_1k_deliveries"), Some(r.per_1k(r.hub_cpu_s)), "hub user+sys CPU s per 1000");
    figs.put(&k("nodes_cpu_s_per_1k_deliveries"), Some(r.per_1k(r.nodes_cpu_s)), "all nodes' CPU s per 1000");
    figs.put(&k("bench_cpu_s_per_1k_deliveries"), Some(r.per_1k(r.bench_cpu_s)), "producers' CPU s per 1000");
    figs.put(
        &k("hub_cpu_us_per_delivery"),
        Some(r.per_1k(r.hub_cpu_s) * 1000.0),
        "hub user+sys CPU us per delivery (every hub together)",
    );
    figs.put(
        &k("db_cpu_us_per_delivery"),
        r.db_cpu_s.map(|s| r.per_1k(s) * 1000.0),
        "PostgreSQL server's CPU us per delivery (its process tree; null on SQLite or a remote server)",
    );
    figs.put(&k("node_cpu_us_per_delivery"), Some(r.per_1k(r.nodes_cpu_s) * 1000.0), "all nodes' CPU us per delivery");
    let per_delivery = |n: Option<f64>| n.map(|n| n / (r.deliveries.max(1) as f64));
    figs.put(
        &k("db_round_trips_per_delivery"),
        per_delivery(r.db_round_trips),
        "round trips to PostgreSQL per delivery, every hub (null on SQLite)",
    );
    figs.put(
        &k("db_statements_per_delivery"),
        per_delivery(r.db_statements),
        "statements sent to PostgreSQL per delivery, pipelined ones included, every hub (null on SQLite)",
    );
}

/// Records a pass's progress figures under `prefix`: the events kept, and the renewal requests
/// (`POST /v1/running`) per delivery, which one request per pass for every running turn keeps
/// below one.
fn record_progress(figs: &mut Figures, prefix: &str, r: &e2e::PassResult) {
    let k = |name: &str| format!("{prefix}{name}");
    figs.put(&k("progress_events_kept"), Some(r.progress_events as f64), "progress events the hub kept");
    figs.put(
        &k("running_requests"),
        r.running_requests,
        "POST /v1/running requests the (first) hub answered during the pass: the nodes' renewals, progress included",
    );
    figs.put(
        &k("running_requests_per_delivery"),
        r.running_requests.map(|n| n / (r.deliveries.max(1) as f64)),
        "renewal requests per delivery: one request per pass for all running turns, never one per turn",
    );
}

/// `10k`, `100k`, `1m` …
fn size_label(n: usize) -> String {
    if n >= 1_000_000 && n.is_multiple_of(1_000_000) {
        format!("{}m", n / 1_000_000)
    } else if n >= 1_000 && n.is_multiple_of(1_000) {
        format!("{}k", n / 1_000)
    } else {
        n.to_string()
    }
}

/// The ratios to the ceiling and the targets, from whatever was measured.
fn derive(figs: &mut Figures, plan: &Plan) {
    for key in [
        "claim_ms_backlog_10k",
        "claim_ms_backlog_100k",
        "claim_ms_backlog_1m",
        "hub_peak_rss_bytes",
        "pool_claim_ms_backlog_10k",
        "pool_claim_ms_backlog_1m",
        "pool_inproc_claim_ms_backlog_10k",
        "pool_inproc_claim_ms_backlog_1m",
    ] {
        if figs.get(key).is_none() {
            figs.put(key, None, "not measured in this run");
        }
    }
    figs.put(
        "sqlite_s_per_1k_rows_batch64",
        figs.get("sqlite_rows_per_s_batch64").map(|r| 1000.0 / r),
        "seconds the ceiling needs for 1000 rows at 64 per commit",
    );
    figs.put(
        "sqlite_us_per_row_batch64",
        figs.get("sqlite_rows_per_s_batch64").map(|r| 1_000_000.0 / r),
        "microseconds the ceiling needs per row at 64 per commit",
    );
    for (key, ceiling) in [
        ("e2e_single_submit_deliveries_per_s", "sqlite_commits_per_s"),
        ("e2e_single_submit_deliveries_per_s", "sqlite_rows_per_s_batch64"),
        ("e2e_single_submit_deliveries_per_s", "hub_store_cycle_per_s_single"),
        ("e2e_deliveries_per_s", "e2e_single_submit_deliveries_per_s"),
    ] {
        figs.ratio(key, ceiling);
    }
    // On PostgreSQL: Baton's deliveries beside a bare job queue on the same server.
    if plan.database_url.is_some() {
        for key in ["e2e_deliveries_per_s", "e2e_single_submit_deliveries_per_s"] {
            figs.ratio(key, "pg_ceiling_jobs_per_s");
        }
    }
    // Addressed to a pool of every host beside addressed to each host by name, the same run.
    for key in [
        "e2e_deliveries_per_s",
        "accepted_per_s",
        "accept_to_claim_p99_ms",
        "accept_to_report_p99_ms",
        "hub_cpu_us_per_delivery",
        "node_cpu_us_per_delivery",
    ] {
        figs.ratio(&format!("pool_{key}"), key);
        figs.ratio(&format!("pool_{key}"), &format!("host_again_{key}"));
    }
    // Tracing on beside tracing off: the same pass, one per request.
    for key in
        ["e2e_deliveries_per_s", "hub_cpu_us_per_delivery", "node_cpu_us_per_delivery", "accept_to_report_p99_ms"]
    {
        figs.ratio(&format!("traced_single_submit_{key}"), &format!("single_submit_{key}"));
    }
    for prefix in ["", "half_load_", "true_harness_", "single_submit_"] {
        for (key, ceiling) in [
            ("accepted_per_s", "sqlite_commits_per_s"),
            ("accepted_per_s", "sqlite_rows_per_s_batch64"),
            ("e2e_deliveries_per_s", "sqlite_rows_per_s_batch64"),
            ("e2e_deliveries_per_s", "hub_store_cycle_per_s_batch64"),
            ("accept_to_claim_p50_ms", "sqlite_commit_ms"),
            ("accept_to_claim_p99_ms", "sqlite_commit_ms"),
            ("accept_to_report_p99_ms", "sqlite_commit_ms"),
            ("hub_cpu_s_per_1k_deliveries", "sqlite_s_per_1k_rows_batch64"),
            ("hub_cpu_us_per_delivery", "sqlite_us_per_row_batch64"),
            ("node_cpu_us_per_delivery", "sqlite_us_per_row_batch64"),
        ] {
            figs.ratio(&format!("{prefix}{key}"), ceiling);
        }
    }
    for size in &plan.backlog_sizes {
        figs.ratio(&format!("claim_ms_backlog_{}", size_label(*size)), "sqlite_commit_ms");
    }
    figs.ratio("claim_ms_backlog_1m", "claim_ms_backlog_10k");
    figs.ratio("inproc_claim_ms_backlog_1m", "inproc_claim_ms_backlog_10k");
    // A pool's backlog beside the host's own of the same size, and its growth from 10k to 1M.
    for size in &plan.backlog_sizes {
        let l = size_label(*size);
        for key in ["claim_ms", "inproc_claim_ms", "prefill_s"] {
            figs.ratio(&format!("pool_{key}_backlog_{l}"), &format!("{key}_backlog_{l}"));
        }
    }
    figs.ratio("pool_claim_ms_backlog_1m", "pool_claim_ms_backlog_10k");
    figs.ratio("pool_inproc_claim_ms_backlog_1m", "pool_inproc_claim_ms_backlog_10k");
    figs.target("e2e_deliveries_per_s >= 10000", "e2e_deliveries_per_s", 10_000.0, true);
    figs.target("half_load_accept_to_claim_p99_ms < 5", "half_load_accept_to_claim_p99_ms", 5.0, false);
    figs.target(
        "claim_ms_backlog_1m / claim_ms_backlog_10k <= 1.5",
        "claim_ms_backlog_1m_over_claim_ms_backlog_10k",
        1.5,
        false,
    );
    let rss_1m = figs.get("hub_peak_rss_bytes_backlog_1m");
    figs.target_value("hub_peak_rss_bytes (1M queued) < 100 MB", rss_1m, 100.0 * 1024.0 * 1024.0, false);
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn quick_plan_is_small_and_flags_are_checked() {
        let cli = Cli::parse_from(["baton-bench", "--quick"]);
        let p = Plan::from_cli(&cli).unwrap();
        assert_eq!((p.messages, p.true_messages, p.backlog_sizes.clone()), (2_000, 200, vec![1_000, 10_000]));
        let cli = Cli::parse_from(["baton-bench", "--skip-backlog", "--messages", "500"]);
        let p = Plan::from_cli(&cli).unwrap();
        assert!(p.backlog_sizes.is_empty());
        assert_eq!(p.true_messages, 100);
        let cli = Cli::parse_from(["baton-bench", "--hosts", "0"]);
        assert!(Plan::from_cli(&cli).unwrap_err().to_string().contains("--hosts 0"));
        let cli = Cli::parse_from(["baton-bench", "--submit-batch", "257"]);
        assert!(Plan::from_cli(&cli).unwrap_err().to_string().contains("--submit-batch 257"));
        assert_eq!(Plan::from_cli(&Cli::parse_from(["baton-bench"])).unwrap().submit_batch, 64);
    }

    #[test]
    fn size_labels() {
        for (n, l) in [(1_000, "1k"), (10_000, "10k"), (100_000, "100k"), (1_000_000, "1m"), (1_500, "1500")] {
            assert_eq!(size_label(n), l);
        }
    }
}
