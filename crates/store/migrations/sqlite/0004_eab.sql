-- External Account Binding (RFC 8555 §7.3.4). Append-only: never edit once
-- released.

-- A credential minted by `acme-proxy eab create`. The HMAC key has to be
-- here to check bindings; it is shown to the operator once, never again.
CREATE TABLE eab_credentials (
    kid         TEXT PRIMARY KEY NOT NULL,
    hmac_key    BLOB NOT NULL,
    label       TEXT,
    -- NULL: usable at any profile; otherwise only at this one.
    profile     TEXT,
    -- JSON list of lower-case name globs the credential's accounts may
    -- order; NULL: any name.
    names       TEXT,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
);

-- The credential an account registered with, for newOrder's name limits and
-- so that revoking a credential stops its accounts' new orders.
ALTER TABLE accounts ADD COLUMN eab_kid TEXT REFERENCES eab_credentials (kid);
CREATE INDEX accounts_by_eab ON accounts (eab_kid) WHERE eab_kid IS NOT NULL;
