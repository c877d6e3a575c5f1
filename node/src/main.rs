//! The `baton-node` binary: parses the command line and hands it to the library, which owns
//! everything else. The exit codes are listed in `--help` (see `cli::exit`).

use clap::Parser as _;

fn main() -> std::process::ExitCode {
    // reqwest and the hub stack agree on aws-lc-rs; installing it explicitly keeps a second
    // provider elsewhere in the graph from turning the first TLS use into a panic.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = baton_node::cli::Cli::parse();
    std::process::ExitCode::from(baton_node::cli::main_with(cli))
}
