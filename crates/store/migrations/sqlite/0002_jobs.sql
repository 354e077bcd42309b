-- The durable job queue: jobs claimed under a lease, retried, retired.
--
-- Times here are Unix *milliseconds*: leases are seconds long and are
-- renewed several times per lease.
--
-- status:
--   queued    waiting for run_at (first attempt or a retry)
--   running   claimed by lease_owner until lease_until (renewed by heartbeat)
--   retiring  retired for good; its handler's abandon is running (or must
--             run again if the lease expires: a runner died during abandon)
--   done      finished
--   failed    retired for good after abandon ran (permanent failure,
--             attempts exhausted, deadline passed)
--   cancelled retired for good by an operator, after abandon ran
CREATE TABLE jobs (
    id                   INTEGER PRIMARY KEY AUTOINCREMENT,
    kind                 TEXT NOT NULL,
    key                  TEXT NOT NULL,
    payload              TEXT NOT NULL,
    status               TEXT NOT NULL CHECK (status IN ('queued', 'running', 'retiring', 'done', 'failed', 'cancelled')),
    attempts             INTEGER NOT NULL DEFAULT 0,
    max_attempts         INTEGER NOT NULL,
    run_at               INTEGER NOT NULL,
    deadline             INTEGER,
    lease_owner          TEXT,
    lease_until          INTEGER,
    last_error           TEXT,
    -- Set by `job cancel`; honoured by the runner that holds or next claims the job.
    cancel_requested_by  TEXT,
    created_at           INTEGER NOT NULL,
    updated_at           INTEGER NOT NULL,
    finished_at          INTEGER
);

-- (kind, key) is unique among unfinished jobs: enqueueing twice queues once.
CREATE UNIQUE INDEX jobs_live_identity ON jobs (kind, key)
    WHERE status IN ('queued', 'running', 'retiring');
-- What a runner claims: due queued jobs, and leases that ran out.
CREATE INDEX jobs_due ON jobs (status, run_at) WHERE status = 'queued';
CREATE INDEX jobs_leased ON jobs (status, lease_until) WHERE status IN ('running', 'retiring');
CREATE INDEX jobs_finished ON jobs (finished_at) WHERE finished_at IS NOT NULL;
