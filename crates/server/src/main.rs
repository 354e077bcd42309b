//! The `acme-proxy` binary: `serve` (the default) and operator commands.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

use acme_proxy::admin::cli;
use acme_proxy::admin::cli::common::{
    EXIT_CONFIG, EXIT_FAILED, EXIT_NOT_CONFIRMED, NoDatabase, NotConfirmed,
};
use acme_proxy::clock::SystemClock;
use acme_proxy::config::Config;

/// mimalloc instead of glibc's malloc for every Rust allocation: a request
/// allocates and frees many small buffers (headers, JSON, rows), and
/// glibc's malloc and free were 8.1 % of the server's CPU per issuance,
/// mimalloc's functions 4.6 % (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// `acme-proxy --version`: the release and the commit it was built from
/// (see build.rs).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("BUILD_COMMIT"),
    ")"
);

#[derive(Debug, Parser)]
#[command(
    name = "acme-proxy",
    version = VERSION,
    about = "An ACME (RFC 8555) server for internal PKI"
)]
struct Cli {
    /// TOML configuration file (every key is documented in acme-proxy.example.toml).
    #[arg(long, global = true, env = "ACME_PROXY_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the ACME server (the default when no command is given).
    Serve,
    /// Load and check the configuration, then exit (same as `config check`).
    CheckConfig,
    /// The installation at a glance: listeners, configuration, each
    /// profile's signer (CA expiry, upstream and its account), jobs, relayed
    /// orders in flight, last issuance and failure. Exit 1 when something
    /// needs attention.
    Status {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// The configuration as `serve` would load it.
    #[command(subcommand)]
    Config(ConfigCommand),
    /// Inspect and steer the durable job queue.
    #[command(subcommand)]
    Job(cli::job::JobCommand),
    /// The relay profiles' upstream accounts and relayed orders.
    #[command(subcommand)]
    Upstream(cli::upstream::UpstreamCommand),
    /// The audit trail: who got which certificate, and why one was refused.
    #[command(subcommand)]
    Audit(cli::audit::AuditCommand),
    /// ACME accounts: list, show, deactivate, delete.
    #[command(subcommand)]
    Account(cli::account::AccountCommand),
    /// Orders and their certificates: list, show, revoke, delete.
    #[command(subcommand)]
    Order(cli::order::OrderCommand),
    /// Issued certificates: those that expire soon.
    #[command(subcommand)]
    Cert(cli::cert::CertCommand),
    /// Replay nonces.
    #[command(subcommand)]
    Nonce(cli::nonce::NonceCommand),
    /// External Account Binding credentials: create, list, revoke.
    #[command(subcommand)]
    Eab(cli::eab::EabCommand),
    /// The database: a consistent copy of a SQLite file while it serves.
    #[command(subcommand)]
    Db(cli::db::DbCommand),
    /// The embedded DNS zone ([dns_zone]): its TXT records.
    #[command(subcommand)]
    Dns(cli::dns::DnsCommand),
    /// The [policy]: what it decides for a client, and why.
    #[command(subcommand)]
    Policy(cli::policy::PolicyCommand),
    /// The [rate_limits]: what they hold back, and resetting a key.
    #[command(subcommand)]
    Ratelimit(cli::ratelimit::RatelimitCommand),
    /// The web console's users and sessions ([admin]).
    #[command(subcommand)]
    Admin(cli::admin::AdminCommand),
    /// Write the man pages or the shell completions into a directory (for
    /// packagers; reads no configuration).
    #[command(subcommand)]
    Generate(GenerateCommand),
}

#[derive(Debug, Subcommand)]
enum GenerateCommand {
    /// roff man pages: acme-proxy.1 and one page per command.
    Man {
        /// Where to write them (created if missing).
        dir: PathBuf,
    },
    /// Completions for bash, zsh and fish.
    Completions {
        /// Where to write them (created if missing).
        dir: PathBuf,
    },
    /// The configuration reference (Markdown) on stdout, from the
    /// configuration types and the example file.
    ConfigReference,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Load and check the configuration exactly as `serve` would (templates,
    /// files, relay accounts), print the effective profiles, and exit:
    /// 0 when it would start, 2 when it would not.
    Check,
    /// Print the annotated example configuration: every key, its default
    /// and when to change it (a valid configuration equal to the defaults).
    Example,
    /// Print every value in effect with where it comes from (default,
    /// file, environment variable), secrets redacted.
    Show {
        /// As JSON: a list of {key, value, source}.
        #[arg(long)]
        json: bool,
    },
}

/// Exit codes: 0 done, 1 failed or refused, 2 bad arguments or
/// configuration (clap's own usage errors are 2 as well), 3 a destructive
/// command not confirmed.
fn main() {
    let cli = Cli::parse();
    // Needs no configuration, and must work where none loads.
    if let Some(Command::Config(ConfigCommand::Example)) = &cli.command {
        print!("{}", acme_proxy::config::reference::EXAMPLE);
        return;
    }
    if let Some(Command::Generate(what)) = &cli.command {
        if let Err(e) = generate(what) {
            eprintln!("acme-proxy: {e:#}");
            std::process::exit(EXIT_FAILED);
        }
        return;
    }
    let config = match Config::load(cli.config.as_deref()) {
        Ok(c) => c,
        Err(acme_proxy::config::ConfigError::Problems(problems)) => {
            // One line each, as `config check` prints what start-up refuses.
            for p in problems {
                eprintln!("acme-proxy: configuration: {p}");
            }
            std::process::exit(EXIT_CONFIG);
        }
        Err(e) => {
            eprintln!("acme-proxy: {e}");
            std::process::exit(EXIT_CONFIG);
        }
    };
    if let Err(e) = run(cli.command.unwrap_or(Command::Serve), config, cli.config) {
        eprintln!("acme-proxy: {e:#}");
        std::process::exit(if e.is::<NotConfirmed>() {
            EXIT_NOT_CONFIRMED
        } else if e.is::<acme_proxy::server::Refused>() || e.is::<NoDatabase>() {
            // What `config check` refuses, and a command pointed at no
            // database: the configuration (or the directory) is wrong.
            EXIT_CONFIG
        } else {
            EXIT_FAILED
        });
    }
}

fn generate(what: &GenerateCommand) -> anyhow::Result<()> {
    use clap::CommandFactory;
    let (GenerateCommand::Man { dir } | GenerateCommand::Completions { dir }) = what else {
        print!("{}", acme_proxy::config::reference::markdown());
        return Ok(());
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let command = Cli::command();
    match what {
        GenerateCommand::Man { .. } => clap_mangen::generate_to(command, dir),
        GenerateCommand::ConfigReference => Ok(()),
        GenerateCommand::Completions { .. } => {
            use clap_complete::Shell;
            [Shell::Bash, Shell::Zsh, Shell::Fish]
                .into_iter()
                .try_for_each(|shell| {
                    clap_complete::generate_to(shell, &mut command.clone(), "acme-proxy", dir)
                        .map(drop)
                })
        }
    }
    .with_context(|| format!("writing into {}", dir.display()))
}

/// Variables `Config::load` set aside as Kubernetes service links.
fn ignored_environment_warning(config: &Config) -> Option<String> {
    (!config.ignored_environment.is_empty()).then(|| {
        format!(
            "ignoring {} (Kubernetes service links of a Service named acme-proxy, not settings)",
            config.ignored_environment.join(", ")
        )
    })
}

/// `file` is where the configuration came from (with the environment):
/// `serve` reads it again on SIGHUP.
fn run(command: Command, config: Config, file: Option<PathBuf>) -> anyhow::Result<()> {
    match command {
        Command::Generate(_) | Command::Config(ConfigCommand::Example) => Ok(()),
        Command::CheckConfig | Command::Config(ConfigCommand::Check) => {
            if let Some(warning) = ignored_environment_warning(&config) {
                eprintln!("acme-proxy: warning: {warning}");
            }
            match operator_runtime()?
                .block_on(acme_proxy::server::check(&config, Arc::new(SystemClock)))
            {
                Ok(profiles) => {
                    println!(
                        "configuration OK: listening on {}, database {}",
                        config.listen,
                        config.database_url_shown()
                    );
                    for line in profiles {
                        println!("  {line}");
                    }
                    Ok(())
                }
                Err(acme_proxy::server::Refused(problems)) => {
                    for p in problems {
                        eprintln!("acme-proxy: {p}");
                    }
                    std::process::exit(EXIT_CONFIG);
                }
            }
        }
        Command::Config(ConfigCommand::Show { json }) => {
            let shown = acme_proxy::config::show::show(file.as_deref())?;
            if json {
                println!("{}", serde_json::to_string_pretty(&shown)?);
            } else {
                // Sources aligned, but not after a long list.
                let width = shown
                    .iter()
                    .map(|s| s.key.len() + s.value.len())
                    .filter(|w| *w <= 60)
                    .max()
                    .unwrap_or(0);
                for s in shown {
                    let pad = (width + 2)
                        .saturating_sub(s.key.len() + s.value.len())
                        .max(2);
                    println!("{} = {}{}# {}", s.key, s.value, " ".repeat(pad), s.source);
                }
            }
            Ok(())
        }
        Command::Account(command) => {
            operator_runtime()?.block_on(cli::account::run(&config, command))
        }
        Command::Order(command) => operator_runtime()?.block_on(cli::order::run(&config, command)),
        Command::Status { json } => operator_runtime()?.block_on(cli::status::run(&config, json)),
        Command::Cert(command) => operator_runtime()?.block_on(cli::cert::run(&config, command)),
        Command::Eab(command) => operator_runtime()?.block_on(cli::eab::run(&config, command)),
        Command::Nonce(command) => operator_runtime()?.block_on(cli::nonce::run(&config, command)),
        Command::Dns(command) => operator_runtime()?.block_on(cli::dns::run(&config, command)),
        Command::Policy(command) => {
            operator_runtime()?.block_on(cli::policy::run(&config, command))
        }
        Command::Ratelimit(command) => {
            operator_runtime()?.block_on(cli::ratelimit::run(&config, command))
        }
        Command::Db(command) => operator_runtime()?.block_on(cli::db::run(&config, command)),
        Command::Admin(command) => operator_runtime()?.block_on(cli::admin::run(&config, command)),
        Command::Job(job) => operator_runtime()?.block_on(cli::job::run(&config, job)),
        Command::Audit(command) => operator_runtime()?.block_on(cli::audit::run(&config, command)),
        Command::Upstream(command) => {
            operator_runtime()?.block_on(cli::upstream::run(&config, command))
        }
        Command::Serve => {
            acme_proxy::logging::init(config.log_format);
            #[cfg(feature = "failpoints")]
            acme_proxy::arm_crash_point().map_err(anyhow::Error::msg)?;
            if let Some(warning) = ignored_environment_warning(&config) {
                tracing::warn!(
                    event = "config.environment",
                    outcome = "ignored",
                    "{warning}"
                );
            }
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .context("starting the async runtime")?;
            runtime.block_on(serve(config, file))
        }
    }
}

/// The single-threaded runtime of the operator commands (one at a time,
/// short-lived; `serve` has its own multi-threaded one).
fn operator_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

async fn serve(config: Config, file: Option<PathBuf>) -> anyhow::Result<()> {
    let grace = config.shutdown_grace;
    let data_dir = config.data_dir.clone();
    let profiles: Vec<String> = config.profiles.keys().cloned().collect();
    // Ok(self-generated?) for an embedded CA; otherwise where clients'
    // trust comes from.
    let self_generated: Vec<Result<bool, &str>> = config
        .profiles
        .values()
        .map(|p| match &p.signer {
            acme_proxy::config::SignerConfig::LocalCa(ca) => Ok(ca.ca_cert.is_none()),
            acme_proxy::config::SignerConfig::Relay(_) => {
                Err("relays to its upstream CA; clients trust the upstream's roots")
            }
            acme_proxy::config::SignerConfig::Custom(_) => {
                Err("signs with the operator's program; clients trust that PKI's roots")
            }
        })
        .collect();
    let summary = acme_proxy::admin::ops::describe_profiles(&config);
    let database = config.database_url_shown();
    let trusted_proxies: Vec<String> = config
        .trusted_proxies
        .iter()
        .map(ToString::to_string)
        .collect();
    let forwarded_header = config.forwarded_header;
    let hint_config = config.clone();
    let running = acme_proxy::server::start(config, Arc::new(SystemClock)).await?;
    // SIGHUP (`systemctl reload`): the same file and environment again.
    running.reload_from(move || Config::load(file.as_deref()).map_err(|e| e.to_string()));
    // What an operator needs in their first minute: where to point clients
    // and what to trust.
    println!("acme-proxy is listening on {}", running.addr);
    println!("  database: {database}");
    if let Some(cert) = &running.tls_cert {
        println!(
            "  TLS: https with {} (reloaded when it changes or on SIGHUP)",
            cert.display()
        );
    }
    if !trusted_proxies.is_empty() {
        println!(
            "  client addresses from {:?} behind {}",
            forwarded_header,
            trusted_proxies.join(", ")
        );
    }
    if let Some(m) = running.metrics_addr {
        println!("  metrics: http://{m}/metrics");
    }
    if let Some(url) = &running.admin_url {
        println!("  web console: {url} (operators: acme-proxy admin user create NAME)");
    }
    for at in &running.dns_addrs {
        println!("  DNS zone: {at} (UDP and TCP)");
    }
    for line in &summary {
        println!("  profile {line}");
    }
    for p in &profiles {
        println!("  ACME directory ({p}): {}", running.directory_url(p));
    }
    for (p, generated) in profiles.iter().zip(&self_generated) {
        let generated = match generated {
            Ok(generated) => generated,
            Err(how) => {
                println!("  {p} {how}");
                continue;
            }
        };
        print!(
            "  trust the CA of {p}: {}/profile/{p}/ca.pem",
            running.base_url
        );
        if *generated {
            print!(
                " (self-generated; also at {}/ca/{p}/ca.pem)",
                data_dir.display()
            );
        }
        println!();
    }
    println!(
        "  e.g. {}",
        acme_proxy::admin::ops::certbot_hint(
            &hint_config,
            &profiles[0],
            &running.directory_url(&profiles[0])
        )
    );
    wait_for_signal().await;
    tracing::info!(
        event = "server.shutdown",
        outcome = "started",
        "signal received; shutting down"
    );
    running.shutdown(grace).await;
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_and_every_option_and_argument_has_a_help_line() {
        use clap::CommandFactory;
        fn walk(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in command.get_arguments() {
                let name = arg.get_id().as_str();
                if matches!(name, "help" | "version") {
                    continue;
                }
                if arg.get_help().is_none() {
                    missing.push(format!("{path} {name}"));
                }
            }
            for sub in command.get_subcommands() {
                let sub_path = format!("{path} {}", sub.get_name());
                if sub.get_about().is_none() {
                    missing.push(format!("{sub_path} (the command)"));
                }
                walk(sub, &sub_path, missing);
            }
        }
        let mut missing = Vec::new();
        walk(&Cli::command(), "acme-proxy", &mut missing);
        assert!(missing.is_empty(), "no help line: {missing:#?}");
    }
}
