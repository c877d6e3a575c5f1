//! `baton-proxy`: the loopback TCP fault proxy for manual use.
//!
//! `baton-proxy --listen 127.0.0.1:0 --upstream 127.0.0.1:7443` prints the address it listens on,
//! then reads commands on stdin, one per line: `pass`, `blackhole`, `reset`, `cut N` (bytes),
//! `delay MS`, `upstream ADDR:PORT`, `stats`. End of input stops it.

use baton_fault::proxy::{Fault, Proxy};
use clap::Parser;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use tokio::io::{AsyncBufReadExt, BufReader};

/// A TCP proxy that blackholes, resets, cuts or delays on command.
#[derive(Debug, Parser)]
#[command(
    name = "baton-proxy",
    after_help = "Commands on stdin: pass | blackhole | reset | cut N | delay MS | upstream ADDR | stats"
)]
struct Cli {
    /// Where to listen (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to forward.
    #[arg(long)]
    upstream: SocketAddr,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let proxy = Proxy::start(cli.listen, cli.upstream).await?;
    println!("{}", proxy.addr());
    let mut lines = BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = lines.next_line().await? {
        let line = line.trim();
        if let Some(addr) = line.strip_prefix("upstream ") {
            match addr.trim().parse() {
                Ok(a) => proxy.set_upstream(a),
                Err(e) => eprintln!("bad address {addr:?}: {e}"),
            }
        } else if line == "stats" {
            let s = proxy.stats();
            println!(
                "accepted: {}\nforwarded_bytes: {}\ndropped_bytes: {}\ncut: {}",
                s.accepted.load(Ordering::Relaxed),
                s.forwarded_bytes.load(Ordering::Relaxed),
                s.dropped_bytes.load(Ordering::Relaxed),
                s.cut.load(Ordering::Relaxed)
            );
        } else if let Some(f) = Fault::parse(line) {
            proxy.set(f);
            println!("ok {f:?}");
        } else if !line.is_empty() {
            eprintln!("unknown command {line:?}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }
}
