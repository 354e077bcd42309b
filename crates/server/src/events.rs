//! The notification events: a leaf that `config` (where operators
//! subscribe to them) and `notify` (which dispatches them) both import, so
//! that neither imports the other for the list.

acme_proxy_protocol::string_enum! {
    /// What a notification reports; its string is what templates, job keys
    /// and `events = [...]` in the configuration spell.
    pub enum Event {
        CertificateIssued = "certificate.issued",
        CertificateRevoked = "certificate.revoked",
        AccountCreated = "account.created",
        AccountDeactivated = "account.deactivated",
        ChallengeFailed = "challenge.failed",
        RelayAbandoned = "relay.abandoned",
    }
}
