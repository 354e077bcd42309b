-- Which revocations a CRL lists, kept without clocks. Each profile counts
-- its revocations, the count rising in the revocation's own transaction
-- (a trigger, so that every writer counts);
-- a CRL records the count it was signed with, read in the same snapshot
-- as its entries. A count above the stored CRL's means a revocation it
-- does not list, whatever the clocks of the processes that revoked and
-- signed said (replicas' clocks differ; the times are never compared).
-- Deleting expired certificates does not lower the count.
CREATE TABLE revocation_counts (
    profile  TEXT PRIMARY KEY NOT NULL,
    revoked  INTEGER NOT NULL
);
INSERT INTO revocation_counts (profile, revoked)
    SELECT profile, COUNT(*) FROM certificates WHERE revoked_at IS NOT NULL GROUP BY profile;
-- NULL: signed before counts were kept, so re-signed when next served.
ALTER TABLE crls ADD COLUMN revocations INTEGER;

-- Updates only: `db copy` inserts revoked certificates along with the
-- counts they make up.
CREATE TRIGGER certificates_count_revocations
AFTER UPDATE OF revoked_at ON certificates
WHEN OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL
BEGIN
    INSERT INTO revocation_counts (profile, revoked) VALUES (NEW.profile, 1)
        ON CONFLICT (profile) DO UPDATE SET revoked = revoked + 1;
END;
