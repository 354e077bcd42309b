-- Replay nonces shared by several processes without a write per nonce
-- issued: a nonce carries its expiry and a MAC under a key every process
-- on the database reads from here, so any of them can check one it did not
-- issue; only its use is recorded (RFC 8555 §6.5 asks that each be
-- accepted once). The table of issued nonces goes: what it held was never
-- signed, and its clients get badNonce with a fresh nonce and retry.
DROP TABLE nonces;

CREATE TABLE nonce_key (
    id   BIGINT PRIMARY KEY CHECK (id = 1),
    key  BYTEA NOT NULL
);

CREATE TABLE used_nonces (
    value       TEXT PRIMARY KEY,
    expires_at  BIGINT NOT NULL
);
CREATE INDEX used_nonces_expiry ON used_nonces (expires_at);
