-- The circuit breaker of each relay profile's upstream CA (named by its
-- directory URL), shared by every job and every replica: how many
-- requests in a row found the upstream down (no answer, a 5xx, a page
-- that is not ACME), and whether requests wait: 'open' holds them back
-- until retry_at (ms), then one job claims the probe ('probing', its
-- claim lapsing at retry_at) and its answer closes or opens the breaker.
CREATE TABLE upstream_breakers (
    profile       TEXT NOT NULL,
    directory     TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('closed', 'open', 'probing')),
    failures      BIGINT NOT NULL,
    since         BIGINT NOT NULL,
    retry_at      BIGINT NOT NULL,
    last_error    TEXT,
    last_error_at BIGINT,
    PRIMARY KEY (profile, directory)
);

-- The upstream authorizations a relayed order holds while it is in flight
-- (one per identifier, counted from when it is sent upstream until it
-- settles; 0 before, or when the upstream made nothing), for a profile's
-- `upstream_pending_authorizations` budget.
ALTER TABLE upstream_orders ADD COLUMN authorizations BIGINT NOT NULL DEFAULT 0;
