//! The records of the embedded authoritative DNS zone (`[dns_zone]`): TXT
//! values under their owner names, read by every query the zone answers
//! and written by whoever publishes a challenge's value. Owner names are
//! stored in lower case without the final dot; DNS compares names without
//! regard to case (RFC 4343).

use crate::audit::insert_audit_in;
use crate::db::{Row, args};
use crate::{NewAuditRow, Result, Store, json_vec, to_json};

/// One TXT value the zone serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsRecordRow {
    pub name: String,
    pub value: String,
    pub created_at: i64,
}

/// An account of the acme-dns-compatible API: who may set the TXT values
/// of one name of the zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsAccountRow {
    pub username: String,
    /// argon2id, as a PHC string; never logged, never printed.
    pub password_hash: String,
    /// Its one label under `zone`.
    pub subdomain: String,
    pub zone: String,
    /// Networks (CIDR) its updates may come from; empty: anywhere.
    pub allow_from: Vec<String>,
    pub eab_kid: Option<String>,
    pub created_at: i64,
}

impl DnsAccountRow {
    /// The name its values are served at.
    pub fn fulldomain(&self) -> String {
        format!("{}.{}", self.subdomain, self.zone)
    }
}

/// An account to create.
#[derive(Clone, Debug)]
pub struct NewDnsAccount<'a> {
    pub username: &'a str,
    pub password_hash: &'a str,
    pub subdomain: &'a str,
    pub zone: &'a str,
    pub allow_from: &'a [String],
    pub eab_kid: Option<&'a str>,
    pub created_at: i64,
}

fn dns_account_row(row: Row<'_>) -> Result<DnsAccountRow> {
    let allow_from: String = row.get(4)?;
    Ok(DnsAccountRow {
        username: row.get(0)?,
        password_hash: row.get(1)?,
        subdomain: row.get(2)?,
        zone: row.get(3)?,
        allow_from: json_vec(&allow_from)?,
        eab_kid: row.get(5)?,
        created_at: row.get(6)?,
    })
}

impl Store {
    /// The TXT values at `name`, oldest first.
    ///
    /// The zone's reads run on SQLite's readers, not on the writer as the
    /// ACME reads by key do: any client may send queries (over UDP, from
    /// any address it claims), and a flood of them must not queue behind,
    /// or hold, the connection every ACME write waits for.
    pub async fn dns_txt(&self, name: &str) -> Result<Vec<String>> {
        self.reader()
            .await?
            .all(
                "SELECT value FROM dns_records WHERE name = ?1 ORDER BY created_at, value",
                args![name],
                |row| row.get(0),
            )
            .await
    }

    /// Whether any record lies below `name` (then `name` is an empty
    /// non-terminal: it exists, with no data of its own; RFC 8020).
    ///
    /// A suffix match scans the table; like every read of the zone, it
    /// runs on a reader ([`Store::dns_txt`]).
    pub async fn dns_has_below(&self, name: &str) -> Result<bool> {
        let suffix = format!(".{name}");
        self.reader()
            .await?
            .exists(
                "SELECT 1 FROM dns_records
                 WHERE length(name) > length(?1)
                   AND substr(name, length(name) - length(?1) + 1) = ?1
                 LIMIT 1",
                args![suffix],
            )
            .await
    }

    /// The SOA serial of `zone`: 1 until its records first change.
    pub async fn dns_serial(&self, zone: &str) -> Result<i64> {
        let serial: Option<i64> = self
            .reader()
            .await?
            .scalar(
                "SELECT serial FROM dns_zone_serials WHERE zone = ?1",
                args![zone],
            )
            .await?;
        Ok(serial.unwrap_or(1))
    }

    /// Adds a TXT value at `name` in `zone`, moving the zone's serial on
    /// and writing `audit` (an operator's change; a relay's publication is
    /// not audited, as its RFC 2136 updates are not), in one transaction.
    /// False, and nothing written, when the value is there already.
    pub async fn add_dns_txt(
        &self,
        zone: &str,
        name: &str,
        value: &str,
        now: i64,
        audit: Option<&NewAuditRow<'_>>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let added = tx
            .exec(
                "INSERT INTO dns_records (name, value, created_at) VALUES (?1, ?2, ?3)
                 ON CONFLICT (name, value) DO NOTHING",
                args![name, value, now],
            )
            .await?
            == 1;
        if !added {
            return Ok(false);
        }
        bump_serial(&mut tx, zone).await?;
        if let Some(audit) = audit {
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    /// Removes the TXT value `value` at `name` in `zone` (every value there
    /// when `None`), moving the serial on and writing `audit` when anything
    /// went; how many went.
    pub async fn remove_dns_txt(
        &self,
        zone: &str,
        name: &str,
        value: Option<&str>,
        audit: Option<&NewAuditRow<'_>>,
    ) -> Result<u64> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let removed = match value {
            Some(value) => {
                tx.exec(
                    "DELETE FROM dns_records WHERE name = ?1 AND value = ?2",
                    args![name, value],
                )
                .await?
            }
            None => {
                tx.exec("DELETE FROM dns_records WHERE name = ?1", args![name])
                    .await?
            }
        };
        if removed == 0 {
            return Ok(0);
        }
        bump_serial(&mut tx, zone).await?;
        if let Some(audit) = audit {
            insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        }
        tx.commit().await?;
        Ok(removed)
    }

    /// Every record, by name, at most `limit`.
    pub async fn dns_records(&self, limit: i64) -> Result<Vec<DnsRecordRow>> {
        self.reader()
            .await?
            .all(
                "SELECT name, value, created_at FROM dns_records
                 ORDER BY name, created_at, value LIMIT ?1",
                args![limit],
                |row| {
                    Ok(DnsRecordRow {
                        name: row.get(0)?,
                        value: row.get(1)?,
                        created_at: row.get(2)?,
                    })
                },
            )
            .await
    }
}

impl Store {
    /// Creates an API account and writes `audit`, in one transaction.
    ///
    /// With `max_accounts`, only while fewer accounts than that exist:
    /// false, and nothing written, at the limit. The count and the insert
    /// are one statement; on PostgreSQL, where registrations committing
    /// together (on any replica) would each count before the others,
    /// they also take one advisory lock in turn.
    pub async fn insert_dns_account(
        &self,
        new: &NewDnsAccount<'_>,
        max_accounts: Option<u64>,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let max = max_accounts.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
        if max.is_some() && tx.is_postgres() {
            tx.exec(
                "SELECT pg_advisory_xact_lock(hashtext('acme_proxy.dns_api_accounts.insert'))",
                &[],
            )
            .await?;
        }
        let inserted = tx
            .exec(
                "INSERT INTO dns_api_accounts
                     (username, password_hash, subdomain, zone, allow_from, eab_kid, created_at)
                 SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7
                  WHERE ?8 IS NULL OR (SELECT COUNT(*) FROM dns_api_accounts) < ?8",
                args![
                    new.username,
                    new.password_hash,
                    new.subdomain,
                    new.zone,
                    to_json(new.allow_from),
                    new.eab_kid,
                    new.created_at,
                    max
                ],
            )
            .await?;
        if inserted != 1 {
            return Ok(false);
        }
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// How many API accounts there are.
    pub async fn dns_account_count(&self) -> Result<i64> {
        Ok(self
            .reader()
            .await?
            .scalar("SELECT COUNT(*) FROM dns_api_accounts", &[])
            .await?
            .unwrap_or(0))
    }

    /// The API account `username`.
    pub async fn dns_account(&self, username: &str) -> Result<Option<DnsAccountRow>> {
        // On a reader, as the zone's reads ([`Store::dns_txt`]): any
        // client may send an update naming any user.
        self.reader()
            .await?
            .one(
                "SELECT username, password_hash, subdomain, zone, allow_from, eab_kid, created_at
                 FROM dns_api_accounts WHERE username = ?1",
                args![username],
                dns_account_row,
            )
            .await
    }

    /// Every API account, oldest first, at most `limit`.
    pub async fn dns_accounts(&self, limit: i64) -> Result<Vec<DnsAccountRow>> {
        self.reader()
            .await?
            .all(
                "SELECT username, password_hash, subdomain, zone, allow_from, eab_kid, created_at
                 FROM dns_api_accounts ORDER BY created_at, username LIMIT ?1",
                args![limit],
                dns_account_row,
            )
            .await
    }

    /// Removes the API account `username` and the values at its name,
    /// writing `audit`, in one transaction; false when there is no such
    /// account.
    pub async fn remove_dns_account(
        &self,
        username: &str,
        audit: &NewAuditRow<'_>,
    ) -> Result<bool> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        let Some((subdomain, zone)) = tx
            .one(
                "DELETE FROM dns_api_accounts WHERE username = ?1 RETURNING subdomain, zone",
                args![username],
                |row| Ok((row.get::<String>(0)?, row.get::<String>(1)?)),
            )
            .await?
        else {
            return Ok(false);
        };
        let name = format!("{subdomain}.{zone}");
        if tx
            .exec("DELETE FROM dns_records WHERE name = ?1", args![name])
            .await?
            > 0
        {
            bump_serial(&mut tx, &zone).await?;
        }
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        tx.commit().await?;
        Ok(true)
    }

    /// Sets `value` as the newest TXT value at `name` in `zone` and keeps
    /// only the one before it beside it, as acme-dns does (a name and its
    /// wildcard are validated with two values at the same name), moving
    /// the serial on and writing `audit`, in one transaction. Values of the
    /// same second are ordered by value.
    pub async fn rotate_dns_txt(
        &self,
        zone: &str,
        name: &str,
        value: &str,
        now: i64,
        audit: &NewAuditRow<'_>,
    ) -> Result<()> {
        let mut conn = self.writer().await?;
        let mut tx = conn.begin().await?;
        tx.exec(
            "INSERT INTO dns_records (name, value, created_at) VALUES (?1, ?2, ?3)
             ON CONFLICT (name, value) DO UPDATE SET created_at = excluded.created_at",
            args![name, value, now],
        )
        .await?;
        tx.exec(
            "DELETE FROM dns_records
             WHERE name = ?1 AND value <> ?2 AND value NOT IN (
                 SELECT value FROM dns_records WHERE name = ?1 AND value <> ?2
                 ORDER BY created_at DESC, value DESC LIMIT 1)",
            args![name, value],
        )
        .await?;
        bump_serial(&mut tx, zone).await?;
        insert_audit_in(&mut tx, audit, self.audit_origin).await?;
        tx.commit().await?;
        Ok(())
    }
}

/// Moves `zone`'s serial on by one (RFC 1982 arithmetic is the reader's
/// concern: it is served modulo 2^32).
async fn bump_serial(conn: &mut crate::db::Conn<'_>, zone: &str) -> Result<()> {
    conn.exec(
        "INSERT INTO dns_zone_serials (zone, serial) VALUES (?1, 2)
         ON CONFLICT (zone) DO UPDATE SET serial = dns_zone_serials.serial + 1",
        args![zone],
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use crate::test_support::TestDb;
    use crate::{AuditEvent, AuditOutcome, NewAuditRow};

    fn audit() -> NewAuditRow<'static> {
        NewAuditRow::new(
            1,
            AuditEvent::DnsRecordAdded,
            AuditOutcome::Success,
            "operator:test",
        )
    }

    #[tokio::test]
    async fn txt_values_are_added_once_removed_by_value_or_name_and_move_the_serial_on() {
        let (db, store) = TestDb::open().await;
        let zone = "acme.example.test";
        let name = "abc.acme.example.test";
        assert_eq!(store.dns_serial(zone).await.unwrap(), 1);
        assert!(
            store
                .add_dns_txt(zone, name, "one", 10, Some(&audit()))
                .await
                .unwrap()
        );
        assert!(
            store
                .add_dns_txt(zone, name, "two", 11, Some(&audit()))
                .await
                .unwrap()
        );
        // The same value again: nothing changes, the serial stays.
        assert!(
            !store
                .add_dns_txt(zone, name, "one", 12, Some(&audit()))
                .await
                .unwrap()
        );
        assert_eq!(store.dns_txt(name).await.unwrap(), ["one", "two"]);
        assert_eq!(store.dns_serial(zone).await.unwrap(), 3);
        assert_eq!(db.scalar("SELECT count(*) FROM audit_log").await, 2);

        // Empty non-terminals: every name above a record, inside the zone.
        assert!(store.dns_has_below("acme.example.test").await.unwrap());
        assert!(!store.dns_has_below(name).await.unwrap());
        assert!(!store.dns_has_below("bc.acme.example.test").await.unwrap());

        assert_eq!(
            store
                .remove_dns_txt(zone, name, Some("one"), Some(&audit()))
                .await
                .unwrap(),
            1
        );
        assert_eq!(
            store
                .remove_dns_txt(zone, name, Some("one"), Some(&audit()))
                .await
                .unwrap(),
            0
        );
        assert_eq!(store.dns_txt(name).await.unwrap(), ["two"]);
        assert_eq!(store.dns_serial(zone).await.unwrap(), 4);
        assert_eq!(
            store
                .remove_dns_txt(zone, name, None, Some(&audit()))
                .await
                .unwrap(),
            1
        );
        assert!(store.dns_txt(name).await.unwrap().is_empty());
        assert!(store.dns_records(10).await.unwrap().is_empty());
        assert_eq!(store.dns_serial(zone).await.unwrap(), 5);
        assert_eq!(db.scalar("SELECT count(*) FROM audit_log").await, 4);
        store.close().await;
    }

    #[tokio::test]
    async fn the_zones_reads_do_not_wait_for_the_writer() {
        let (_db, store) = TestDb::open().await;
        let zone = "acme.example.test";
        store
            .add_dns_txt(zone, "a.b.acme.example.test", "v", 1, None)
            .await
            .unwrap();
        // A write transaction in progress holds the writer.
        let mut writer = store.writer().await.unwrap();
        let _tx = writer.begin().await.unwrap();
        let reads = async {
            (
                store.dns_has_below("b.acme.example.test").await.unwrap(),
                store.dns_txt("a.b.acme.example.test").await.unwrap(),
                store.dns_serial(zone).await.unwrap(),
                store.dns_account("nobody").await.unwrap().is_none(),
            )
        };
        let read = tokio::time::timeout(std::time::Duration::from_secs(5), reads)
            .await
            .expect("answered while the writer is held");
        assert_eq!(read, (true, vec!["v".to_owned()], 2, true));
    }

    #[tokio::test]
    async fn an_api_account_past_the_limit_is_not_written_nor_audited() {
        let (db, store) = TestDb::open().await;
        let account = |username: &'static str, subdomain: &'static str| crate::NewDnsAccount {
            username,
            password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA",
            subdomain,
            zone: "acme.example.test",
            allow_from: &[],
            eab_kid: None,
            created_at: 5,
        };
        assert!(
            store
                .insert_dns_account(&account("u1", "s1"), Some(1), &audit())
                .await
                .unwrap()
        );
        assert!(
            !store
                .insert_dns_account(&account("u2", "s2"), Some(1), &audit())
                .await
                .unwrap()
        );
        assert!(store.dns_account("u2").await.unwrap().is_none());
        assert_eq!(db.scalar("SELECT count(*) FROM audit_log").await, 1);
        assert!(
            store
                .insert_dns_account(&account("u2", "s2"), Some(2), &audit())
                .await
                .unwrap()
        );
        assert!(
            store
                .insert_dns_account(&account("u3", "s3"), None, &audit())
                .await
                .unwrap()
        );
        assert_eq!(store.dns_account_count().await.unwrap(), 3);
        assert_eq!(db.scalar("SELECT count(*) FROM audit_log").await, 3);
        store.close().await;
    }

    #[tokio::test]
    async fn an_api_account_keeps_the_two_newest_values_at_its_name_and_takes_them_when_removed() {
        let (db, store) = TestDb::open().await;
        let zone = "acme.example.test";
        let allow = vec!["192.0.2.0/24".to_owned()];
        let account = crate::NewDnsAccount {
            username: "u1",
            password_hash: "$argon2id$v=19$m=19456,t=2,p=1$c2FsdA$aGFzaA",
            subdomain: "sub1",
            zone,
            allow_from: &allow,
            eab_kid: Some("kid-1"),
            created_at: 5,
        };
        assert!(
            store
                .insert_dns_account(&account, None, &audit())
                .await
                .unwrap()
        );
        let row = store.dns_account("u1").await.unwrap().unwrap();
        assert_eq!(row.fulldomain(), "sub1.acme.example.test");
        assert_eq!(row.allow_from, allow);
        assert_eq!(row.eab_kid.as_deref(), Some("kid-1"));
        assert!(store.dns_account("u2").await.unwrap().is_none());
        // The subdomain is one account's only.
        let twin = crate::NewDnsAccount {
            username: "u2",
            ..account.clone()
        };
        assert!(
            store
                .insert_dns_account(&twin, None, &audit())
                .await
                .is_err()
        );

        let name = row.fulldomain();
        for (value, at) in [("one", 10), ("two", 11), ("three", 12)] {
            store
                .rotate_dns_txt(zone, &name, value, at, &audit())
                .await
                .unwrap();
        }
        assert_eq!(store.dns_txt(&name).await.unwrap(), ["two", "three"]);
        // An old value again is the newest: the other one before it stays.
        store
            .rotate_dns_txt(zone, &name, "two", 13, &audit())
            .await
            .unwrap();
        assert_eq!(store.dns_txt(&name).await.unwrap(), ["three", "two"]);
        let serial = store.dns_serial(zone).await.unwrap();
        assert_eq!(serial, 5);

        assert!(store.remove_dns_account("u1", &audit()).await.unwrap());
        assert!(!store.remove_dns_account("u1", &audit()).await.unwrap());
        assert!(store.dns_txt(&name).await.unwrap().is_empty());
        assert_eq!(store.dns_serial(zone).await.unwrap(), serial + 1);
        assert!(store.dns_accounts(10).await.unwrap().is_empty());
        // One row per account change and per update.
        assert_eq!(db.scalar("SELECT count(*) FROM audit_log").await, 6);
        store.close().await;
    }
}
