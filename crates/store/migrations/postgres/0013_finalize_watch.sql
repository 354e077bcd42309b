-- When a finalize moved the order to processing (Unix milliseconds), so
-- that an order whose signer was asked by a process that then died is
-- made invalid once the signer's time limit has passed, not left
-- processing for ever. Relayed orders have their own job and leave it
-- unset.
ALTER TABLE orders ADD COLUMN processing_since BIGINT;

-- Start-up looks for processing orders without a watch; the index keeps
-- that from reading every order.
CREATE INDEX orders_processing ON orders (processing_since) WHERE status = 'processing';

-- Orders already processing without a relay were being signed by the
-- version this replaces: they are watched from now on.
UPDATE orders SET processing_since = (extract(epoch FROM now()) * 1000)::bigint
 WHERE status = 'processing' AND processing_since IS NULL
   AND NOT EXISTS (SELECT 1 FROM upstream_orders u WHERE u.order_id = orders.id);
