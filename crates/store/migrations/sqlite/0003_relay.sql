-- The relay signer (orders relayed to an upstream ACME CA) and the audit
-- trail. Append-only: never edit once released.

-- The one upstream account of each relay profile. The key itself is a file
-- (0600) named in the configuration; only its URL and thumbprint live here,
-- so a database copy does not carry the secret.
CREATE TABLE upstream_accounts (
    profile         TEXT PRIMARY KEY NOT NULL,
    directory       TEXT NOT NULL,
    account_url     TEXT NOT NULL,
    key_thumbprint  TEXT NOT NULL,
    created_at      INTEGER NOT NULL
);

-- One local order relayed upstream: the client's CSR (DER, sent byte for
-- byte), the upstream order once created, and the context of the request
-- that finalized it (for the audit row written when the job settles).
CREATE TABLE upstream_orders (
    order_id         TEXT PRIMARY KEY NOT NULL REFERENCES orders (id),
    profile          TEXT NOT NULL,
    account_id       TEXT NOT NULL,
    csr_der          BLOB NOT NULL,
    upstream_url     TEXT,
    status           TEXT NOT NULL CHECK (status IN ('processing', 'valid', 'invalid')),
    certificate_url  TEXT,
    -- The real reason of a failure, for operators; the client sees a generic problem.
    error            TEXT,
    client_ip        TEXT,
    reverse_name     TEXT,
    user_agent       TEXT,
    request_id       TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
);
CREATE INDEX upstream_orders_processing ON upstream_orders (status) WHERE status = 'processing';

-- Insert-only audit trail. No foreign keys: a row outlives what it describes.
CREATE TABLE audit_log (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    at            INTEGER NOT NULL,
    event         TEXT NOT NULL,
    outcome       TEXT NOT NULL,
    profile       TEXT,
    -- 'account:<id>', 'operator:<name>' or 'system'.
    actor         TEXT NOT NULL,
    account_id    TEXT,
    order_id      TEXT,
    serial        TEXT,
    identifiers   TEXT,
    client_ip     TEXT,
    reverse_name  TEXT,
    user_agent    TEXT,
    request_id    TEXT,
    problem_type  TEXT,
    -- Operator-only detail (an upstream CA's own words, a script's error).
    detail        TEXT
);
CREATE INDEX audit_log_by_time ON audit_log (at);
CREATE INDEX audit_log_by_order ON audit_log (order_id) WHERE order_id IS NOT NULL;

CREATE TRIGGER audit_log_is_insert_only_update
BEFORE UPDATE ON audit_log
BEGIN
    SELECT RAISE(ABORT, 'the audit log is insert-only');
END;
