-- acme-proxy core schema (SQLite). Append-only: never edit a released
-- migration; add a new file instead.
--
-- Times are Unix seconds (UTC). Identifiers of ACME objects are random,
-- URL-safe strings chosen by the server.

CREATE TABLE accounts (
    id              TEXT PRIMARY KEY NOT NULL,
    profile         TEXT NOT NULL,
    -- RFC 7638 thumbprint, base64url: the account's identity at its profile.
    key_thumbprint  TEXT NOT NULL,
    jwk             TEXT NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('valid', 'deactivated', 'revoked')),
    contact         TEXT NOT NULL DEFAULT '[]',
    tos_agreed      INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL,
    -- The same key at two profiles is two accounts (profiles never cross).
    UNIQUE (profile, key_thumbprint)
);

CREATE TABLE orders (
    id              TEXT PRIMARY KEY NOT NULL,
    profile         TEXT NOT NULL,
    account_id      TEXT NOT NULL REFERENCES accounts (id),
    status          TEXT NOT NULL CHECK (status IN ('pending', 'ready', 'processing', 'valid', 'invalid')),
    identifiers     TEXT NOT NULL,
    not_before      INTEGER,
    not_after       INTEGER,
    expires_at      INTEGER NOT NULL,
    error           TEXT,
    created_at      INTEGER NOT NULL
);
CREATE INDEX orders_by_account ON orders (account_id, created_at, id);

CREATE TABLE authorizations (
    id                TEXT PRIMARY KEY NOT NULL,
    profile           TEXT NOT NULL,
    account_id        TEXT NOT NULL REFERENCES accounts (id),
    identifier_type   TEXT NOT NULL,
    identifier_value  TEXT NOT NULL,
    wildcard          INTEGER NOT NULL DEFAULT 0,
    status            TEXT NOT NULL CHECK (status IN ('pending', 'valid', 'invalid', 'deactivated', 'expired', 'revoked')),
    expires_at        INTEGER NOT NULL,
    created_at        INTEGER NOT NULL
);
CREATE INDEX authorizations_by_account ON authorizations (account_id, identifier_type, identifier_value, status);

CREATE TABLE order_authorizations (
    order_id   TEXT NOT NULL REFERENCES orders (id),
    authz_id   TEXT NOT NULL REFERENCES authorizations (id),
    position   INTEGER NOT NULL,
    PRIMARY KEY (order_id, authz_id)
);
CREATE INDEX order_authorizations_by_authz ON order_authorizations (authz_id);

CREATE TABLE challenges (
    id            TEXT PRIMARY KEY NOT NULL,
    authz_id      TEXT NOT NULL REFERENCES authorizations (id),
    type          TEXT NOT NULL,
    token         TEXT NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'valid', 'invalid')),
    validated_at  INTEGER,
    error         TEXT
);
CREATE INDEX challenges_by_authz ON challenges (authz_id);
CREATE INDEX challenges_processing ON challenges (status) WHERE status = 'processing';

CREATE TABLE certificates (
    id                 TEXT PRIMARY KEY NOT NULL,
    profile            TEXT NOT NULL,
    -- UNIQUE: one order yields at most one certificate, whatever races.
    order_id           TEXT NOT NULL UNIQUE REFERENCES orders (id),
    account_id         TEXT NOT NULL REFERENCES accounts (id),
    serial             TEXT NOT NULL UNIQUE,
    chain_pem          TEXT NOT NULL,
    -- RFC 7638 thumbprint of the leaf's key, for revocation signed by it (§7.6).
    key_thumbprint     TEXT,
    identifiers        TEXT NOT NULL,
    not_before         INTEGER NOT NULL,
    not_after          INTEGER NOT NULL,
    revoked_at         INTEGER,
    revocation_reason  INTEGER,
    created_at         INTEGER NOT NULL
);
CREATE INDEX certificates_revoked ON certificates (profile, revoked_at) WHERE revoked_at IS NOT NULL;

CREATE TABLE nonces (
    value       TEXT PRIMARY KEY NOT NULL,
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;

CREATE TABLE crls (
    profile      TEXT PRIMARY KEY NOT NULL,
    number       INTEGER NOT NULL,
    this_update  INTEGER NOT NULL,
    next_update  INTEGER NOT NULL,
    der          BLOB NOT NULL
);

-- RFC 8555 §7.1.6 order status rules, enforced by the database as well as
-- the authority: a bug in the code cannot move an order backwards.
CREATE TRIGGER orders_status_transitions
BEFORE UPDATE OF status ON orders
WHEN NOT (
    OLD.status = NEW.status
    OR (OLD.status = 'pending' AND NEW.status IN ('ready', 'invalid'))
    OR (OLD.status = 'ready' AND NEW.status IN ('processing', 'invalid'))
    OR (OLD.status = 'processing' AND NEW.status IN ('valid', 'invalid', 'ready'))
)
BEGIN
    SELECT RAISE(ABORT, 'illegal order status transition');
END;

-- An order is valid only once its certificate exists.
CREATE TRIGGER orders_valid_needs_certificate
BEFORE UPDATE OF status ON orders
WHEN NEW.status = 'valid'
    AND NOT EXISTS (SELECT 1 FROM certificates WHERE order_id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'an order cannot be valid without its certificate');
END;

-- RFC 8555 §7.1.6 authorization status rules.
CREATE TRIGGER authorizations_status_transitions
BEFORE UPDATE OF status ON authorizations
WHEN NOT (
    OLD.status = NEW.status
    OR (OLD.status = 'pending' AND NEW.status IN ('valid', 'invalid', 'deactivated', 'expired'))
    OR (OLD.status = 'valid' AND NEW.status IN ('deactivated', 'expired', 'revoked'))
)
BEGIN
    SELECT RAISE(ABORT, 'illegal authorization status transition');
END;

-- RFC 8555 §7.1.6 challenge status rules.
CREATE TRIGGER challenges_status_transitions
BEFORE UPDATE OF status ON challenges
WHEN NOT (
    OLD.status = NEW.status
    OR (OLD.status = 'pending' AND NEW.status IN ('processing', 'valid', 'invalid'))
    OR (OLD.status = 'processing' AND NEW.status IN ('valid', 'invalid'))
)
BEGIN
    SELECT RAISE(ABORT, 'illegal challenge status transition');
END;
