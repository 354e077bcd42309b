-- Wakes the job runners of every process on this database (LISTEN
-- acme_proxy_jobs) when a job becomes claimable: queued (new, retried,
-- rescheduled, asked to cancel) or a retiring job whose lease was given
-- back. NOTIFY is sent at commit, and once per payload per transaction.
-- Runners still poll, for due times and expired leases.
CREATE FUNCTION jobs_wake_runners() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('acme_proxy_jobs', NEW.kind);
    RETURN NULL;
END
$$;
CREATE TRIGGER jobs_wake_runners
    AFTER INSERT OR UPDATE OF status, run_at, cancel_requested_by, lease_owner ON jobs
    FOR EACH ROW
    WHEN (NEW.status = 'queued' OR (NEW.status = 'retiring' AND NEW.lease_owner IS NULL))
    EXECUTE FUNCTION jobs_wake_runners();
