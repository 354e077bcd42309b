-- The web console's users (operators, not ACME accounts). A password is
-- kept only as its argon2id PHC string; a TOTP secret once enrolled
-- (RFC 6238), with the last time step accepted so that each code is
-- usable once; disabled users keep their row (and their audit trail) but
-- cannot log in.
CREATE TABLE operators (
    name                TEXT PRIMARY KEY,
    password_hash       TEXT NOT NULL,
    password_changed_at BIGINT NOT NULL,
    totp_secret         BLOB,
    totp_last_step      BIGINT,
    disabled_at         BIGINT,
    created_at          BIGINT NOT NULL
);

-- One-time recovery codes, as SHA-256 digests; a used one keeps its row.
CREATE TABLE operator_recovery_codes (
    operator  TEXT NOT NULL REFERENCES operators (name) ON DELETE CASCADE,
    code_hash BLOB NOT NULL,
    used_at   BIGINT,
    PRIMARY KEY (operator, code_hash)
);

-- Logged-in sessions, found by the SHA-256 of the cookie's token (the
-- token itself is never stored) and named to operators by `id`. The CSRF
-- token is per session. `stage`: `full` once logged in; `totp` after the
-- password while the code is still due; `enrol` while an operator whom
-- require_totp binds has yet to enrol (a TOTP secret being enrolled waits
-- in `pending_totp` until a code from it is confirmed).
CREATE TABLE operator_sessions (
    token_hash   BLOB PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    operator     TEXT NOT NULL REFERENCES operators (name) ON DELETE CASCADE,
    csrf_token   TEXT NOT NULL,
    stage        TEXT NOT NULL CHECK (stage IN ('totp', 'enrol', 'full')),
    created_at   BIGINT NOT NULL,
    last_seen_at BIGINT NOT NULL,
    client_ip    TEXT,
    user_agent   TEXT,
    pending_totp BLOB
);
CREATE INDEX operator_sessions_by_operator ON operator_sessions (operator);

-- The console's pages: orders and accounts newest first, a page at a time (keyset on
-- created_at, id), and found by one of their names.
CREATE INDEX orders_by_time ON orders (created_at, id);
CREATE INDEX accounts_by_time ON accounts (created_at, id);
CREATE INDEX authorizations_by_name ON authorizations (identifier_value);

-- The dashboard's issuances and failures per day: read from this index
-- alone, without the rows (100,000 issuances in the period: 87 ms from
-- the rows, see docs/performance.md).
CREATE INDEX audit_log_outcomes ON audit_log (at, event, outcome, profile, problem_type);
