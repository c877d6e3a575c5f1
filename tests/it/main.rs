//! End-to-end tests: the real `baton-hub` and `baton-node` binaries, started in fresh temp
//! directories with freshly enrolled certificates, driven over real mTLS and through the
//! operator CLI. Processes, readiness, signals and logs come from the test kit
//! (`baton_testkit`); the fixtures here add what this suite asserts with.
//!
//! Layout:
//! - `harness`: the `Hub` fixture, CLI runner, TLS clients and node calls.
//! - `node_harness`: real nodes (`Hub::node_process`), their execution log, node-side waits.
//! - `hub_contract`: the SPEC §2 state machine through the API and CLI, idempotent accept,
//!   reports, instance binding, operator transitions.
//! - `hub_longpoll`: claims and producer reads that wait, and what wakes them.
//! - `hub_fences`: pause, hold and block per scope.
//! - `hub_auth`: identity and transport (mTLS, roles, revocation).
//! - `hub_batch`: the batch endpoints: each item answered as its single endpoint answers it,
//!   order kept, replays safe, over-limit batches and revoked callers refused whole.
//! - `hub_errors`: every 4xx answer and its `{code, message}` body.
//! - `openapi_exact`: `docs/openapi.json` held to the validation code: its bounds are the
//!   constants, and requests generated from it (each constraint broken, each boundary kept) are
//!   answered by a real hub exactly as it says.
//! - `cert_rotation`: the hub's server certificate replaced under open connections and a
//!   running node (`renew --server`, SIGHUP), and `status` flagging one near its end.
//! - `hub_edges`: the hub's edges under abuse: connection limits and timeouts, revocation of
//!   open connections and of waiting reads, file modes, and axum's own refusals in our shape.
//! - `file_bounds`: the files a user names (payloads, CA, certificate and key files,
//!   configuration files) read within their bounds by `baton`, `baton-node` and `baton-hub`.
//! - `hub_crash`: crash points, restart and repair.
//! - `hub_lean`: the lean hot path: cached certificate standing that a CLI revocation still
//!   ends at the next request; claims woken per host; no write job for nothing to claim; a
//!   waiting claim served in the transaction of the accept that gives it work.
//! - `hub_turns`: node sessions, hub-confirmed starts, cancel, retries and redrive, with a raw
//!   client playing the node.
//! - `hub_cli`: configuration validation and the CLI's outputs and exit codes.
//! - `hub_postgres`: the record in PostgreSQL (`database_url`): its layers, `init` migrating the
//!   database, a second hub joining with the first one's CA, SQLite-only commands refused, and
//!   two hubs serving one record.
//! - `metrics`: what the binaries export for alerting (histograms with buckets, requests by
//!   route and code, record gauges, the node's own `/metrics`), the node's line when the hub
//!   answers again, and `docs/alerts/` held to promtool and to the names the binaries export.
//! - `multi_hub`: two hubs over one PostgreSQL record with real nodes: they wake each other,
//!   one killed with SIGKILL mid-flight loses nothing, PostgreSQL restarting under them
//!   loses nothing, and a fence set and lifted through one holds and wakes the other.
//! - `conversation_order`: per-conversation order on each host under concurrent producers.
//! - `conversation_fairness`: a deep backlog in one conversation does not starve another.
//! - `conversations_cli`: the operator's membership and publish-scope commands, and posts
//!   without `to` running on exactly the members.
//! - `ops_explain`: `deliveries explain` and the one-line reasons of `deliveries list`.
//! - `ops_fleet`: `hosts list|show` and what `status` flags (silent hosts, expiring
//!   certificates, a stopped hub) with its exit status.
//! - `ops_identity`: one role per name, `certs list`, `renew --revoke-old`, `audit`.
//! - `ops_lists`: `deliveries list` filters, order and cursor paging; ids by unique prefix.
//! - `ops_output`: stored text shown escaped, `--json` exact, no migration noise.
//! - `ops_restore`: `restore` (refused while the hub runs, verified first, the old file kept) and
//!   `purge` (settled messages only, audited).
//! - `ops_retention`: the audit log's retention window, swept by the running hub.
//! - `ops_silence`: `requeue_silent_after` returns a silent instance's unacked work to the queue;
//!   another instance runs it, the old one never does.
//! - `ops_truth`: counts that are rows changed, "nothing to do" exits, fence refusals,
//!   releases a fence would undo, time-boxed fences.
//! - `harness_stderr`: the end of a harness's stderr in every view, its node-side and hub-side
//!   bounds, and its way through the node's outbox across restarts.
//! - `node_config_check`: `baton-node config check` offline and `--online`, each failure named
//!   with exit 2, and `run` refusing to start on the same failures.
//! - `node_*`, `power_loss`: the node agent and durability under power loss (see each module);
//!   `node_turns`: orphaned harnesses, SIGTERM before SIGKILL, revocation, renewal, store size.
//! - `turn_control`: cancel reaching a running or waiting turn, retries the harness asks for,
//!   the operator's retry (a redrive), and a copied data directory that runs nothing twice.
//! - `examples`: the Python producer and harness of `docs/examples/` against the real binaries.
//! - `python_client`: the Python client package's own suite against a real hub and node, its
//!   spool through a hub outage and interchangeable with `baton`'s, and `mypy --strict`.
//! - `demo`: `baton-demo`, README's quick start, run to its end, and its build of the programs
//!   resolving features as the `cargo run` before it (so it only links them).
//! - `packaging`: the Debian packages, their systemd units, and readiness through `sd_notify`.
//! - `pools`: a pool an operator made, addressed by `"pools"` and `baton send --pool`: one
//!   delivery no host holds yet, in every view; a replay, a conflict and an unknown pool.
//! - `producer_cli`: `baton`, the producer command line: send, get, wait and cancel with their
//!   exit statuses, and configuration errors.
//! - `progress`: a harness's progress events through the node and the hub to `baton watch`,
//!   cut off and resumed; the conversation feed's reading rule and its cursors.
//! - `deadlines`: `--deadline` and `--stall` stop a real turn's whole process group, name
//!   themselves, and a stall is retried while a deadline is final.
//! - `running_turns`: running turns renewed and shown to the operator, and a node killed
//!   mid-turn: running on a silent host, given to no other, until retire records it unknown.
//! - `status_page`: the operator listener (health, readiness and described metrics without a
//!   client certificate) and the status page in a real headless browser.
//! - `replay`: a producer's listing of its own messages (`GET /v1/messages?conversation=C`,
//!   `baton list`): pages, cursors, refusals, expiry after a purge.
//! - `traces`: the producer's `traceparent` kept, shown, handed to the harness, and the hub's and
//!   the node's spans received by a real OTLP receiver as one trace.
//! - `status_view`: what the status page shows, over HTTP: attention as `status` flags it,
//!   rates, running turns, fenced backlogs, search, and reasons as configured.

// A test binary exports nothing, so `pub` in its private modules only means "shared between
// modules"; spelling every item `pub(crate)` would add noise, not safety.
#![allow(unreachable_pub)]

mod approval;
mod cert_rotation;
mod conversation_fairness;
mod conversation_order;
mod conversations_cli;
mod corruption;
mod deadlines;
mod demo;
mod exact_payloads;
mod examples;
mod file_bounds;
mod harness;
mod harness_stderr;
mod hub_auth;
mod hub_batch;
mod hub_cli;
mod hub_contract;
mod hub_crash;
mod hub_edges;
mod hub_errors;
mod hub_fences;
mod hub_lean;
mod hub_longpoll;
mod hub_postgres;
mod hub_turns;
mod instance_scope;
mod metrics;
mod multi_hub;
mod node_batch;
mod node_clone;
mod node_config_check;
mod node_crash;
mod node_exec;
mod node_failover;
mod node_flow;
mod node_harness;
mod node_outage;
mod node_regain;
mod node_turns;
mod openapi_exact;
mod ops_certs;
mod ops_explain;
mod ops_fleet;
mod ops_identity;
mod ops_lists;
mod ops_output;
mod ops_restore;
mod ops_retention;
mod ops_silence;
mod ops_truth;
mod packaging;
mod pools;
mod power_loss;
mod producer_cli;
mod producer_spool;
mod progress;
mod python_client;
mod replay;
mod running_turns;
mod status_page;
mod status_view;
mod traces;
mod turn_control;
mod values;
