//! The node binary's integration tests, one binary (one link): its command line, its
//! configuration under random input, and the turn gate.
//!
//! Layout:
//! - `cli`: `baton-node`'s commands, exit statuses and help.
//! - `fuzz_config`: `node.toml`, the environment and flags under random input.
//! - `gate`: the turn gate: a harness process held until the node releases it.

mod cli;
mod fuzz_config;
mod gate;
