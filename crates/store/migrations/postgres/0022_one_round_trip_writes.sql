-- Write transactions of an issuance as functions, each called by one
-- statement: one round trip to PostgreSQL where the transaction took one
-- per statement (a round trip costs the server and the database more CPU
-- than most of these statements do). Each function runs the statements
-- of the PostgreSQL transaction it replaces, in the same order, with the
-- same guards and row locks. Every statement of a PL/pgSQL function takes
-- its own snapshot under READ COMMITTED, as each statement of such a
-- transaction does: a lock is taken before the checks that rely on it,
-- exactly as there. A refusal after a write raises, so that the whole
-- statement, and everything the function wrote, is undone.
--
-- SQLSTATE AP001: the account is no longer valid with the request's key
-- (the store reads it as "the account changed"). AP002: the order left
-- processing under the finalize (the store reads it as "not completed").

-- A challenge of authorization `p_authz` became valid: the authorization
-- becomes valid until `p_valid_until`, and each pending order whose
-- authorizations are now all valid becomes ready (RFC 8555 §7.1.6). The
-- pending orders are locked first, in id order, so that two of an order's
-- authorizations validated at once queue instead of each seeing the other
-- still pending.
CREATE FUNCTION acme_validate_authorization(p_authz TEXT, p_valid_until BIGINT)
RETURNS VOID LANGUAGE plpgsql AS $$
DECLARE
    pending TEXT[];
    o TEXT;
BEGIN
    UPDATE authorizations SET status = 'valid', expires_at = p_valid_until
     WHERE id = p_authz AND status = 'pending';
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT array_agg(locked.id) INTO pending FROM (
        SELECT ord.id FROM orders ord JOIN order_authorizations oa ON oa.order_id = ord.id
         WHERE oa.authz_id = p_authz AND ord.status = 'pending'
         ORDER BY ord.id FOR NO KEY UPDATE OF ord
    ) AS locked;
    FOREACH o IN ARRAY coalesce(pending, '{}') LOOP
        UPDATE orders SET status = 'ready' WHERE id = o AND status = 'pending'
           AND NOT EXISTS (SELECT 1 FROM order_authorizations oa JOIN authorizations a ON a.id = oa.authz_id
                           WHERE oa.order_id = orders.id AND a.status <> 'valid');
    END LOOP;
END
$$;

-- Validation bypass: challenge `p_challenge` pending → valid at once, if
-- it is of a pending, unexpired authorization of the account at the
-- profile and of a type the profile offers (NULL types match nothing);
-- then the account's check, then the authorization and its orders. Returns
-- the challenge's authorization and the challenge as left, or no row when
-- the challenge did not move.
CREATE FUNCTION acme_bypass_challenge(
    p_challenge TEXT, p_now BIGINT, p_account TEXT, p_thumbprint TEXT, p_profile TEXT,
    p_type1 TEXT, p_type2 TEXT, p_type3 TEXT, p_valid_until BIGINT)
RETURNS TABLE (authz authorizations, challenge challenges) LANGUAGE plpgsql AS $$
DECLARE
    moved_authz TEXT;
BEGIN
    UPDATE challenges SET status = 'valid', validated_at = p_now
     WHERE id = p_challenge AND status = 'pending' AND type IN (p_type1, p_type2, p_type3)
       AND EXISTS (SELECT 1 FROM authorizations a WHERE a.id = challenges.authz_id
                   AND a.status = 'pending' AND a.expires_at > p_now
                   AND a.account_id = p_account AND a.profile = p_profile)
    RETURNING authz_id INTO moved_authz;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    PERFORM 1 FROM accounts
     WHERE id = p_account AND key_thumbprint = p_thumbprint AND status = 'valid' FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the account changed' USING ERRCODE = 'AP001';
    END IF;
    PERFORM acme_validate_authorization(moved_authz, p_valid_until);
    RETURN QUERY SELECT a, ch FROM challenges ch JOIN authorizations a ON a.id = ch.authz_id
                  WHERE ch.id = p_challenge;
END
$$;

-- An order finalized by a signer that answers at once: the account's
-- check, ready → processing, the certificate, processing → valid (the
-- order is never seen processing). False, nothing written, when the order
-- was not ready.
CREATE FUNCTION acme_complete_ready_order(
    p_account TEXT, p_thumbprint TEXT, p_since_ms BIGINT,
    p_id TEXT, p_profile TEXT, p_order TEXT, p_owner TEXT, p_serial TEXT, p_chain_pem TEXT,
    p_key_thumbprint TEXT, p_identifiers TEXT, p_not_before BIGINT, p_not_after BIGINT, p_now BIGINT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM accounts
     WHERE id = p_account AND key_thumbprint = p_thumbprint AND status = 'valid' FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the account changed' USING ERRCODE = 'AP001';
    END IF;
    UPDATE orders SET status = 'processing', processing_since = p_since_ms
     WHERE id = p_order AND status = 'ready';
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    -- The row is locked by the update above: neither guard below can fail
    -- today, but each is kept as the transaction has it.
    INSERT INTO certificates (id, profile, order_id, account_id, serial, chain_pem, key_thumbprint,
                              identifiers, not_before, not_after, created_at)
    SELECT p_id, p_profile, p_order, p_owner, p_serial, p_chain_pem, p_key_thumbprint,
           p_identifiers, p_not_before, p_not_after, p_now
     WHERE EXISTS (SELECT 1 FROM orders WHERE id = p_order AND status = 'processing');
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % left processing', p_order USING ERRCODE = 'AP002';
    END IF;
    UPDATE orders SET status = 'valid', certificate_id = p_id
     WHERE id = p_order AND status = 'processing';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % left processing', p_order USING ERRCODE = 'AP002';
    END IF;
    RETURN TRUE;
END
$$;
