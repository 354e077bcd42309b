-- PostgreSQL's 0025 makes its finalize function check the order's
-- authorizations and expiry. SQLite's finalize is the store's own
-- statements, which check the same; its schema does not change here, and
-- the version stays one schema on both.
SELECT 1;
