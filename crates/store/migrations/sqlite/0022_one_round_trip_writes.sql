-- PostgreSQL's 0022 adds functions that run three write transactions in
-- one round trip each. SQLite runs the same statements in the store's own
-- transactions on the calling thread, with no round trip to save, so its
-- schema does not change here; the version stays one schema on both.
SELECT 1;
