//! The embedded authoritative DNS zone (`[dns_zone]`), asked with dig
//! (Debian's bind9-dnsutils) over UDP and TCP: what it answers for its
//! zone and outside it, records published and removed with `acme-proxy
//! dns txt` while it serves, and kept across a restart.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use crate::harness::{self, TestServer, config_file, run_cli};

const ZONE: &str = "acme.zone.test";

fn zone_table() -> String {
    format!(
        "\n[dns_zone]\nzones = [\"{ZONE}\", \"second.test\"]\nlisten = [\"127.0.0.1:0\"]\nnameservers = [\"ns1.corp.test\", \"ns2.corp.test\"]\nhostmaster = \"hostmaster.corp.test\"\nttl = \"60s\"\nnegative_ttl = \"15s\"\n"
    )
}

/// What dig said: the status, the header flags, and the records of the
/// answer and authority sections (one line each, fields split).
#[derive(Debug)]
struct Dig {
    status: String,
    flags: Vec<String>,
    answer: Vec<Vec<String>>,
    authority: Vec<Vec<String>>,
    text: String,
}

impl Dig {
    fn has_flag(&self, flag: &str) -> bool {
        self.flags.iter().any(|f| f == flag)
    }

    /// The TXT values of the answer, unquoted, in order.
    fn txt(&self) -> Vec<String> {
        self.answer
            .iter()
            .filter(|r| r.get(3).is_some_and(|t| t == "TXT"))
            .map(|r| r[4..].join(" ").trim_matches('"').to_owned())
            .collect()
    }
}

fn dig(at: SocketAddr, name: &str, qtype: &str, options: &[&str]) -> Dig {
    let out = Command::new("dig")
        .arg(format!("@{}", at.ip()))
        .args([
            "-p",
            &at.port().to_string(),
            "+norec",
            "+time=5",
            "+tries=1",
        ])
        .args(options)
        .args([name, qtype])
        .output()
        .expect("run dig");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut status = String::new();
    let mut flags = Vec::new();
    let mut answer = Vec::new();
    let mut authority = Vec::new();
    let mut section = "";
    for line in text.lines() {
        if let Some(rest) = line.split("status: ").nth(1) {
            status = rest.split(',').next().unwrap_or_default().to_owned();
        }
        if let Some(rest) = line.strip_prefix(";; flags: ") {
            flags = rest
                .split(';')
                .next()
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned)
                .collect();
        }
        if line.starts_with(";; ") && line.ends_with("SECTION:") {
            section = if line.contains("ANSWER") {
                "answer"
            } else if line.contains("AUTHORITY") {
                "authority"
            } else {
                "other"
            };
            continue;
        }
        if line.is_empty() || line.starts_with(';') {
            if line.is_empty() {
                section = "";
            }
            continue;
        }
        let fields: Vec<String> = line.split_whitespace().map(str::to_owned).collect();
        match section {
            "answer" => answer.push(fields),
            "authority" => authority.push(fields),
            _ => {}
        }
    }
    assert!(!status.is_empty(), "dig got no answer: {text}");
    Dig {
        status,
        flags,
        answer,
        authority,
        text,
    }
}

/// The SOA of a negative answer: in the authority section, for the zone,
/// its TTL the lesser of the record's and its minimum (15 s).
fn assert_negative_soa(d: &Dig) {
    assert!(d.answer.is_empty(), "{}", d.text);
    let soa = d
        .authority
        .iter()
        .find(|r| r.get(3).is_some_and(|t| t == "SOA"))
        .unwrap_or_else(|| panic!("no SOA in the authority section: {}", d.text));
    assert_eq!(soa[0], format!("{ZONE}."), "{}", d.text);
    assert_eq!(soa[1], "15", "{}", d.text);
}

fn txt(config: &Path, args: &[&str]) {
    let mut all = vec!["dns", "txt"];
    all.extend_from_slice(args);
    let out = run_cli(config, &all, &[]);
    assert_eq!(out.code, 0, "{all:?}: {}{}", out.stdout, out.stderr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_zone_answers_authoritatively_for_its_names_and_refuses_every_other() {
    if !harness::require_program("dig") {
        return;
    }
    let data = harness::tempdir();
    let toml = TestServer::config_text(data.path(), 1, None, &zone_table());
    let (_etc, config) = config_file(&toml);
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let at = server.running().dns_addrs[0];

    let challenge = format!("abc123._acme-challenge.{ZONE}");
    txt(&config, &["add", &challenge, "first-value"]);
    txt(&config, &["add", &challenge, "second-value"]);
    // Below an otherwise empty name: that name is an empty non-terminal.
    txt(&config, &["add", &format!("deep.empty.{ZONE}"), "x"]);
    // Enough values at one name that they do not fit in 512 octets.
    let big = format!("big.{ZONE}");
    for i in 0..20 {
        txt(
            &config,
            &["add", &big, &format!("{i:02}-{}", "v".repeat(40))],
        );
    }

    // SOA and NS at the apex; its serial moved on by each change (23).
    let soa = dig(at, ZONE, "SOA", &[]);
    assert_eq!(soa.status, "NOERROR", "{}", soa.text);
    assert!(soa.has_flag("aa") && !soa.has_flag("ra"), "{}", soa.text);
    assert_eq!(soa.answer.len(), 1, "{}", soa.text);
    assert_eq!(
        soa.answer[0][4..7],
        ["ns1.corp.test.", "hostmaster.corp.test.", "24"],
        "{}",
        soa.text
    );
    let ns = dig(at, ZONE, "NS", &[]);
    assert!(ns.has_flag("aa"), "{}", ns.text);
    let mut names: Vec<&str> = ns.answer.iter().map(|r| r[4].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["ns1.corp.test.", "ns2.corp.test."], "{}", ns.text);

    // Both values at a label, over UDP and over TCP, whatever the case of
    // the question (answered in the case asked).
    for options in [&[][..], &["+tcp"][..]] {
        let d = dig(at, &challenge, "TXT", options);
        assert_eq!(d.status, "NOERROR", "{}", d.text);
        assert!(d.has_flag("aa"), "{}", d.text);
        assert_eq!(d.txt(), ["first-value", "second-value"], "{}", d.text);
    }
    let shouted = challenge.to_ascii_uppercase();
    let d = dig(at, &shouted, "TXT", &[]);
    assert_eq!(d.txt(), ["first-value", "second-value"], "{}", d.text);
    assert_eq!(d.answer[0][0], format!("{shouted}."), "{}", d.text);
    assert_eq!(d.answer[0][1], "60", "{}", d.text);

    // NXDOMAIN for a name with nothing at or below it; NODATA for a type
    // a name does not hold, and for an empty non-terminal; the zone's SOA
    // with each.
    let d = dig(at, &format!("nothing.{ZONE}"), "TXT", &[]);
    assert_eq!(d.status, "NXDOMAIN", "{}", d.text);
    assert!(d.has_flag("aa"), "{}", d.text);
    assert_negative_soa(&d);
    let d = dig(at, &challenge, "A", &[]);
    assert_eq!(d.status, "NOERROR", "{}", d.text);
    assert!(d.has_flag("aa"), "{}", d.text);
    assert_negative_soa(&d);
    let d = dig(at, &format!("empty.{ZONE}"), "TXT", &[]);
    assert_eq!(d.status, "NOERROR", "{}", d.text);
    assert_negative_soa(&d);

    // Outside its zones: REFUSED, not authoritative, nothing given.
    // A label holding a dot is one label: "foo.acme" under zone.test is
    // not in acme.zone.test.
    for name in [
        "example.com",
        "zone.test",
        "notacme.zone.test",
        "foo\\.acme.zone.test",
    ] {
        let d = dig(at, name, "TXT", &[]);
        assert_eq!(d.status, "REFUSED", "{name}: {}", d.text);
        assert!(!d.has_flag("aa"), "{}", d.text);
        assert!(d.answer.is_empty() && d.authority.is_empty(), "{}", d.text);
    }
    // A label with a byte no record name has names nothing.
    let d = dig(at, &format!("a\\032b.{ZONE}"), "TXT", &[]);
    assert_eq!(d.status, "NXDOMAIN", "{}", d.text);
    assert_negative_soa(&d);
    // Only EDNS version 0 is spoken (RFC 6891 §6.1.3).
    let d = dig(at, &challenge, "TXT", &["+edns=1", "+noednsnegotiation"]);
    assert_eq!(d.status, "BADVERS", "{}", d.text);

    // A second zone is its own apex.
    let d = dig(at, "second.test", "SOA", &[]);
    assert_eq!(d.answer[0][0], "second.test.", "{}", d.text);

    // Too big for UDP without EDNS: truncated (TC); complete over TCP and
    // within EDNS's larger size.
    let d = dig(at, &big, "TXT", &["+noedns", "+ignore"]);
    assert!(d.has_flag("tc"), "{}", d.text);
    assert!(d.txt().len() < 20, "{}", d.text);
    let d = dig(at, &big, "TXT", &["+tcp"]);
    assert!(!d.has_flag("tc"), "{}", d.text);
    assert_eq!(d.txt().len(), 20, "{}", d.text);
    let d = dig(at, &big, "TXT", &["+bufsize=1232", "+ignore"]);
    assert_eq!(d.txt().len(), 20, "{}", d.text);

    // A value removed is no longer served, at once (the database is read
    // on each question).
    txt(&config, &["remove", &challenge, "first-value"]);
    let d = dig(at, &challenge, "TXT", &[]);
    assert_eq!(d.txt(), ["second-value"], "{}", d.text);

    // Kept across a restart.
    server.stop().await;
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let at = server.running().dns_addrs[0];
    let d = dig(at, &challenge, "TXT", &["+tcp"]);
    assert_eq!(d.txt(), ["second-value"], "{}", d.text);
    txt(&config, &["remove", &challenge]);
    let d = dig(at, &challenge, "TXT", &[]);
    assert_eq!(d.status, "NXDOMAIN", "{}", d.text);
    let again = run_cli(&config, &["dns", "txt", "remove", &challenge], &[]);
    assert_ne!(again.code, 0);
    assert!(again.stderr.contains("no such record"), "{}", again.stderr);

    // Every change is audited as the operator's.
    let audit = run_cli(
        &config,
        &["audit", "list", "--event", "dns.record_added"],
        &[],
    );
    assert_eq!(audit.code, 0, "{}", audit.stderr);
    assert!(audit.stdout.contains("first-value"), "{}", audit.stdout);
    server.stop().await;
}

#[test]
fn the_txt_command_refuses_names_outside_the_zone_and_values_a_txt_record_cannot_hold() {
    let data = harness::tempdir();
    let toml = TestServer::config_text(data.path(), 1, None, &zone_table());
    let (_etc, config) = config_file(&toml);
    for (args, said) in [
        (
            vec!["dns", "txt", "add", "x.example.com", "v"],
            "in none of the zones",
        ),
        (
            vec!["dns", "txt", "add", "bad name.acme.zone.test", "v"],
            "is not a DNS name",
        ),
        (
            vec!["dns", "txt", "add", "x.acme.zone.test", &"v".repeat(256)],
            "1 to 255 printable ASCII",
        ),
    ] {
        let out = run_cli(&config, &args, &[]);
        assert_ne!(out.code, 0, "{args:?}: {}", out.stdout);
        assert!(out.stderr.contains(said), "{args:?}: {}", out.stderr);
    }
    // Without [dns_zone], the command says what to add.
    let plain = TestServer::config_text(data.path(), 1, None, "");
    let (_etc2, plain) = config_file(&plain);
    let out = run_cli(&plain, &["dns", "txt", "list"], &[]);
    assert_ne!(out.code, 0);
    assert!(out.stderr.contains("no [dns_zone]"), "{}", out.stderr);
}

#[test]
fn the_cname_command_prints_one_delegation_per_name_a_wildcard_sharing_its_base_names() {
    let data = harness::tempdir();
    let toml = TestServer::config_text(data.path(), 1, None, &zone_table());
    let (_etc, config) = config_file(&toml);
    let out = run_cli(
        &config,
        &[
            "dns",
            "cname",
            "x.lab.test",
            "*.x.lab.test",
            "Host.Lab.test",
        ],
        &[],
    );
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert_eq!(
        out.stdout.lines().collect::<Vec<_>>(),
        [
            "_acme-challenge.x.lab.test. CNAME x.lab.test.acme.zone.test.",
            "_acme-challenge.host.lab.test. CNAME host.lab.test.acme.zone.test.",
        ]
    );
    let out = run_cli(&config, &["dns", "cname", "not a name"], &[]);
    assert_ne!(out.code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_address_that_cannot_be_bound_stops_start_up_with_nothing_left_serving() {
    // Another program holds the UDP port.
    let taken = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("addr").port();
    let listen = harness::own_addr();
    let data = harness::tempdir();
    let toml = TestServer::config_text(
        data.path(),
        1,
        None,
        &format!(
            "\n[dns_zone]\nzones = [\"{ZONE}\"]\nlisten = [\"127.0.0.1:{port}\"]\nnameservers = [\"ns1.corp.test\"]\n"
        ),
    )
    .replace("listen = \"127.0.0.1:0\"", &format!("listen = \"{listen}\""));
    let config = acme_proxy::config::Config::from_toml(&toml).expect("the configuration");
    let Err(err) =
        acme_proxy::server::start(config, std::sync::Arc::new(acme_proxy::clock::SystemClock))
            .await
    else {
        panic!("start-up succeeded with its DNS port taken");
    };
    let text = format!("{err:#}");
    assert!(
        text.contains(&format!("[dns_zone] listen 127.0.0.1:{port}")),
        "{text}"
    );
    // The ACME address was bound first; a failed start-up leaves nothing
    // serving it.
    assert!(
        tokio::net::TcpStream::connect(listen).await.is_err(),
        "the ACME listener outlived a failed start-up"
    );
    drop(taken);
}

/// A query for `name` (`qtype`) as DNS over TCP sends it: the message
/// after its length in two octets (RFC 1035 §4.2.2), recursion not asked.
fn tcp_query(id: u16, name: &str, qtype: u16) -> Vec<u8> {
    let mut message = id.to_be_bytes().to_vec();
    // No flags; one question.
    message.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.split('.') {
        message.push(u8::try_from(label.len()).unwrap());
        message.extend_from_slice(label.as_bytes());
    }
    message.push(0);
    message.extend_from_slice(&qtype.to_be_bytes());
    message.extend_from_slice(&1u16.to_be_bytes());
    framed(&message)
}

fn framed(message: &[u8]) -> Vec<u8> {
    let mut framed = u16::try_from(message.len()).unwrap().to_be_bytes().to_vec();
    framed.extend_from_slice(message);
    framed
}

/// The next answer on a DNS-over-TCP connection: its id, RCODE and
/// whether it is authoritative.
async fn tcp_answer(stream: &mut tokio::net::TcpStream) -> (u16, u8, bool) {
    use tokio::io::AsyncReadExt as _;
    let within = std::time::Duration::from_secs(5);
    let length = tokio::time::timeout(within, stream.read_u16())
        .await
        .expect("an answer within 5 s")
        .expect("an answer, not a closed connection");
    let mut message = vec![0; usize::from(length)];
    tokio::time::timeout(within, stream.read_exact(&mut message))
        .await
        .expect("the whole answer within 5 s")
        .unwrap();
    assert!(message[2] & 0x80 != 0, "a response: {message:?}");
    (
        u16::from_be_bytes([message[0], message[1]]),
        message[3] & 0x0f,
        message[2] & 0x04 != 0,
    )
}

/// The value of a counter of the server's metrics, 0 if not yet counted.
async fn counter(server: &TestServer, series: &str) -> u64 {
    let url = format!(
        "http://{}/metrics",
        server.running().metrics_addr.expect("a metrics listener")
    );
    let (_, _, body) = crate::flow::reqwest_get(&url).await;
    String::from_utf8_lossy(&body)
        .lines()
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0, |v| v.parse().unwrap())
}

/// hickory-server's own TCP listener accepted every connection, so one
/// client could hold the process's file descriptors. The zone's TCP side
/// is bounded per client address and in all, answers pipelined queries in
/// turn, refuses a malformed one with FORMERR and ignores a response, and
/// closes a connection that sends nothing whole for its idle time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_over_tcp_is_bounded_per_client_and_in_all_and_idle_connections_are_closed() {
    use std::time::{Duration, Instant};

    use tokio::io::AsyncWriteExt as _;

    use crate::connections::{connect_from, until_closed, wait_open_connections_on};

    let data = harness::tempdir();
    let extra = format!(
        "{}tcp_max_open = 3\ntcp_max_open_per_client = 2\ntcp_idle_timeout = \"5s\"\n\n[metrics]\nlisten = \"127.0.0.1:0\"\n",
        zone_table()
    );
    let toml = TestServer::config_text(data.path(), 1, None, &extra);
    let server = TestServer::start_in(harness::tempdir(), &toml).await;
    let at = server.running().dns_addrs[0];
    let from = |last: u8| connect_from(last, at);
    const SOA: u16 = 6;

    // Two queries in one write: both answered, in turn.
    let mut a1 = from(2).await;
    let mut two = tcp_query(1, ZONE, SOA);
    two.extend(tcp_query(2, &format!("nothing.{ZONE}"), SOA));
    let a1_sent = Instant::now();
    a1.write_all(&two).await.unwrap();
    assert_eq!(tcp_answer(&mut a1).await, (1, 0, true));
    assert_eq!(tcp_answer(&mut a1).await, (2, 3, true), "NXDOMAIN");
    let a1_answered = Instant::now();
    // A header announcing a question that is not there: FORMERR. A
    // response sent to the server: dropped, so the next answer is the
    // next query's.
    let mut a2 = from(2).await;
    a2.write_all(&framed(&[0, 9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0]))
        .await
        .unwrap();
    assert_eq!(tcp_answer(&mut a2).await, (9, 1, false), "FORMERR");
    let mut response = tcp_query(10, ZONE, SOA);
    response[4] |= 0x80;
    a2.write_all(&response).await.unwrap();
    let a2_sent = Instant::now();
    a2.write_all(&tcp_query(11, ZONE, SOA)).await.unwrap();
    assert_eq!(tcp_answer(&mut a2).await, (11, 0, true));
    let a2_answered = Instant::now();
    wait_open_connections_on(&server, "dns", 2).await;

    // A third from the same address is closed at once, unanswered.
    let mut a3 = from(2).await;
    let (answer, took) = until_closed(&mut a3, Duration::from_secs(3)).await;
    assert_eq!(answer, "");
    assert!(took < Duration::from_secs(1), "{took:?}");
    // Another address is served, up to three in all.
    let mut b1 = from(3).await;
    let b1_sent = Instant::now();
    b1.write_all(&tcp_query(20, ZONE, SOA)).await.unwrap();
    assert_eq!(tcp_answer(&mut b1).await, (20, 0, true));
    let b1_answered = Instant::now();
    let mut c1 = from(4).await;
    let (answer, took) = until_closed(&mut c1, Duration::from_secs(3)).await;
    assert_eq!(answer, "");
    assert!(took < Duration::from_secs(1), "{took:?}");
    for bound in ["max_open_per_client", "max_open"] {
        let series =
            format!("acme_proxy_connections_refused_total{{listener=\"dns\",bound=\"{bound}\"}}");
        assert_eq!(counter(&server, &series).await, 1, "{series}");
    }

    // Idle: closed once the idle time (5 s) has passed since its last
    // answer, not before: not within 5 s of its last query being sent
    // (the server's time starts after it answers), and within 8 s of the
    // answer. A query trickled in an octet every 300 ms (11 s for the
    // whole) holds its connection no longer: the time counts from the
    // previous answer, not from each octet.
    let (mut b1, mut b1_out) = b1.into_split();
    let trickled = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let trickle = tokio::spawn({
        let trickled = std::sync::Arc::clone(&trickled);
        async move {
            for octet in tcp_query(40, ZONE, SOA) {
                if b1_out.write_all(&[octet]).await.is_err() {
                    break;
                }
                trickled.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    });
    for (name, sent, answered) in [
        ("a1", a1_sent, a1_answered),
        ("a2", a2_sent, a2_answered),
        ("b1", b1_sent, b1_answered),
    ] {
        let (answer, _) = match name {
            "a1" => until_closed(&mut a1, Duration::from_secs(12)).await,
            "a2" => until_closed(&mut a2, Duration::from_secs(12)).await,
            _ => until_closed(&mut b1, Duration::from_secs(12)).await,
        };
        assert_eq!(answer, "", "{name}");
        assert!(
            sent.elapsed() >= Duration::from_secs(5) && answered.elapsed() < Duration::from_secs(8),
            "{name} closed {:?} after its last answer, not at the idle time",
            answered.elapsed()
        );
    }
    trickle.abort();
    assert!(
        trickled.load(std::sync::atomic::Ordering::Relaxed) >= 10,
        "the trickle was under way when its connection closed"
    );
    // Their places are given back.
    wait_open_connections_on(&server, "dns", 0).await;
    let mut again = from(2).await;
    again.write_all(&tcp_query(30, ZONE, SOA)).await.unwrap();
    assert_eq!(tcp_answer(&mut again).await, (30, 0, true));
    server.stop().await;
}
