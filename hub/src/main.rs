//! `baton-hub`: parses the command line, runs the command, owns the exit status.

use baton_hub::cli::{self, Cli, Command, EXIT_FAILURE, EXIT_REFUSED, EXIT_USAGE};
use baton_hub::config::HubConfig;
use baton_hub::datadir::DataDir;
use baton_hub::server::Hub;
use clap::Parser;
use std::io::Write;
use std::process::ExitCode;
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let result = match &cli.command {
        Command::Serve { listen, config } => serve(&cli, listen.as_deref(), config.as_deref()),
        _ => {
            init_logging(false);
            cli::run(&cli)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "baton-hub: {}", e.message);
            ExitCode::from(e.code)
        }
    }
}

fn init_logging(json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("BATON_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

fn serve(cli: &Cli, listen: Option<&str>, config: Option<&std::path::Path>) -> Result<(), cli::CliError> {
    let dir = DataDir::new(&cli.data_dir);
    let mut config =
        HubConfig::load(config, &dir.config()).map_err(|e| cli::CliError { code: EXIT_USAGE, message: e })?;
    init_logging(config.log_json);
    if let Some(l) = listen {
        config.listen = l.parse().map_err(|_| cli::CliError {
            code: EXIT_USAGE,
            message: format!("--listen {l:?} is not an ADDR:PORT such as 127.0.0.1:7443"),
        })?;
    }
    if !dir.db().exists() || !dir.ca_cert().exists() {
        return Err(cli::CliError {
            code: EXIT_REFUSED,
            message: format!("{} is not initialised; run `baton-hub init` first", dir.root().display()),
        });
    }
    let hub = Hub::open(dir.clone(), config.clone()).map_err(|e| {
        let refused = e.chain().any(|c| c.downcast_ref::<baton_shared::sqlite::OpenError>().is_some());
        cli::CliError { code: if refused { EXIT_REFUSED } else { EXIT_FAILURE }, message: format!("{e:#}") }
    })?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| cli::CliError { code: EXIT_FAILURE, message: e.to_string() })?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(config.listen).await.map_err(|e| cli::CliError {
            code: EXIT_FAILURE,
            message: format!("cannot listen on {}: {e}", config.listen),
        })?;
        let addr = listener.local_addr().map_err(|e| cli::CliError { code: EXIT_FAILURE, message: e.to_string() })?;
        let tmp = dir.addr_file().with_extension("addr.tmp");
        std::fs::write(&tmp, format!("{addr}\n"))
            .and_then(|_| std::fs::rename(&tmp, dir.addr_file()))
            .map_err(|e| cli::CliError { code: EXIT_FAILURE, message: format!("writing hub.addr: {e}") })?;
        let _ = writeln!(std::io::stdout(), "listening on {addr}");
        let _ = std::io::stdout().flush();
        let shutdown = CancellationToken::new();
        tokio::spawn(signal_shutdown(shutdown.clone()));
        hub.serve(listener, shutdown).await.map_err(|e| cli::CliError { code: EXIT_FAILURE, message: format!("{e:#}") })
    })
}

/// Cancels `token` on SIGTERM or SIGINT.
async fn signal_shutdown(token: CancellationToken) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    tracing::info!("shutting down");
    token.cancel();
}
