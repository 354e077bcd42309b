-- PostgreSQL's 0023 adds functions for two more transactions (a
-- challenge's settling, the claim of due jobs). SQLite runs those
-- statements in the store's own transactions on the calling thread, with
-- no round trip to save, so its schema does not change here; the version
-- stays one schema on both.
SELECT 1;
