//! The records of the embedded authoritative DNS zone (`[dns_zone]`): TXT
//! values under their owner names, read by every query the zone answers
//! and written by whoever publishes a challenge's value. Owner names are
//! stored in lower case without the final dot; DNS compares names without
//! regard to case (RFC 4343).

use crate::audit::insert_audit_in;
use crate::db::args;
use crate::{NewAuditRow, Result, Store};

/// One TXT value the zone serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DnsRecordRow {
    pub name: String,
    pub value: String,
    pub created_at: i64,
}

impl Store {
    /// The TXT values at `name`, oldest first.
    pub async fn dns_txt(&self, name: &str) -> Result<Vec<String>> {
        self.point_reader()
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
    pub async fn dns_has_below(&self, name: &str) -> Result<bool> {
        let suffix = format!(".{name}");
        self.point_reader()
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
            .point_reader()
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
}
