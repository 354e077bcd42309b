-- Fair claiming: a job may name whose work it is (a validation, the
-- account that asked for it), and a runner claims no more of one such
-- owner's jobs than the cap it is given, counting those already running,
-- so one account's stuck validations cannot take every slot of their kind.
--
-- On a new database, migration 0007 ran on this same connection, which
-- still holds the table texts as they were before 0007 edited them: ADD
-- COLUMN would splice the new column in at the old text's offset. RESET
-- makes the connection read the schema again first (harmless otherwise).
PRAGMA writable_schema = RESET;

ALTER TABLE jobs ADD COLUMN fair_key TEXT;

-- The running jobs of one (kind, fair_key), counted by every claim.
CREATE INDEX jobs_fair_running ON jobs (kind, fair_key) WHERE status = 'running';

-- An account's pending authorizations, counted at each newOrder against
-- its profile's max_pending_authorizations: a partial index holds only
-- the few rows that are pending, whatever an account's history.
CREATE INDEX authorizations_pending ON authorizations (account_id, profile) WHERE status = 'pending';
