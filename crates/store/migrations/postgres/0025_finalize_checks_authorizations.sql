-- The finalize that completes a ready order in one statement checks there
-- what a finalize checks before it signs (RFC 8555 §7.4): the order still
-- ready and unexpired, and every one of its authorizations valid and
-- unexpired, at the certificate's time. A finalize may then sign without
-- reading the order first (one this process created moments before), and
-- one that did read it stores nothing for an authorization deactivated or
-- expired while it signed. False, nothing written, otherwise.
CREATE OR REPLACE FUNCTION acme_complete_ready_order(
    p_account TEXT, p_thumbprint TEXT,
    p_id TEXT, p_profile TEXT, p_order TEXT, p_owner TEXT, p_serial TEXT, p_chain_pem TEXT,
    p_key_thumbprint TEXT, p_identifiers TEXT, p_not_before BIGINT, p_not_after BIGINT, p_now BIGINT)
RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM accounts
     WHERE id = p_account AND key_thumbprint = p_thumbprint AND status = 'valid' FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'the account changed' USING ERRCODE = 'AP001';
    END IF;
    INSERT INTO certificates (id, profile, order_id, account_id, serial, chain_pem, key_thumbprint,
                              identifiers, not_before, not_after, created_at)
    SELECT p_id, p_profile, p_order, p_owner, p_serial, p_chain_pem, p_key_thumbprint,
           p_identifiers, p_not_before, p_not_after, p_now
     WHERE EXISTS (SELECT 1 FROM orders WHERE id = p_order AND status = 'ready' AND expires_at > p_now)
       AND NOT EXISTS (SELECT 1 FROM order_authorizations oa
                         JOIN authorizations a ON a.id = oa.authz_id
                        WHERE oa.order_id = p_order
                          AND (a.status <> 'valid' OR a.expires_at <= p_now));
    IF NOT FOUND THEN
        RETURN FALSE;
    END IF;
    -- Moved on since the insert's check (an expiry, a deactivation): the
    -- raise rolls the certificate back with the whole statement.
    UPDATE orders SET status = 'valid', certificate_id = p_id
     WHERE id = p_order AND status = 'ready';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'order % left ready', p_order USING ERRCODE = 'AP002';
    END IF;
    RETURN TRUE;
END
$$;
