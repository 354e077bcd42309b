-- An order finalized by a signer that answers at once goes ready → valid
-- in one update, its certificate inserted first (an order is valid only
-- with its certificate): the transaction that makes it valid never rested
-- on `processing`, and the update to `processing` was one more write of
-- the order's row and every one of its indexes per issuance.

-- RFC 8555 §7.1.6 order status rules, with ready → valid for a finalize
-- that completes in its own transaction.
DROP TRIGGER orders_status_transitions ON orders;
CREATE TRIGGER orders_status_transitions
    BEFORE UPDATE OF status ON orders
    FOR EACH ROW
    WHEN (NOT (
        OLD.status = NEW.status
        OR (OLD.status = 'pending' AND NEW.status IN ('ready', 'invalid'))
        OR (OLD.status = 'ready' AND NEW.status IN ('processing', 'valid', 'invalid'))
        OR (OLD.status = 'processing' AND NEW.status IN ('valid', 'invalid', 'ready'))
    ))
    EXECUTE FUNCTION refuse_change('illegal order status transition');

-- The account's check, the certificate (only while the order is ready),
-- ready → valid. False, nothing written, when the order was not ready.
-- A finalize racing this one inserts its certificate after this one's
-- commit, or fails on `certificates.order_id`'s uniqueness: the store
-- answers that as not ready too. 0022's version took the time the order
-- went processing, which it no longer does.
DROP FUNCTION acme_complete_ready_order(
    TEXT, TEXT, BIGINT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, TEXT, BIGINT, BIGINT, BIGINT);
CREATE FUNCTION acme_complete_ready_order(
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
     WHERE EXISTS (SELECT 1 FROM orders WHERE id = p_order AND status = 'ready');
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
