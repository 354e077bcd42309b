//! The embedded authoritative DNS server (`[dns_zone]`): zones that hold
//! only challenge records (TXT), to which the corporate DNS delegates
//! `_acme-challenge` names by CNAME, so that dns-01 needs no DNS
//! credentials. hickory-server frames UDP and truncates what does not
//! fit, and TCP is framed here (below); the answers are ours, from the database on every query, so
//! that every replica serves the same records and a restart loses none.
//!
//! It answers only for its zones (REFUSED elsewhere, no recursion), with
//! the authoritative bit, NXDOMAIN for a name with no records and none
//! below it, NODATA (NOERROR, no answer) for a type the name does not hold
//! or an empty non-terminal (RFC 8020), and the zone's SOA in every
//! negative answer, its TTL the lesser of the SOA's own and its minimum
//! (RFC 2308 §3).
//!
//! TCP is served here rather than by hickory-server, whose listener
//! accepts every connection: connections open at once are bounded in total
//! and per client address (refused at accept past either, as the ACME
//! listener's are), each closed after `tcp_idle_timeout` without a whole
//! query, and queries sent together are answered in turn, one at a time
//! (as hickory-server did; RFC 7766 §6.2.1.1 would rather have them
//! processed concurrently, which the zone's quick answers do not need).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_server::Server;
use hickory_server::proto::op::{
    Edns, Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::rdata::{NS, SOA, TXT};
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;

use hickory_server::net::NetError;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::serialize::binary::{BinDecodable as _, BinDecoder, BinEncoder};
use hickory_server::zone_handler::{MessageResponse, Queries};
use tokio::task::JoinSet;

use crate::config::{ConnectionsConfig, DnsZoneConfig};
use crate::listener::{AcceptFailures, Listener, Open};
use crate::metrics::Metrics;

/// The largest UDP answer offered to an EDNS client: the size that passes
/// without IP fragmentation on common paths (DNS Flag Day 2020).
const MAX_UDP_PAYLOAD: u16 = 1232;

/// The SOA's refresh, retry and expire: no secondary transfers this zone,
/// so they only have to be sane.
const SOA_REFRESH: i32 = 3600;
const SOA_RETRY: i32 = 600;
const SOA_EXPIRE: i32 = 86400;

/// One zone it is authoritative for.
#[derive(Debug)]
struct Zone {
    /// Lower case, no final dot: as record names are stored.
    text: String,
    name: Name,
}

/// What answers the queries.
#[derive(Debug)]
pub struct Authority {
    zones: Vec<Zone>,
    nameservers: Vec<Name>,
    hostmaster: Name,
    ttl: u32,
    negative_ttl: u32,
    store: acme_proxy_store::Store,
    metrics: Arc<Metrics>,
    in_flight: tokio::sync::Semaphore,
}

/// Questions answered at once, each with up to three reads of the
/// database; more get SERVFAIL at once.
const MAX_IN_FLIGHT: usize = 64;

/// An answer before it is framed.
struct Answer {
    code: ResponseCode,
    authoritative: bool,
    answers: Vec<Record>,
    authority: Vec<Record>,
}

impl Answer {
    fn error(code: ResponseCode) -> Answer {
        Answer {
            code,
            authoritative: false,
            answers: Vec::new(),
            authority: Vec::new(),
        }
    }
}

/// A name as configured (checked at start-up) made a DNS name.
fn fqdn(name: &str) -> Result<Name, String> {
    Name::from_ascii(format!("{}.", name.trim_end_matches('.')))
        .map_err(|e| format!("{name:?}: {e}"))
}

fn seconds(d: Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

impl Authority {
    pub fn new(
        config: &DnsZoneConfig,
        store: acme_proxy_store::Store,
        metrics: Arc<Metrics>,
    ) -> Result<Authority, String> {
        let zones = config
            .zones
            .iter()
            .map(|z| {
                let text = z.trim_end_matches('.').to_ascii_lowercase();
                Ok(Zone {
                    name: fqdn(&text)?,
                    text,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok(Authority {
            zones,
            nameservers: config
                .nameservers
                .iter()
                .map(|n| fqdn(n))
                .collect::<Result<_, _>>()?,
            hostmaster: fqdn(&config.hostmaster)?,
            ttl: seconds(config.ttl),
            negative_ttl: seconds(config.negative_ttl),
            store,
            metrics,
            in_flight: tokio::sync::Semaphore::new(MAX_IN_FLIGHT),
        })
    }

    /// The zone `name` is in, if any, label by label (a label holding a
    /// dot is one label, not two).
    fn zone_of(&self, name: &Name) -> Option<&Zone> {
        self.zones.iter().find(|z| z.name.zone_of(name))
    }

    async fn soa(&self, zone: &Zone, ttl: u32) -> Result<Record, acme_proxy_store::StoreError> {
        // Served modulo 2^32 (RFC 1982 serial arithmetic).
        let serial = self.store.dns_serial(&zone.text).await? as u32;
        let primary = self
            .nameservers
            .first()
            .cloned()
            .unwrap_or_else(|| zone.name.clone());
        Ok(Record::from_rdata(
            zone.name.clone(),
            ttl,
            RData::SOA(SOA::new(
                primary,
                self.hostmaster.clone(),
                serial,
                SOA_REFRESH,
                SOA_RETRY,
                SOA_EXPIRE,
                self.negative_ttl,
            )),
        ))
    }

    /// The answer to one query of `qtype` for `owner` (as asked, its case
    /// kept in the answer).
    async fn answer(
        &self,
        owner: &Name,
        qtype: RecordType,
    ) -> Result<Answer, acme_proxy_store::StoreError> {
        let Some(zone) = self.zone_of(owner) else {
            return Ok(Answer::error(ResponseCode::Refused));
        };
        // The name as records are stored. A label with a byte no stored
        // name has (a dot, a space, a binary byte) names nothing: no
        // database read for it.
        let Some(text) = stored_form(owner) else {
            return Ok(Answer {
                code: ResponseCode::NXDomain,
                authoritative: true,
                answers: Vec::new(),
                authority: vec![self.soa(zone, self.ttl.min(self.negative_ttl)).await?],
            });
        };
        let apex = text == zone.text;
        let mut answers = Vec::new();
        if apex && matches!(qtype, RecordType::SOA | RecordType::ANY) {
            answers.push(self.soa(zone, self.ttl).await?);
        }
        if apex && matches!(qtype, RecordType::NS | RecordType::ANY) {
            answers.extend(
                self.nameservers.iter().map(|ns| {
                    Record::from_rdata(owner.clone(), self.ttl, RData::NS(NS(ns.clone())))
                }),
            );
        }
        // The apex exists whatever it holds: its values are read only when
        // asked for.
        let values = if apex && !matches!(qtype, RecordType::TXT | RecordType::ANY) {
            Vec::new()
        } else {
            self.store.dns_txt(&text).await?
        };
        if matches!(qtype, RecordType::TXT | RecordType::ANY) {
            answers.extend(values.iter().map(|v| {
                Record::from_rdata(
                    owner.clone(),
                    self.ttl,
                    RData::TXT(TXT::new(vec![v.clone()])),
                )
            }));
        }
        let exists = apex || !values.is_empty() || self.store.dns_has_below(&text).await?;
        let code = if exists {
            ResponseCode::NoError
        } else {
            ResponseCode::NXDomain
        };
        let authority = if answers.is_empty() {
            vec![self.soa(zone, self.ttl.min(self.negative_ttl)).await?]
        } else {
            Vec::new()
        };
        Ok(Answer {
            code,
            authoritative: true,
            answers,
            authority,
        })
    }

    async fn respond(&self, request: &Request) -> (Answer, &'static str) {
        if request.metadata.message_type != MessageType::Query {
            return (Answer::error(ResponseCode::FormErr), "-");
        }
        if request.metadata.op_code != OpCode::Query {
            return (Answer::error(ResponseCode::NotImp), "-");
        }
        let Ok(info) = request.request_info() else {
            // Not exactly one question.
            return (Answer::error(ResponseCode::FormErr), "-");
        };
        if request.edns.as_ref().is_some_and(|e| e.version() > 0) {
            // RFC 6891 §6.1.3: only version 0 is spoken here.
            return (Answer::error(ResponseCode::BADVERS), "-");
        }
        let qtype = info.query.query_type();
        let label = type_label(qtype);
        if info.query.query_class() != DNSClass::IN {
            return (Answer::error(ResponseCode::Refused), label);
        }
        if matches!(qtype, RecordType::AXFR | RecordType::IXFR) {
            // Nobody transfers this zone: its records are in the database.
            return (Answer::error(ResponseCode::Refused), label);
        }
        // Bounded: each question may read the database; past the bound a
        // question is answered SERVFAIL (a resolver asks again) without.
        let Ok(_permit) = self.in_flight.try_acquire() else {
            return (Answer::error(ResponseCode::ServFail), label);
        };
        match self.answer(info.query.original().name(), qtype).await {
            Ok(answer) => (answer, label),
            Err(e) => {
                tracing::error!(event = "dns.query", outcome = "failure", error = %e, "the DNS zone could not read its records");
                (Answer::error(ResponseCode::ServFail), label)
            }
        }
    }
}

/// The metric label of a response code, as DNS tools print it.
fn rcode_label(code: ResponseCode) -> &'static str {
    match code {
        ResponseCode::NoError => "NOERROR",
        ResponseCode::NXDomain => "NXDOMAIN",
        ResponseCode::Refused => "REFUSED",
        ResponseCode::ServFail => "SERVFAIL",
        ResponseCode::FormErr => "FORMERR",
        ResponseCode::NotImp => "NOTIMP",
        ResponseCode::BADVERS => "BADVERS",
        _ => "other",
    }
}

/// The form records are stored under: the labels, lower case, joined by
/// dots, no final dot; None when a label holds a byte no stored name can
/// have (letters, digits, `-` and `_` only).
fn stored_form(name: &Name) -> Option<String> {
    let mut out = String::new();
    for label in name.iter() {
        if label.is_empty()
            || !label
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_')
        {
            return None;
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.extend(label.iter().map(|b| char::from(b.to_ascii_lowercase())));
    }
    Some(out)
}

/// The metric label of a query type: the common ones by name, the rest
/// as `other` (a client picks the type; the label set stays bounded).
fn type_label(t: RecordType) -> &'static str {
    match t {
        RecordType::TXT => "TXT",
        RecordType::SOA => "SOA",
        RecordType::NS => "NS",
        RecordType::A => "A",
        RecordType::AAAA => "AAAA",
        RecordType::CNAME => "CNAME",
        RecordType::ANY => "ANY",
        RecordType::CAA => "CAA",
        _ => "other",
    }
}

/// The UDP side's handler: the authority, shared with the TCP side.
struct Udp(Arc<Authority>);

#[async_trait::async_trait]
impl RequestHandler for Udp {
    async fn handle_request<R: ResponseHandler, T: hickory_server::net::runtime::Time>(
        &self,
        request: &Request,
        response: R,
    ) -> ResponseInfo {
        self.0.reply(request, response).await
    }
}

impl Authority {
    /// Answers `request` through `response`, over either transport.
    async fn reply<R: ResponseHandler>(&self, request: &Request, mut response: R) -> ResponseInfo {
        let (answer, qtype) = self.respond(request).await;
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.authoritative = answer.authoritative;
        metadata.recursion_available = false;
        metadata.response_code = answer.code;
        // EDNS answered in kind (RFC 6891 §7), offering at most a size that
        // is not fragmented; without it, 512 octets and the TC bit.
        let edns = request.edns.as_ref().map(|asked| {
            let mut edns = Edns::new();
            edns.set_max_payload(asked.max_payload().min(MAX_UDP_PAYLOAD));
            edns.set_version(0);
            // RFC 3225 §3: the DO bit is copied back (nothing here is signed).
            edns.set_dnssec_ok(asked.flags().dnssec_ok);
            edns
        });
        self.metrics
            .dns_queries
            .get_or_create(&vec![
                ("type", qtype.to_owned()),
                ("rcode", rcode_label(answer.code).to_owned()),
            ])
            .inc();
        let message = MessageResponseBuilder::new(&request.queries, edns.as_ref()).build(
            metadata,
            answer.answers.iter(),
            answer.authority.iter(),
            std::iter::empty(),
            std::iter::empty(),
        );
        match response.send_response(message).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(event = "dns.query", outcome = "failure", error = %e, "a DNS answer could not be sent");
                Header {
                    metadata,
                    counts: HeaderCounts::default(),
                }
                .into()
            }
        }
    }
}

/// The running DNS server.
pub struct DnsServer {
    server: Server<Udp>,
    /// Each address's TCP accept loop, which holds its connections' tasks.
    tcp: JoinSet<()>,
    /// Where it answers (UDP and TCP on each).
    pub addresses: Vec<SocketAddr>,
}

impl std::fmt::Debug for DnsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsServer")
            .field("addresses", &self.addresses)
            .finish_non_exhaustive()
    }
}

impl DnsServer {
    /// Binds every `listen` address on UDP and TCP (port 0: one port free
    /// for both, which the log line and `addresses` tell) and starts
    /// answering.
    /// `ipv6_client_prefix`: `[connections]`'s, what one client is for
    /// `tcp_max_open_per_client`.
    pub async fn start(
        config: &DnsZoneConfig,
        ipv6_client_prefix: u8,
        authority: Authority,
    ) -> Result<DnsServer, String> {
        let authority = Arc::new(authority);
        let mut server = Server::new(Udp(Arc::clone(&authority)));
        // One count of open connections for every address.
        let tcp_bounds = Arc::new(Listener {
            name: "dns",
            tls: None,
            limits: ConnectionsConfig {
                max_open: config.tcp_max_open,
                max_open_per_client: config.tcp_max_open_per_client,
                ipv6_client_prefix,
                ..ConnectionsConfig::default()
            },
            exempt: Vec::new(),
            metrics: Arc::clone(&authority.metrics),
        });
        let open = Open::new();
        let mut tcp_loops = JoinSet::new();
        let mut addresses = Vec::new();
        for &addr in &config.listen {
            let (udp, tcp) = bind_both(addr).await?;
            let bound = tcp.local_addr().map_err(|e| e.to_string())?;
            server.register_socket(udp);
            tcp_loops.spawn(serve_tcp(
                tcp,
                Arc::clone(&authority),
                Arc::clone(&tcp_bounds),
                Arc::clone(&open),
                config.tcp_idle_timeout,
            ));
            addresses.push(bound);
        }
        Ok(DnsServer {
            server,
            tcp: tcp_loops,
            addresses,
        })
    }

    /// Stops answering.
    pub async fn stop(mut self) {
        // Aborting an accept loop drops its connections' tasks with it.
        self.tcp.shutdown().await;
        if let Err(e) = self.server.shutdown_gracefully().await {
            tracing::warn!(event = "dns.stop", error = %e, "the DNS zone stopped with an error");
        }
    }
}

/// Accepts DNS-over-TCP connections on `listener` within `bounds`, each
/// served by a task of this loop's (dropped with it).
async fn serve_tcp(
    listener: tokio::net::TcpListener,
    authority: Arc<Authority>,
    bounds: Arc<Listener>,
    open: Arc<Open>,
    idle: Duration,
) {
    let mut connections = JoinSet::new();
    let mut failures = AcceptFailures::default();
    loop {
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                failures.failed(&bounds, &e).await;
                continue;
            }
        };
        let admitted = match open.admit(peer.ip(), &bounds) {
            Ok(admitted) => admitted,
            Err(bound) => {
                // Closed at once (dropped) and counted in
                // `connections_refused`; not logged line by line.
                tracing::debug!(event = "dns.connection", outcome = "refused", %peer, bound, "DNS TCP connection refused");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let authority = Arc::clone(&authority);
        connections.spawn(async move {
            let _admitted = admitted;
            serve_tcp_connection(stream, peer, &authority, idle).await;
        });
    }
}

/// One TCP connection's queries, answered in turn until the client closes
/// it, sends nothing whole for `idle`, or cannot be written to.
async fn serve_tcp_connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    authority: &Authority,
    idle: Duration,
) {
    use tokio::io::AsyncReadExt as _;
    let (mut reader, writer) = stream.into_split();
    let answer = TcpAnswer {
        writer: Arc::new(tokio::sync::Mutex::new(Some(writer))),
        idle,
    };
    loop {
        // RFC 1035 §4.2.2: each message after its length in two octets.
        // The length and the message together within `idle`, so that a
        // client sending a byte at a time holds its place no longer.
        let read = tokio::time::timeout(idle, async {
            let length = reader.read_u16().await?;
            let mut message = vec![0; usize::from(length)];
            reader.read_exact(&mut message).await?;
            Ok::<_, std::io::Error>(message)
        })
        .await;
        let Ok(Ok(message)) = read else {
            break;
        };
        // Shorter than a header: not DNS, nothing to answer.
        let Ok(header) = Header::read(&mut BinDecoder::new(&message)) else {
            break;
        };
        match Request::from_bytes(message, peer, Protocol::Tcp) {
            // A response sent to a server is dropped, not answered.
            Ok(request) if request.metadata.message_type == MessageType::Response => {}
            Ok(request) => {
                authority.reply(&request, answer.clone()).await;
            }
            // A header but no message: FORMERR (RFC 1035 §4.1.1), no
            // question echoed.
            Err(_) => {
                if let Ok(none) = Queries::read(&mut BinDecoder::new(&[]), 0) {
                    let refusal = MessageResponseBuilder::new(&none, None)
                        .error_msg(&header.metadata, ResponseCode::FormErr);
                    let _ = answer.clone().send_response(refusal).await;
                }
            }
        }
        if answer.writer.lock().await.is_none() {
            break;
        }
    }
    let _ = answer.writer.lock().await.take();
    tracing::trace!(event = "dns.connection", outcome = "closed", %peer, "DNS TCP connection closed");
}

/// Writes answers on one TCP connection, each after its length (RFC 1035
/// §4.2.2), within the connection's idle time; a write that fails or takes
/// longer ends the connection (the writer is dropped).
#[derive(Clone)]
struct TcpAnswer {
    writer: Arc<tokio::sync::Mutex<Option<tokio::net::tcp::OwnedWriteHalf>>>,
    idle: Duration,
}

#[async_trait::async_trait]
impl ResponseHandler for TcpAnswer {
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        use tokio::io::AsyncWriteExt as _;
        // Encoded on its own (name compression counts from the message's
        // first octet), then framed.
        let mut message = Vec::with_capacity(512);
        let encoded = response
            .destructive_emit(&mut BinEncoder::new(&mut message))
            .map_err(NetError::from)
            .and_then(|info| {
                u16::try_from(message.len())
                    .map(|length| (info, length))
                    .map_err(|_| NetError::from("a DNS answer longer than 65535 octets"))
            });
        let mut writer = self.writer.lock().await;
        // An answer that cannot be sent ends the connection, so that the
        // client asks again instead of waiting for it.
        let (info, length) = match encoded {
            Ok(encoded) => encoded,
            Err(e) => {
                *writer = None;
                return Err(e);
            }
        };
        let mut framed = Vec::with_capacity(2 + message.len());
        framed.extend_from_slice(&length.to_be_bytes());
        framed.extend_from_slice(&message);
        let Some(stream) = writer.as_mut() else {
            return Err(NetError::from("the DNS TCP connection is closed"));
        };
        match tokio::time::timeout(self.idle, stream.write_all(&framed)).await {
            Ok(Ok(())) => Ok(info),
            Ok(Err(e)) => {
                *writer = None;
                Err(NetError::from(e))
            }
            Err(_) => {
                *writer = None;
                Err(NetError::from(
                    "a DNS answer over TCP was not taken in time",
                ))
            }
        }
    }
}

/// A UDP socket and a TCP listener on the same address and port. For port
/// 0 the TCP port is taken first and the UDP socket asked for the same
/// one, again with a new TCP port if another program holds that UDP port.
async fn bind_both(
    addr: SocketAddr,
) -> Result<(tokio::net::UdpSocket, tokio::net::TcpListener), String> {
    let attempts = if addr.port() == 0 { 20 } else { 1 };
    let mut last = String::new();
    for _ in 0..attempts {
        let tcp = bind(addr, socket2::Type::STREAM)
            .and_then(|s| {
                s.listen(1024)?;
                tokio::net::TcpListener::from_std(s.into())
            })
            .map_err(|e| format!("[dns_zone] listen {addr} (TCP): {e}"))?;
        let bound = tcp.local_addr().map_err(|e| e.to_string())?;
        match bind(bound, socket2::Type::DGRAM)
            .and_then(|s| tokio::net::UdpSocket::from_std(s.into()))
        {
            Ok(udp) => return Ok((udp, tcp)),
            Err(e) => last = format!("[dns_zone] listen {bound} (UDP): {e}"),
        }
    }
    Err(last)
}

/// A non-blocking socket bound to `addr`; an IPv6 one is IPv6 only, so
/// that `[::]` and `0.0.0.0` can both be listed (Linux otherwise lets the
/// IPv6 wildcard take the IPv4 port too).
fn bind(addr: SocketAddr, kind: socket2::Type) -> std::io::Result<socket2::Socket> {
    let socket = socket2::Socket::new(socket2::Domain::for_address(addr), kind, None)?;
    if addr.is_ipv6() {
        socket.set_only_v6(true)?;
    }
    if kind == socket2::Type::STREAM {
        // As tokio's own TcpListener::bind does: a restart can take the
        // port while old connections linger in TIME_WAIT.
        socket.set_reuse_address(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// A TXT value holds at most this many octets in one character-string
/// (RFC 1035 §3.3); a dns-01 value is 43.
const MAX_TXT_VALUE: usize = 255;

/// An owner name for a record of the zone: lower case, no final dot,
/// labels of letters, digits, `-` and `_` (`_acme-challenge`), inside one
/// of `config`'s zones. Returns (zone, name).
pub fn record_name(config: &DnsZoneConfig, name: &str) -> Result<(String, String), String> {
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let bad = |why: &str| Err(format!("{name:?} {why}"));
    if name.is_empty() || name.len() > 253 {
        return bad("is not a DNS name (1 to 253 characters)");
    }
    for label in name.split('.') {
        if label.is_empty()
            || label.len() > 63
            || !label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
        {
            return bad("is not a DNS name: labels of 1 to 63 letters, digits, '-' or '_'");
        }
        if label.starts_with('-') || label.ends_with('-') {
            return bad("is not a DNS name: a label starts or ends with '-'");
        }
    }
    let zone = config.zones.iter().find_map(|z| {
        let z = z.trim_end_matches('.').to_ascii_lowercase();
        (name == z || name.ends_with(&format!(".{z}"))).then_some(z)
    });
    match zone {
        Some(zone) => Ok((zone, name)),
        None => Err(format!(
            "{name:?} is in none of the zones of [dns_zone] ({})",
            config.zones.join(", ")
        )),
    }
}

/// A TXT value as the zone serves it: printable ASCII, at most 255
/// octets.
pub fn txt_value(value: &str) -> Result<&str, String> {
    if value.is_empty()
        || value.len() > MAX_TXT_VALUE
        || !value.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
    {
        return Err(format!(
            "a TXT value is 1 to {MAX_TXT_VALUE} printable ASCII characters; got {} octets",
            value.len()
        ));
    }
    Ok(value)
}

/// Where the `_acme-challenge` name of `identifier` (a DNS name; a
/// wildcard's is its base name's, RFC 8555 §8.4) is delegated to in
/// `zone`: the name itself under the zone, so that the record the DNS team
/// creates reads as what it is and no two names share a target.
/// `_acme-challenge.host.example.org CNAME host.example.org.ZONE`.
pub fn delegation_target(zone: &str, identifier: &str) -> String {
    let base = identifier
        .trim_start_matches("*.")
        .trim_end_matches('.')
        .to_ascii_lowercase();
    format!("{base}.{}", zone.trim_end_matches('.').to_ascii_lowercase())
}

/// The CNAME record the corporate zone needs for `identifier`, in zone-file
/// form.
pub fn delegation_record(zone: &str, identifier: &str) -> String {
    let base = identifier
        .trim_start_matches("*.")
        .trim_end_matches('.')
        .to_ascii_lowercase();
    format!(
        "_acme-challenge.{base}. CNAME {}.",
        delegation_target(zone, identifier)
    )
}

/// The first zone of `config`: where delegated records go.
pub fn publishing_zone(config: &DnsZoneConfig) -> Option<String> {
    config
        .zones
        .first()
        .map(|z| z.trim_end_matches('.').to_ascii_lowercase())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn the_ipv4_and_ipv6_wildcards_can_both_be_listened_on_one_port() {
        if std::net::UdpSocket::bind("[::1]:0").is_err() {
            eprintln!("SKIPPED: this host has no IPv6");
            return;
        }
        let (_udp4, tcp4) = bind_both("0.0.0.0:0".parse().unwrap()).await.unwrap();
        let port = tcp4.local_addr().unwrap().port();
        let v6: SocketAddr = format!("[::]:{port}").parse().unwrap();
        let (_udp6, tcp6) = bind_both(v6).await.unwrap();
        assert_eq!(tcp6.local_addr().unwrap().port(), port);
    }

    #[test]
    fn a_name_and_its_wildcard_are_delegated_to_the_name_under_the_zone() {
        assert_eq!(
            delegation_target("acme.example.org", "Host.Example.org"),
            "host.example.org.acme.example.org"
        );
        assert_eq!(
            delegation_target("acme.example.org.", "*.x.example.org"),
            "x.example.org.acme.example.org"
        );
        assert_eq!(
            delegation_record("acme.example.org", "*.x.example.org"),
            "_acme-challenge.x.example.org. CNAME x.example.org.acme.example.org."
        );
    }
}
