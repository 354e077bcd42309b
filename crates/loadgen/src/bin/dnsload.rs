//! `acme-dnsload`: one DNS question asked over and over under load (UDP,
//! one question outstanding per worker), against any server, with
//! questions per second and latency percentiles: the embedded zone beside
//! BIND answering the same zone in `scripts/bench-dns`. Loopback only: it
//! refuses any other server address, and stops after `--queries`.

use std::net::SocketAddr;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use hickory_proto::op::{Message, Query, ResponseCode};
use hickory_proto::rr::{Name, RecordType};

#[derive(Debug, Parser)]
#[command(name = "acme-dnsload", about = "DNS questions under load")]
struct Args {
    /// The server to ask (a loopback address and port).
    #[arg(long)]
    server: SocketAddr,
    /// The name asked.
    #[arg(long)]
    name: String,
    /// The type asked.
    #[arg(long, default_value = "TXT")]
    qtype: String,
    /// Questions in all.
    #[arg(long, default_value_t = 20_000)]
    queries: usize,
    /// Questions outstanding at once (one per worker).
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// A question unanswered for this long counts as an error.
    #[arg(long, default_value_t = 2000)]
    timeout_ms: u64,
    /// One JSON line instead of text.
    #[arg(long)]
    json: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !args.server.ip().is_loopback() {
        bail!("--server must be a loopback address; this is a load test");
    }
    let name = Name::from_str(&args.name).context("--name")?;
    let qtype = RecordType::from_str(&args.qtype.to_ascii_uppercase()).context("--qtype")?;
    let next = Arc::new(AtomicUsize::new(0));
    let timeout = Duration::from_millis(args.timeout_ms);
    let started = Instant::now();
    let mut workers = Vec::new();
    for worker in 0..args.concurrency.max(1) {
        let (next, name) = (Arc::clone(&next), name.clone());
        let (server, total) = (args.server, args.queries);
        workers.push(tokio::spawn(async move {
            ask(worker, server, name, qtype, total, next, timeout).await
        }));
    }
    let mut latencies = Vec::with_capacity(args.queries);
    let mut errors = 0usize;
    for w in workers {
        let (l, e) = w.await??;
        latencies.extend(l);
        errors += e;
    }
    let seconds = started.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let at = |q: f64| -> f64 {
        if latencies.is_empty() {
            return 0.0;
        }
        let i = ((latencies.len() as f64 * q).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies[i].as_secs_f64() * 1000.0
    };
    let answered = latencies.len();
    let qps = answered as f64 / seconds;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "queries": args.queries, "answered": answered, "errors": errors,
                "seconds": seconds, "qps": qps,
                "p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": at(1.0),
            })
        );
    } else {
        println!(
            "{answered} answered, {errors} errors in {seconds:.2}s: {qps:.0} q/s, p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms",
            at(0.50),
            at(0.99),
            at(1.0)
        );
    }
    Ok(())
}

/// One worker: questions until `total` have been taken, each answered
/// (NOERROR with an answer, the same id) or counted as an error.
async fn ask(
    worker: usize,
    server: SocketAddr,
    name: Name,
    qtype: RecordType,
    total: usize,
    next: Arc<AtomicUsize>,
    timeout: Duration,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let local: SocketAddr = if server.is_ipv4() {
        "127.0.0.1:0".parse()?
    } else {
        "[::1]:0".parse()?
    };
    let socket = tokio::net::UdpSocket::bind(local).await?;
    socket.connect(server).await?;
    let mut latencies = Vec::new();
    let mut errors = 0;
    let mut buf = vec![0u8; 4096];
    let mut id = (worker as u16).wrapping_mul(4099);
    while next.fetch_add(1, Ordering::Relaxed) < total {
        id = id.wrapping_add(1);
        let mut message = Message::query();
        message.metadata.id = id;
        message.add_query(Query::query(name.clone(), qtype));
        let bytes = message.to_vec()?;
        let sent = Instant::now();
        socket.send(&bytes).await?;
        // Answers to questions that timed out may still arrive: skip them.
        let answered = tokio::time::timeout(timeout, async {
            loop {
                let n = socket.recv(&mut buf).await?;
                if let Ok(answer) = Message::from_vec(&buf[..n])
                    && answer.metadata.id == id
                {
                    return Ok::<_, std::io::Error>(answer);
                }
            }
        })
        .await;
        match answered {
            Ok(Ok(answer))
                if answer.metadata.response_code == ResponseCode::NoError
                    && !answer.answers.is_empty() =>
            {
                latencies.push(sent.elapsed());
            }
            _ => errors += 1,
        }
    }
    Ok((latencies, errors))
}
