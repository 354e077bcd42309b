//! `acme-proxy admin`: the web console's users and their sessions.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::common::{Act, Table, confirm, open_reader, open_store, operator_actor};
use crate::admin::operators;
use crate::clock::{Clock, SystemClock};
use crate::config::Config;

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// The web console's users ("operators"): create, passwd, disable,
    /// enable, reset-totp, delete, list.
    #[command(subcommand)]
    User(UserCommand),
    /// The web console's logged-in sessions: list, revoke.
    #[command(subcommand)]
    Session(SessionCommand),
    /// API tokens, for scripts calling the console's JSON API: create,
    /// list, revoke.
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create an API token acting as an operator; it is printed this once
    /// (only its SHA-256 is kept).
    Create {
        /// The operator it acts as (audited as operator:NAME).
        user: String,
        /// What it is for, shown by `admin token list`.
        #[arg(long)]
        label: Option<String>,
        /// How long it is valid, at most 366 days.
        #[arg(long, default_value = "90d", value_parser = humantime::parse_duration)]
        expires: std::time::Duration,
        /// As JSON.
        #[arg(long)]
        json: bool,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// API tokens, newest first (never the tokens themselves).
    List {
        /// Only this operator's.
        #[arg(long)]
        user: Option<String>,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// Revoke an API token at once (its id from `admin token list`).
    Revoke {
        /// The token's id, from `admin token list`.
        id: String,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
}

/// Where a new password comes from: never the command line, where other
/// users see it (ps, /proc) and shells keep it.
#[derive(Debug, Args)]
pub struct PasswordFrom {
    /// Read the password from this file's first line (keep it 0600, or
    /// use a pipe); without it, the first line of standard input.
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Create an operator who can log in to the web console. Its password
    /// (at least 12 characters) comes from --password-file or stdin.
    Create {
        /// 1 to 64 of a-z, 0-9, '.', '_', '-'; audited as operator:NAME.
        name: String,
        #[command(flatten)]
        password: PasswordFrom,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Set an operator's password; every session of theirs ends.
    Passwd {
        /// The operator's name.
        name: String,
        #[command(flatten)]
        password: PasswordFrom,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Stop an operator from logging in; every session of theirs ends and
    /// their API tokens are revoked.
    Disable {
        /// The operator's name.
        name: String,
        #[command(flatten)]
        act: Act,
    },
    /// Forget an operator's TOTP authenticator and recovery codes (a lost
    /// phone); their sessions end and they enrol again at their next login.
    ResetTotp {
        /// The operator's name.
        name: String,
        #[command(flatten)]
        act: Act,
    },
    /// Let a disabled operator log in again.
    Enable {
        /// The operator's name.
        name: String,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
    /// Delete an operator with their sessions (their audit rows stay).
    Delete {
        /// The operator's name.
        name: String,
        #[command(flatten)]
        act: Act,
    },
    /// Every operator: status, TOTP, sessions.
    List {
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Logged-in sessions, newest first.
    List {
        /// Only this operator's.
        #[arg(long)]
        user: Option<String>,
        /// As JSON.
        #[arg(long)]
        json: bool,
    },
    /// End a session at once (its id from `admin session list`).
    Revoke {
        /// The session's id, from `admin session list`.
        id: String,
        /// Who is acting; defaults to operator:$USER.
        #[arg(long)]
        actor: Option<String>,
    },
}

/// The password's first line (without its line ending), from the file or
/// standard input.
fn read_password(from: &PasswordFrom) -> anyhow::Result<String> {
    let limit = (operators::MAX_PASSWORD_BYTES + 2) as u64;
    let reader: Box<dyn std::io::Read> = match &from.password_file {
        Some(path) => Box::new(
            std::fs::File::open(path)
                .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?,
        ),
        None => Box::new(std::io::stdin().lock()),
    };
    let mut line = String::new();
    std::io::BufReader::new(std::io::Read::take(reader, limit)).read_line(&mut line)?;
    let password = line.trim_end_matches(['\n', '\r']).to_owned();
    if password.is_empty() {
        anyhow::bail!(
            "no password: give it on the first line of standard input or of --password-file FILE"
        );
    }
    Ok(password)
}

pub async fn run(config: &Config, command: AdminCommand) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let now = SystemClock.unix();
    match command {
        AdminCommand::User(UserCommand::Create {
            name,
            password,
            actor,
        }) => {
            let password = read_password(&password)?;
            let store = open_store(config).await?;
            let made =
                operators::create_operator(&store, now, &name, &password, &operator_actor(actor))
                    .await;
            store.close().await;
            let made = made?;
            writeln!(out, "operator {} created", made.name)?;
        }
        AdminCommand::User(UserCommand::Passwd {
            name,
            password,
            actor,
        }) => {
            let password = read_password(&password)?;
            let store = open_store(config).await?;
            let done =
                operators::set_password(&store, now, &name, &password, &operator_actor(actor))
                    .await;
            store.close().await;
            done?;
            writeln!(
                out,
                "operator {name}: password changed; their sessions ended"
            )?;
        }
        AdminCommand::User(UserCommand::Disable { name, act }) => {
            confirm(
                act.yes,
                &format!("disable operator {name}, end their sessions and revoke their API tokens"),
            )?;
            let store = open_store(config).await?;
            let done =
                operators::set_disabled(&store, now, &name, true, &operator_actor(act.actor)).await;
            store.close().await;
            done?;
            writeln!(
                out,
                "operator {name} disabled; their sessions ended and their API tokens were revoked"
            )?;
        }
        AdminCommand::User(UserCommand::ResetTotp { name, act }) => {
            confirm(
                act.yes,
                &format!("forget the authenticator of operator {name} and end their sessions"),
            )?;
            let store = open_store(config).await?;
            let done = operators::reset_totp(&store, now, &name, &operator_actor(act.actor)).await;
            store.close().await;
            done?;
            writeln!(
                out,
                "operator {name}: authenticator forgotten; they enrol again at their next login"
            )?;
        }
        AdminCommand::User(UserCommand::Enable { name, actor }) => {
            let store = open_store(config).await?;
            let done =
                operators::set_disabled(&store, now, &name, false, &operator_actor(actor)).await;
            store.close().await;
            done?;
            writeln!(out, "operator {name} enabled")?;
        }
        AdminCommand::User(UserCommand::Delete { name, act }) => {
            confirm(act.yes, &format!("delete operator {name}"))?;
            let store = open_store(config).await?;
            let done =
                operators::delete_operator(&store, now, &name, &operator_actor(act.actor)).await;
            store.close().await;
            done?;
            writeln!(out, "operator {name} deleted")?;
        }
        AdminCommand::User(UserCommand::List { json }) => {
            let store = open_reader(config).await?;
            let list = operators::list_operators(&store).await;
            store.close().await;
            let list = list?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
                return Ok(());
            }
            let mut table =
                Table::new(&["NAME", "STATUS", "TOTP", "SESSIONS", "CREATED"]).status_column(1);
            for o in list {
                table.row(vec![
                    o.name,
                    o.status.to_owned(),
                    if o.totp { "yes" } else { "no" }.to_owned(),
                    o.sessions.to_string(),
                    o.created_at,
                ]);
            }
            table.print()?;
        }
        AdminCommand::Session(SessionCommand::List { user, json }) => {
            let store = open_reader(config).await?;
            let list = operators::list_sessions(&store, user.as_deref()).await;
            store.close().await;
            let list = list?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
                return Ok(());
            }
            let mut table = Table::new(&[
                "ID",
                "USER",
                "STAGE",
                "FROM",
                "CREATED",
                "LAST SEEN",
                "USER AGENT",
            ]);
            for s in list {
                table.row(vec![
                    s.id,
                    s.operator,
                    s.stage,
                    s.client_ip.unwrap_or_default(),
                    s.created_at,
                    s.last_seen_at,
                    s.user_agent.unwrap_or_default(),
                ]);
            }
            table.print()?;
        }
        AdminCommand::Session(SessionCommand::Revoke { id, actor }) => {
            let store = open_store(config).await?;
            let done = operators::revoke_session(&store, now, &id, &operator_actor(actor)).await;
            store.close().await;
            done?;
            writeln!(out, "session {id} revoked")?;
        }
        AdminCommand::Token(command) => token(config, now, command, &mut out).await?,
    }
    Ok(())
}

async fn token(
    config: &Config,
    now: i64,
    command: TokenCommand,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    match command {
        TokenCommand::Create {
            user,
            label,
            expires,
            json,
            actor,
        } => {
            let store = open_store(config).await?;
            let made = operators::create_token(
                &store,
                now,
                &user,
                label.as_deref(),
                expires,
                &operator_actor(actor),
            )
            .await;
            store.close().await;
            let made = made?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&made)?)?;
                return Ok(());
            }
            writeln!(out, "id:      {}", made.id)?;
            writeln!(out, "user:    {}", made.operator)?;
            writeln!(out, "expires: {}", made.expires_at)?;
            writeln!(out, "token:   {}", made.token.unwrap_or_default())?;
            writeln!(
                out,
                "the token is shown this once; send it as `Authorization: Bearer TOKEN`"
            )?;
        }
        TokenCommand::List { user, json } => {
            let store = open_reader(config).await?;
            let list = operators::list_tokens(&store, user.as_deref()).await;
            store.close().await;
            let list = list?;
            if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&list)?)?;
                return Ok(());
            }
            let mut table = Table::new(&["ID", "USER", "LABEL", "CREATED", "EXPIRES", "LAST USED"]);
            for t in list {
                table.row(vec![
                    t.id,
                    t.operator,
                    t.label.unwrap_or_default(),
                    t.created_at,
                    t.expires_at,
                    t.last_used_at.unwrap_or_default(),
                ]);
            }
            table.print()?;
        }
        TokenCommand::Revoke { id, actor } => {
            let store = open_store(config).await?;
            let done = operators::revoke_token(&store, now, &id, &operator_actor(actor)).await;
            store.close().await;
            done?;
            writeln!(out, "API token {id} revoked")?;
        }
    }
    Ok(())
}
