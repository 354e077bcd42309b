-- Status checks written as chains of `=` instead of `IN` lists.
--
-- SQLite evaluates `x IN ('a', 'b', 'c')` with three or more constants by
-- filling a temporary b-tree with the list every time a statement runs
-- (OpenEphemeral in its bytecode), and a prepared statement runs it anew
-- on each execution: about 5 µs per check here, against well under one
-- for the same test as `x = 'a' OR x = 'b' OR x = 'c'`. Every insert and
-- status update of an order, an authorization or a challenge ran one or
-- two of these (a CHECK and a transition trigger): some fifteen per
-- issuance, ~3 % of the server's CPU (docs/performance.md). Lists of two
-- are compiled as comparisons already and stay as they are.
--
-- The triggers are dropped and made again. A CHECK cannot be altered in
-- place: SQLite's documented way for a change that no stored row can
-- violate (https://sqlite.org/lang_altertable.html, "Making Other Kinds Of
-- Table Schema Changes") is to edit the table's text in the schema table,
-- without copying any row. Each new CHECK accepts exactly the values the
-- old one did, so every row that passed the old passes the new. The
-- trigger statements must stay after the edits: they change the schema
-- cookie, so connections already open (another process's) read the
-- schema again. The connection running this migration keeps the old,
-- equivalent checks in memory until it closes, which the store does right
-- after migrating.

PRAGMA writable_schema = ON;

UPDATE sqlite_master
   SET sql = replace(sql,
       'CHECK (status IN (''valid'', ''deactivated'', ''revoked''))',
       'CHECK (status = ''valid'' OR status = ''deactivated'' OR status = ''revoked'')')
 WHERE type = 'table' AND name = 'accounts';

UPDATE sqlite_master
   SET sql = replace(sql,
       'CHECK (status IN (''pending'', ''ready'', ''processing'', ''valid'', ''invalid''))',
       'CHECK (status = ''pending'' OR status = ''ready'' OR status = ''processing'' OR status = ''valid'' OR status = ''invalid'')')
 WHERE type = 'table' AND name = 'orders';

UPDATE sqlite_master
   SET sql = replace(sql,
       'CHECK (status IN (''pending'', ''valid'', ''invalid'', ''deactivated'', ''expired'', ''revoked''))',
       'CHECK (status = ''pending'' OR status = ''valid'' OR status = ''invalid'' OR status = ''deactivated'' OR status = ''expired'' OR status = ''revoked'')')
 WHERE type = 'table' AND name = 'authorizations';

UPDATE sqlite_master
   SET sql = replace(sql,
       'CHECK (status IN (''pending'', ''processing'', ''valid'', ''invalid''))',
       'CHECK (status = ''pending'' OR status = ''processing'' OR status = ''valid'' OR status = ''invalid'')')
 WHERE type = 'table' AND name = 'challenges';

UPDATE sqlite_master
   SET sql = replace(sql,
       'CHECK (status IN (''queued'', ''running'', ''retiring'', ''done'', ''failed'', ''cancelled''))',
       'CHECK (status = ''queued'' OR status = ''running'' OR status = ''retiring'' OR status = ''done'' OR status = ''failed'' OR status = ''cancelled'')')
 WHERE type = 'table' AND name = 'jobs';

UPDATE sqlite_master
   SET sql = replace(sql,
       'CHECK (status IN (''processing'', ''valid'', ''invalid''))',
       'CHECK (status = ''processing'' OR status = ''valid'' OR status = ''invalid'')')
 WHERE type = 'table' AND name = 'upstream_orders';

PRAGMA writable_schema = OFF;

-- RFC 8555 §7.1.6 order status rules, as in 0001.
DROP TRIGGER orders_status_transitions;
CREATE TRIGGER orders_status_transitions
BEFORE UPDATE OF status ON orders
WHEN NOT (
    OLD.status = NEW.status
    OR (OLD.status = 'pending' AND NEW.status IN ('ready', 'invalid'))
    OR (OLD.status = 'ready' AND NEW.status IN ('processing', 'invalid'))
    OR (OLD.status = 'processing' AND (NEW.status = 'valid' OR NEW.status = 'invalid' OR NEW.status = 'ready'))
)
BEGIN
    SELECT RAISE(ABORT, 'illegal order status transition');
END;

-- Made again after the trigger above so that, as before, it runs first:
-- an order moved to valid without its certificate keeps its own message.
DROP TRIGGER orders_valid_needs_certificate;
CREATE TRIGGER orders_valid_needs_certificate
BEFORE UPDATE OF status ON orders
WHEN NEW.status = 'valid'
    AND NOT EXISTS (SELECT 1 FROM certificates WHERE order_id = NEW.id)
BEGIN
    SELECT RAISE(ABORT, 'an order cannot be valid without its certificate');
END;

-- RFC 8555 §7.1.6 authorization status rules, as in 0001.
DROP TRIGGER authorizations_status_transitions;
CREATE TRIGGER authorizations_status_transitions
BEFORE UPDATE OF status ON authorizations
WHEN NOT (
    OLD.status = NEW.status
    OR (OLD.status = 'pending' AND (NEW.status = 'valid' OR NEW.status = 'invalid' OR NEW.status = 'deactivated' OR NEW.status = 'expired'))
    OR (OLD.status = 'valid' AND (NEW.status = 'deactivated' OR NEW.status = 'expired' OR NEW.status = 'revoked'))
)
BEGIN
    SELECT RAISE(ABORT, 'illegal authorization status transition');
END;

-- RFC 8555 §7.1.6 challenge status rules, as in 0001.
DROP TRIGGER challenges_status_transitions;
CREATE TRIGGER challenges_status_transitions
BEFORE UPDATE OF status ON challenges
WHEN NOT (
    OLD.status = NEW.status
    OR (OLD.status = 'pending' AND (NEW.status = 'processing' OR NEW.status = 'valid' OR NEW.status = 'invalid'))
    OR (OLD.status = 'processing' AND NEW.status IN ('valid', 'invalid'))
)
BEGIN
    SELECT RAISE(ABORT, 'illegal challenge status transition');
END;

-- A partial index's condition is evaluated for every row written to its
-- table, so the live-job condition is a chain too. The statements that
-- rely on this index (the enqueue's ON CONFLICT target and the lookups of
-- a live job) repeat its text exactly: SQLite uses a partial index only for
-- a query whose condition contains the index's.
DROP INDEX jobs_live_identity;
CREATE UNIQUE INDEX jobs_live_identity ON jobs (kind, key)
    WHERE (status = 'queued' OR status = 'running' OR status = 'retiring');
