//! The svc-gateway binary: parses flags, sets up logging, serves until SIGTERM or Ctrl-C;
//! `svc-gateway validate-config FILE...` checks configuration files instead.

use clap::Parser;
use svc_gateway::base::flags::Options;
use tokio::signal::unix::{SignalKind, signal};

/// mimalloc: no free holes kept between live allocations (`base::allocator`).
#[global_allocator]
static ALLOCATOR: svc_gateway::base::allocator::Allocator = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let opts = Options::parse();
    if let Some(svc_gateway::base::flags::Command::ValidateConfig(args)) = &opts.command {
        let report = svc_gateway::base::validate_config::run(args);
        print!("{}", report.stdout);
        eprint!("{}", report.stderr);
        std::process::exit(if report.ok { 0 } else { 1 });
    }
    let filter = tracing_subscriber::EnvFilter::try_new(opts.log_filter())
        .map_err(|e| anyhow::anyhow!("invalid --log-level {:?}: {e}", opts.log_filter()))?;
    let sub = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    if opts.log_json {
        sub.json().init();
    } else {
        sub.init();
    }
    svc_gateway::base::allocator::spawn_trimmer();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .on_thread_park(svc_gateway::base::allocator::on_park)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let server = svc_gateway::run::start(opts).await?;
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received"),
            _ = int.recv() => tracing::info!("SIGINT received"),
        }
        server.shutdown().await;
        Ok(())
    })
}
