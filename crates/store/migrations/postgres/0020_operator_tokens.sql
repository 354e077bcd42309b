-- Operators' API tokens, for scripts calling the console's JSON API
-- without a browser session. Found by the SHA-256 of the token (the token
-- itself is never stored), named to operators by `id`. A token acts as
-- its operator, and not while that operator is disabled.
CREATE TABLE operator_tokens (
    id           TEXT PRIMARY KEY,
    token_hash   BYTEA NOT NULL UNIQUE,
    operator     TEXT NOT NULL REFERENCES operators (name) ON DELETE CASCADE,
    label        TEXT,
    created_at   BIGINT NOT NULL,
    expires_at   BIGINT NOT NULL,
    last_used_at BIGINT
);
CREATE INDEX operator_tokens_by_operator ON operator_tokens (operator);
