-- Two more transactions as functions, each called by one statement (see
-- 0022 for why): the settling of a validated challenge, and the claim of
-- due jobs. Each runs the statements of the transaction it replaces, in
-- the same order with the same guards; every statement takes its own
-- snapshot under READ COMMITTED, as each statement of the transaction
-- did, so a lock is taken before what relies on it.

-- A challenge's validation finished: `p_error` is NULL when it passed,
-- else the problem (JSON) it failed with. Passed: processing → valid
-- while its authorization is pending or valid (an invalid, deactivated or
-- expired one is final, RFC 8555 §7.1.6), then the authorization and its
-- orders move (acme_validate_authorization); if the authorization had
-- moved on, the challenge is invalid with `p_late` instead. Failed:
-- processing → invalid with the problem, the authorization invalid, and
-- each pending order containing it invalid with the problem. True when
-- the challenge was still processing (something moved); false, nothing
-- written, when it was not.
CREATE FUNCTION acme_settle_challenge(
    p_challenge TEXT, p_now BIGINT, p_valid_until BIGINT, p_error TEXT, p_late TEXT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
DECLARE
    moved_authz TEXT;
BEGIN
    IF p_error IS NULL THEN
        UPDATE challenges SET status = 'valid', validated_at = p_now
         WHERE id = p_challenge AND status = 'processing'
           AND (SELECT a.status FROM authorizations a WHERE a.id = challenges.authz_id)
               IN ('pending', 'valid')
        RETURNING authz_id INTO moved_authz;
        IF NOT FOUND THEN
            UPDATE challenges SET status = 'invalid', error = p_late
             WHERE id = p_challenge AND status = 'processing';
            RETURN FOUND;
        END IF;
        PERFORM acme_validate_authorization(moved_authz, p_valid_until);
        RETURN TRUE;
    END IF;
    UPDATE challenges SET status = 'invalid', error = p_error
     WHERE id = p_challenge AND status = 'processing'
    RETURNING authz_id INTO moved_authz;
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    UPDATE authorizations SET status = 'invalid' WHERE id = moved_authz AND status = 'pending';
    UPDATE orders SET status = 'invalid', error = p_error
     WHERE status = 'pending'
       AND id IN (SELECT order_id FROM order_authorizations WHERE authz_id = moved_authz);
    RETURN TRUE;
END
$$;

-- Claims due jobs (and jobs whose lease ran out) for `p_owner`, oldest
-- first within each kind: at most `p_limits` ({kind: n}, JSON) of each
-- kind, and of the jobs that name a fair_key no more than make
-- `p_per_key_cap` run at once for that (kind, key), those already running
-- on any replica counted; a cancellation or an abandon (retiring) is never
-- held back by the cap. Claims are serialised across replicas by the
-- advisory lock, taken before the claim's snapshot, so that the cap
-- counts every replica's claims. The rows picked are locked as they are
-- taken and checked again as locked (FOR UPDATE ... SKIP LOCKED: a row
-- another replica is claiming, settling or heartbeating is passed over,
-- not waited for); PostgreSQL refuses FOR UPDATE beside window functions,
-- hence the ranking in CTEs first. The due jobs and the lapsed leases are
-- read as two scans of their own partial indexes, not one bitmap scan of
-- both: a plain index scan marks the entries of the jobs that moved on as
-- dead as it passes them, where a bitmap scan visits each again, on every
-- claim, until the table is vacuumed (a busy queue leaves thousands).
CREATE FUNCTION acme_claim_jobs(
    p_owner TEXT, p_now BIGINT, p_lease_ms BIGINT, p_limits TEXT, p_per_key_cap BIGINT)
RETURNS SETOF jobs LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('acme_proxy.jobs.claim'));
    RETURN QUERY
    WITH limits AS (
         SELECT key AS kind, value::bigint AS n FROM jsonb_each_text(p_limits::jsonb)
     ),
     eligible AS (
         SELECT c.id, c.kind, c.run_at, c.fair_key, c.status, c.cancel_requested_by,
                ROW_NUMBER() OVER (PARTITION BY c.kind, c.fair_key ORDER BY c.run_at, c.id) AS key_rank
           FROM (
                SELECT j.id, j.kind, j.run_at, j.fair_key, j.status, j.cancel_requested_by
                  FROM jobs j
                 WHERE j.status = 'queued' AND (j.run_at <= p_now OR j.cancel_requested_by IS NOT NULL)
                   AND j.kind IN (SELECT l.kind FROM limits l)
                UNION ALL
                SELECT j.id, j.kind, j.run_at, j.fair_key, j.status, j.cancel_requested_by
                  FROM jobs j
                 WHERE j.status IN ('running', 'retiring') AND j.lease_until <= p_now
                   AND j.kind IN (SELECT l.kind FROM limits l)
           ) AS c
     ),
     ranked AS (
         SELECT e.id, e.kind,
                ROW_NUMBER() OVER (PARTITION BY e.kind ORDER BY e.run_at, e.id) AS kind_rank
           FROM eligible e
          WHERE e.fair_key IS NULL OR e.status = 'retiring' OR e.cancel_requested_by IS NOT NULL
             OR e.key_rank + (SELECT COUNT(*) FROM jobs r
                               WHERE r.status = 'running' AND r.kind = e.kind
                                 AND r.fair_key = e.fair_key AND r.lease_until > p_now) <= p_per_key_cap
     ),
     picked AS (
         SELECT j.id AS picked_id
           FROM jobs j
           JOIN ranked r ON r.id = j.id
           JOIN limits l ON l.kind = r.kind
          WHERE r.kind_rank <= l.n
            AND ((j.status = 'queued' AND (j.run_at <= p_now OR j.cancel_requested_by IS NOT NULL))
                 OR (j.status IN ('running', 'retiring') AND j.lease_until <= p_now))
            FOR UPDATE OF j SKIP LOCKED
     )
     UPDATE jobs SET
         status = CASE WHEN jobs.status = 'retiring' THEN 'retiring' ELSE 'running' END,
         attempts = CASE WHEN jobs.status = 'retiring' OR jobs.cancel_requested_by IS NOT NULL
                         THEN jobs.attempts ELSE jobs.attempts + 1 END,
         lease_owner = p_owner, lease_until = p_now + p_lease_ms, updated_at = p_now
       FROM picked
      WHERE jobs.id = picked_id
     RETURNING jobs.*;
END
$$;
