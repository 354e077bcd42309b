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
