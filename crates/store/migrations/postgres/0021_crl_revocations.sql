-- Which revocations a CRL lists, kept without clocks. Each profile counts
-- its revocations, the count rising in the revocation's own transaction
-- (a trigger, so that every writer counts, a replica of an older version
-- during a rolling upgrade included);
-- a CRL records the count it was signed with, read in the same snapshot
-- as its entries. A count above the stored CRL's means a revocation it
-- does not list, whatever the clocks of the processes that revoked and
-- signed said (replicas' clocks differ; the times are never compared).
-- Deleting expired certificates does not lower the count.
CREATE TABLE revocation_counts (
    profile  TEXT PRIMARY KEY,
    revoked  BIGINT NOT NULL
);
INSERT INTO revocation_counts (profile, revoked)
    SELECT profile, COUNT(*) FROM certificates WHERE revoked_at IS NOT NULL GROUP BY profile;
-- NULL: signed before counts were kept, so re-signed when next served.
ALTER TABLE crls ADD COLUMN revocations BIGINT;

CREATE FUNCTION count_revocation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO revocation_counts (profile, revoked) VALUES (NEW.profile, 1)
        ON CONFLICT (profile) DO UPDATE SET revoked = revocation_counts.revoked + 1;
    RETURN NULL;
END
$$;
-- Updates only: `db copy` inserts revoked certificates along with the
-- counts they make up.
CREATE TRIGGER certificates_count_revocations
    AFTER UPDATE OF revoked_at ON certificates
    FOR EACH ROW
    WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
    EXECUTE FUNCTION count_revocation();
