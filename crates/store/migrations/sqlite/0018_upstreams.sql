-- Several upstream CAs per relay profile: an account of each, named as
-- the configuration names the upstream ('primary' unless the signer table
-- names its own), and the upstream that accepted each relayed order (set
-- when its upstream order is made or its authorizations are reserved;
-- NULL: none yet, or recorded before there could be more than one, when
-- it is the profile's preferred upstream).
CREATE TABLE upstream_accounts_by_upstream (
    profile         TEXT NOT NULL,
    upstream        TEXT NOT NULL,
    directory       TEXT NOT NULL,
    account_url     TEXT NOT NULL,
    key_thumbprint  TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    PRIMARY KEY (profile, upstream)
);
INSERT INTO upstream_accounts_by_upstream (profile, upstream, directory, account_url, key_thumbprint, created_at)
    SELECT profile, 'primary', directory, account_url, key_thumbprint, created_at FROM upstream_accounts;
DROP TABLE upstream_accounts;
ALTER TABLE upstream_accounts_by_upstream RENAME TO upstream_accounts;

ALTER TABLE upstream_orders ADD COLUMN upstream TEXT;

-- When the relay was about to send the upstream finalize (set before it
-- is sent): an order with it never moves to another upstream, which could
-- issue its certificate twice. Orders relayed before this migration that
-- have an upstream order count as finalized (nothing says otherwise).
ALTER TABLE upstream_orders ADD COLUMN finalize_sent_at BIGINT;
UPDATE upstream_orders SET finalize_sent_at = updated_at WHERE upstream_url IS NOT NULL;

-- The upstream an order moved away from (its `failover_after` passed
-- while that upstream was down, before its finalize was sent).
ALTER TABLE upstream_orders ADD COLUMN moved_from TEXT;
