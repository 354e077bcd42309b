-- Rate limits ([rate_limits]): one row per limited key (a limit and whom
-- it counts, e.g. "new_orders:account:ID"), holding the generic cell rate
-- algorithm's theoretical arrival time in milliseconds, and the interval
-- (ms) between places it was last taken at: a limit changed since (an
-- override) counts the places taken at its own interval. Kept in the
-- database so that a limit holds across restarts and replicas.
CREATE TABLE rate_limits (
    key         TEXT PRIMARY KEY,
    tat         BIGINT NOT NULL,
    interval_ms BIGINT NOT NULL
);
