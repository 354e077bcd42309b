-- Accounts of the acme-dns-compatible API ([dns_zone.api]): each may set
-- the TXT values of one name of the zone, its subdomain. The password is
-- kept only as an argon2id hash (a PHC string).
CREATE TABLE dns_api_accounts (
    username      TEXT PRIMARY KEY,
    password_hash TEXT NOT NULL,
    -- The one label under the zone that it may write, and that zone.
    subdomain     TEXT NOT NULL UNIQUE,
    zone          TEXT NOT NULL,
    -- JSON array of the networks (CIDR) its updates may come from; empty:
    -- anywhere.
    allow_from    TEXT NOT NULL,
    -- The EAB credential it is bound to: revoking it stops the account.
    eab_kid       TEXT,
    created_at    BIGINT NOT NULL
);
