-- Several upstream CAs per relay profile: an account of each, named as
-- the configuration names the upstream ('primary' unless the signer table
-- names its own), and the upstream that accepted each relayed order (set
-- when its upstream order is made or its authorizations are reserved;
-- NULL: none yet, or recorded before there could be more than one, when
-- it is the profile's preferred upstream).
ALTER TABLE upstream_accounts ADD COLUMN upstream TEXT NOT NULL DEFAULT 'primary';
ALTER TABLE upstream_accounts ALTER COLUMN upstream DROP DEFAULT;
ALTER TABLE upstream_accounts DROP CONSTRAINT upstream_accounts_pkey;
ALTER TABLE upstream_accounts ADD PRIMARY KEY (profile, upstream);

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
