-- PostgreSQL's 0010 wakes the job runners of every process on a database
-- when work is queued. SQLite has no such signal: a process is woken by
-- its own enqueues and polls for the others'. Nothing changes here; the
-- version is kept so that one version means one schema on both engines.
SELECT 1;
