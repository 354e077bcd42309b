-- An order finalized by a signer that answers at once goes ready → valid
-- in one update, its certificate inserted first (as on PostgreSQL, whose
-- 0024 says why).

-- RFC 8555 §7.1.6 order status rules, as in 0007, with ready → valid.
DROP TRIGGER orders_status_transitions;
CREATE TRIGGER orders_status_transitions
BEFORE UPDATE OF status ON orders
WHEN NOT (
    OLD.status = NEW.status
    OR (OLD.status = 'pending' AND (NEW.status = 'ready' OR NEW.status = 'invalid'))
    OR (OLD.status = 'ready' AND (NEW.status = 'processing' OR NEW.status = 'valid' OR NEW.status = 'invalid'))
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
