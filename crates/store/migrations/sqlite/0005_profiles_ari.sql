-- Certificate profiles (draft-ietf-acme-profiles) and ACME Renewal
-- Information's `replaces` (RFC 9773 §5). Append-only: never edit once
-- released.

-- The certificate profile the order was given (its own or the default).
ALTER TABLE orders ADD COLUMN certificate_profile TEXT;
-- `replaces` as the client sent it (echoed on the order), and the
-- certificate it names.
ALTER TABLE orders ADD COLUMN replaces TEXT;
-- No foreign key: deleting an expired certificate (`order delete`) must not
-- be blocked by the order that replaced it.
ALTER TABLE orders ADD COLUMN replaces_certificate_id TEXT;
-- RFC 9773 §5: a certificate is replaced by at most one order that is not
-- invalid; a second one fails here, whatever races (`alreadyReplaced`).
CREATE UNIQUE INDEX orders_replacing ON orders (replaces_certificate_id)
    WHERE replaces_certificate_id IS NOT NULL AND status <> 'invalid';
