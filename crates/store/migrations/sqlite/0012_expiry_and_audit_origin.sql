-- `cert expiring` (and any dashboard of what expires soon): live
-- certificates by expiry, and certificates by account for telling a
-- renewed certificate from one that nobody has renewed.
CREATE INDEX certificates_expiry ON certificates (not_after) WHERE revoked_at IS NULL;
CREATE INDEX certificates_by_account ON certificates (account_id);

-- Who wrote an audit row: the server, or an admin command, which has no
-- metrics endpoint of its own; servers count those rows as they find them.
ALTER TABLE audit_log ADD COLUMN origin TEXT NOT NULL DEFAULT 'server'
    CHECK (origin IN ('server', 'cli'));
CREATE INDEX audit_log_from_cli ON audit_log (id) WHERE origin = 'cli';
