//! `db copy`: every row of a SQLite database into an empty PostgreSQL one,
//! for an installation moving to replicas.
//!
//! - **One snapshot.** The rows are read in one SQLite read transaction
//!   (WAL: a server writing meanwhile changes nothing that is read), on a
//!   connection of the copy's own, on a thread of its own that streams
//!   them in batches; they are written in one PostgreSQL transaction, so a
//!   copy that fails leaves the target as empty as it was.
//! - **Typed by the target.** Each value is converted to the type of its
//!   PostgreSQL column (SQLite keeps booleans as integers); a value that
//!   does not fit stops the copy naming the table and column.
//! - **Verified before commit.** Each table's rows are counted and digested
//!   as read (the SHA-256 of each row's values, summed lane-wise so that row
//!   order does not matter), then read back from the target inside the
//!   transaction and counted and digested again; any difference rolls the
//!   copy back.
//! - **Identity sequences** (job and audit ids, challenge order) are moved
//!   past the copied values, so new rows get new ids.
//! - **Analyzed.** The copied tables' planner statistics are gathered in
//!   the same transaction.

use std::collections::{BTreeMap, BTreeSet};

use rusqlite::types::ValueRef;
use sqlx::Row as _;

use crate::{Result, Store, StoreError};

/// Every table of the schema, parents before children (the foreign keys),
/// so that rows can be inserted in this order. A table the schema has and
/// this list lacks stops the copy: it would otherwise be left behind.
const TABLES: &[&str] = &[
    "eab_credentials",
    "accounts",
    "orders",
    "authorizations",
    "order_authorizations",
    "challenges",
    "certificates",
    "crls",
    "crl_numbers",
    "revocation_counts",
    "jobs",
    "upstream_accounts",
    "upstream_orders",
    "audit_log",
    "nonce_key",
    "used_nonces",
    "dns_records",
    "dns_zone_serials",
    "dns_api_accounts",
    "rate_limits",
    "upstream_breakers",
    "operators",
    "operator_recovery_codes",
    "operator_sessions",
    "operator_tokens",
];

/// Rows per batch sent from the reading thread and per `INSERT`.
const BATCH_ROWS: usize = 500;
/// PostgreSQL's limit on one statement's parameters.
const MAX_PARAMETERS: usize = 65_535;

/// What was copied of one table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableCopy {
    pub table: &'static str,
    pub rows: u64,
    /// The digest of its rows (hex), equal at the source and the target.
    pub digest: String,
}

/// The type of a target column, as the copy reads and writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int,
    Bool,
    Text,
    Bytes,
}

impl Kind {
    /// The kind of a PostgreSQL `information_schema` data type.
    fn of(table: &str, column: &str, data_type: &str) -> Result<Kind> {
        Ok(match data_type {
            "bigint" | "integer" | "smallint" => Kind::Int,
            "boolean" => Kind::Bool,
            "text" | "character varying" => Kind::Text,
            "bytea" => Kind::Bytes,
            other => {
                return Err(StoreError::Corrupt(format!(
                    "{table}.{column} is of type {other}, which db copy does not know"
                )));
            }
        })
    }

    /// The cast that makes a parameter or a read value this kind.
    fn cast(self) -> &'static str {
        match self {
            Kind::Int => "int8",
            Kind::Bool => "bool",
            Kind::Text => "text",
            Kind::Bytes => "bytea",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Value {
    Null,
    Int(i64),
    Bool(bool),
    Text(String),
    Bytes(Vec<u8>),
}

impl Value {
    /// A SQLite value as a value of `kind`, or why it is not one.
    fn from_sqlite(value: ValueRef<'_>, kind: Kind) -> std::result::Result<Value, String> {
        let text = |b: &[u8]| {
            String::from_utf8(b.to_vec()).map_err(|_| "text that is not UTF-8".to_owned())
        };
        Ok(match (kind, value) {
            (_, ValueRef::Null) => Value::Null,
            (Kind::Int, ValueRef::Integer(i)) => Value::Int(i),
            (Kind::Int, ValueRef::Text(t)) => Value::Int(
                std::str::from_utf8(t)
                    .ok()
                    .and_then(|t| t.parse().ok())
                    .ok_or_else(|| format!("{:?}, not an integer", String::from_utf8_lossy(t)))?,
            ),
            (Kind::Bool, ValueRef::Integer(i)) => Value::Bool(i != 0),
            (Kind::Text, ValueRef::Text(t) | ValueRef::Blob(t)) => Value::Text(text(t)?),
            (Kind::Text, ValueRef::Integer(i)) => Value::Text(i.to_string()),
            (Kind::Bytes, ValueRef::Blob(b) | ValueRef::Text(b)) => Value::Bytes(b.to_vec()),
            (kind, other) => {
                return Err(format!(
                    "a {:?} value where {kind:?} was expected",
                    other.data_type()
                ));
            }
        })
    }

    /// The value's bytes in the row digest: a tag, then the value (its
    /// length first where it has one), so that no two rows share an input.
    fn digest_into(&self, ctx: &mut ring::digest::Context) {
        match self {
            Value::Null => ctx.update(&[0]),
            Value::Int(i) => {
                ctx.update(&[1]);
                ctx.update(&i.to_be_bytes());
            }
            Value::Bool(b) => ctx.update(&[2, u8::from(*b)]),
            Value::Text(t) => {
                ctx.update(&[3]);
                ctx.update(&(t.len() as u64).to_be_bytes());
                ctx.update(t.as_bytes());
            }
            Value::Bytes(b) => {
                ctx.update(&[4]);
                ctx.update(&(b.len() as u64).to_be_bytes());
                ctx.update(b);
            }
        }
    }
}

/// Rows counted and digested in any order: the SHA-256 of each row, added
/// as four 64-bit lanes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Tally {
    rows: u64,
    lanes: [u64; 4],
}

impl Tally {
    fn add(&mut self, row: &[Value]) {
        let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
        for value in row {
            value.digest_into(&mut ctx);
        }
        let digest = ctx.finish();
        for (lane, chunk) in self.lanes.iter_mut().zip(digest.as_ref().chunks_exact(8)) {
            let mut octets = [0u8; 8];
            octets.copy_from_slice(chunk);
            *lane = lane.wrapping_add(u64::from_be_bytes(octets));
        }
        self.rows += 1;
    }

    fn hex(&self) -> String {
        self.lanes.iter().map(|l| format!("{l:016x}")).collect()
    }
}

/// A column of a copied table: its name at the target, its kind, and what
/// reads it at the source.
#[derive(Clone, Debug)]
struct Column {
    name: String,
    kind: Kind,
    source: String,
    identity: bool,
}

/// What the reading thread sends.
enum Batch {
    Rows(usize, Vec<Vec<Value>>),
    End(usize, Tally),
}

impl Store {
    /// Copies every row of this SQLite database into `target`, an empty
    /// PostgreSQL database at the same schema version (both stores
    /// migrated by this build), and verifies it (see the module).
    pub async fn copy_into(&self, target: &Store) -> Result<Vec<TableCopy>> {
        let path = match &self.backend {
            crate::Backend::Sqlite(db) => db.readers[0]
                .lock()
                .await?
                .path()
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .ok_or(StoreError::NotOnThisEngine(
                    "db copy reads a SQLite file, not an in-memory database",
                ))?,
            crate::Backend::Postgres(_) => {
                return Err(StoreError::NotOnThisEngine(
                    "db copy copies from a SQLite file (--from sqlite:PATH)",
                ));
            }
        };
        let Some(pool) = target.postgres_pool() else {
            return Err(StoreError::NotOnThisEngine(
                "db copy copies into PostgreSQL (--to postgres://…)",
            ));
        };
        let source = rusqlite::Connection::open_with_flags(
            &path,
            rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )?;
        let source_schema = sqlite_schema(&source)?;
        let mut tx = pool.begin().await.map_err(StoreError::Pg)?;
        let plan = plan(&source_schema, &mut tx).await?;

        // The rows, streamed from a thread holding the read transaction.
        let (sender, mut batches) = tokio::sync::mpsc::channel::<Result<Batch>>(4);
        let reading = {
            let plan = plan.clone();
            std::thread::Builder::new()
                .name("db-copy-reader".into())
                .spawn(move || read_all(source, &plan, &sender))
                .map_err(|e| StoreError::Corrupt(format!("cannot start the reading thread: {e}")))?
        };
        let mut read = vec![Tally::default(); plan.len()];
        while let Some(batch) = batches.recv().await {
            match batch? {
                Batch::Rows(t, rows) => insert(&mut tx, TABLES[t], &plan[t], rows).await?,
                Batch::End(t, tally) => read[t] = tally,
            }
        }
        let _ = reading.join();

        let mut copied = Vec::with_capacity(plan.len());
        for (t, columns) in plan.iter().enumerate() {
            let table = TABLES[t];
            for c in columns.iter().filter(|c| c.identity) {
                // Past the largest copied value, or back at 1 for none.
                let sql = format!(
                    "SELECT setval(pg_get_serial_sequence('{table}', '{name}'), \
                     COALESCE(MAX({name}), 1), MAX({name}) IS NOT NULL) FROM {table}",
                    name = c.name
                );
                sqlx::query(audited(sql))
                    .execute(&mut *tx)
                    .await
                    .map_err(StoreError::Pg)?;
            }
            let written = tally_target(&mut tx, table, columns).await?;
            if written != read[t] {
                return Err(StoreError::Corrupt(format!(
                    "{table}: {} rows read with digest {}, but {} rows written with digest {}; nothing was committed",
                    read[t].rows,
                    read[t].hex(),
                    written.rows,
                    written.hex()
                )));
            }
            copied.push(TableCopy {
                table,
                rows: written.rows,
                digest: written.hex(),
            });
        }
        // Statistics for the planner, gathered in the copy's transaction
        // (ANALYZE may run in one, and counts the rows it wrote): a server
        // started on the copy plans on them at once instead of on a guess
        // until autovacuum's first ANALYZE.
        sqlx::query(audited(format!("ANALYZE {}", TABLES.join(", "))))
            .execute(&mut *tx)
            .await
            .map_err(StoreError::Pg)?;
        tx.commit().await.map_err(StoreError::Pg)?;
        Ok(copied)
    }
}

/// A statement built here: its only names are [`TABLES`] and columns that
/// passed [`plain_identifier`], and every value is a bound parameter.
fn audited(sql: String) -> sqlx::AssertSqlSafe<String> {
    sqlx::AssertSqlSafe(sql)
}

/// Whether `name` is a lowercase SQL identifier that needs no quoting: the
/// only column names put into a statement.
fn plain_identifier(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

/// The tables of a SQLite database (but SQLite's and the migrations'),
/// each with its columns.
fn sqlite_schema(source: &rusqlite::Connection) -> Result<BTreeMap<String, BTreeSet<String>>> {
    let mut statement = source.prepare(
        "SELECT name FROM sqlite_master WHERE type = 'table'
         AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations'",
    )?;
    let tables: Vec<String> = statement
        .query_map([], |row| row.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut schema = BTreeMap::new();
    for table in tables {
        let mut statement = source.prepare("SELECT name FROM pragma_table_info(?1)")?;
        let columns = statement
            .query_map([&table], |row| row.get(0))?
            .collect::<rusqlite::Result<_>>()?;
        schema.insert(table, columns);
    }
    Ok(schema)
}

/// The columns of each table of [`TABLES`], after checking that both
/// databases have exactly those tables and the target none of their rows.
async fn plan(
    source: &BTreeMap<String, BTreeSet<String>>,
    tx: &mut sqlx::PgConnection,
) -> Result<Vec<Vec<Column>>> {
    let listed: BTreeSet<String> = TABLES.iter().map(|t| (*t).to_owned()).collect();
    let at_source: BTreeSet<String> = source.keys().cloned().collect();
    let at_target: BTreeSet<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables
         WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'
         AND table_name <> '_sqlx_migrations'",
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(StoreError::Pg)?
    .into_iter()
    .collect();
    for (name, tables) in [
        ("the SQLite database", &at_source),
        ("the target", &at_target),
    ] {
        if *tables != listed {
            return Err(StoreError::Corrupt(format!(
                "{name} has the tables {tables:?}, but db copy knows {listed:?}: are both at this version's schema?"
            )));
        }
    }

    let mut plan = Vec::with_capacity(TABLES.len());
    for table in TABLES {
        let rows: Vec<(String, String, String)> = sqlx::query_as(
            "SELECT column_name::text, data_type::text, is_identity::text
             FROM information_schema.columns
             WHERE table_schema = current_schema() AND table_name = $1
             ORDER BY ordinal_position",
        )
        .bind(*table)
        .fetch_all(&mut *tx)
        .await
        .map_err(StoreError::Pg)?;
        let source_columns = &source[*table];
        let mut columns = Vec::with_capacity(rows.len());
        for (name, data_type, identity) in rows {
            if !plain_identifier(&name) {
                return Err(StoreError::Corrupt(format!(
                    "{table} has a column named {name:?}, which db copy does not know"
                )));
            }
            let source = if source_columns.contains(&name) {
                name.clone()
            } else if *table == "challenges" && name == "seq" {
                // SQLite keeps a challenge's order in its rowid;
                // PostgreSQL in this column.
                "rowid".to_owned()
            } else {
                return Err(StoreError::Corrupt(format!(
                    "{table}.{name} is not in the SQLite database"
                )));
            };
            columns.push(Column {
                kind: Kind::of(table, &name, &data_type)?,
                name,
                source,
                identity: identity == "YES",
            });
        }
        if let Some(lost) = source_columns
            .iter()
            .find(|s| !columns.iter().any(|c| &c.name == *s))
        {
            return Err(StoreError::Corrupt(format!(
                "{table}.{lost} has no column at the target: its values would be lost"
            )));
        }
        let sql = format!("SELECT EXISTS (SELECT 1 FROM {table})");
        let occupied: bool = sqlx::query_scalar(audited(sql))
            .fetch_one(&mut *tx)
            .await
            .map_err(StoreError::Pg)?;
        if occupied {
            return Err(StoreError::NotOnThisEngine(
                "the target database is not empty: copy into a new, empty database",
            ));
        }
        plan.push(columns);
    }
    Ok(plan)
}

/// The reading thread: every table's rows in one read transaction, sent in
/// batches, each table's tally after its rows. Stops at the first error
/// (sent) or when the receiver is gone.
fn read_all(
    source: rusqlite::Connection,
    plan: &[Vec<Column>],
    sender: &tokio::sync::mpsc::Sender<Result<Batch>>,
) {
    let read = || -> Result<()> {
        // Deferred: the snapshot is taken at the first read and held to the
        // end, whatever a serving process writes meanwhile.
        source.execute_batch("BEGIN")?;
        for (t, columns) in plan.iter().enumerate() {
            let table = TABLES[t];
            let list: Vec<&str> = columns.iter().map(|c| c.source.as_str()).collect();
            let mut statement =
                source.prepare(&format!("SELECT {} FROM {table}", list.join(", ")))?;
            let mut rows = statement.query([])?;
            let mut tally = Tally::default();
            let mut batch = Vec::with_capacity(BATCH_ROWS);
            while let Some(row) = rows.next()? {
                let mut values = Vec::with_capacity(columns.len());
                for (i, column) in columns.iter().enumerate() {
                    let value = Value::from_sqlite(row.get_ref(i)?, column.kind).map_err(|e| {
                        StoreError::Corrupt(format!("{table}.{}: {e}", column.name))
                    })?;
                    values.push(value);
                }
                tally.add(&values);
                batch.push(values);
                if batch.len() == BATCH_ROWS {
                    let full = std::mem::replace(&mut batch, Vec::with_capacity(BATCH_ROWS));
                    if sender.blocking_send(Ok(Batch::Rows(t, full))).is_err() {
                        return Ok(());
                    }
                }
            }
            if !batch.is_empty() && sender.blocking_send(Ok(Batch::Rows(t, batch))).is_err() {
                return Ok(());
            }
            if sender.blocking_send(Ok(Batch::End(t, tally))).is_err() {
                return Ok(());
            }
        }
        source.execute_batch("COMMIT")?;
        Ok(())
    };
    if let Err(e) = read() {
        let _ = sender.blocking_send(Err(e));
    }
}

/// Inserts `rows` into `table`, as many per statement as the parameter
/// limit allows.
async fn insert(
    tx: &mut sqlx::PgConnection,
    table: &str,
    columns: &[Column],
    rows: Vec<Vec<Value>>,
) -> Result<()> {
    let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
    let per_statement = (MAX_PARAMETERS / columns.len().max(1)).clamp(1, BATCH_ROWS);
    for chunk in rows.chunks(per_statement) {
        let mut sql = format!("INSERT INTO {table} ({}) VALUES ", names.join(", "));
        let mut n = 0;
        for (r, _) in chunk.iter().enumerate() {
            sql.push_str(if r == 0 { "(" } else { ", (" });
            for (i, column) in columns.iter().enumerate() {
                n += 1;
                if i > 0 {
                    sql.push_str(", ");
                }
                sql.push_str(&format!("${n}::{}", column.kind.cast()));
            }
            sql.push(')');
        }
        let mut query = sqlx::query(audited(sql));
        for row in chunk {
            for (value, column) in row.iter().zip(columns) {
                query = match (value, column.kind) {
                    (Value::Null, Kind::Int) => query.bind(None::<i64>),
                    (Value::Null, Kind::Bool) => query.bind(None::<bool>),
                    (Value::Null, Kind::Text) => query.bind(None::<String>),
                    (Value::Null, Kind::Bytes) => query.bind(None::<Vec<u8>>),
                    (Value::Int(i), _) => query.bind(*i),
                    (Value::Bool(b), _) => query.bind(*b),
                    (Value::Text(t), _) => query.bind(t.clone()),
                    (Value::Bytes(b), _) => query.bind(b.clone()),
                };
            }
        }
        query
            .execute(&mut *tx)
            .await
            .map_err(|e| StoreError::Corrupt(format!("writing {table}: {e}")))?;
    }
    Ok(())
}

/// Every row of `table` at the target, counted and digested (through a
/// cursor: a large audit log is not held in memory at once).
async fn tally_target(
    tx: &mut sqlx::PgConnection,
    table: &str,
    columns: &[Column],
) -> Result<Tally> {
    let list: Vec<String> = columns
        .iter()
        .map(|c| format!("{}::{}", c.name, c.kind.cast()))
        .collect();
    // A cursor per table: a FETCH is prepared and cached like any
    // statement, with the columns of the cursor it was first run on.
    let cursor = format!("db_copy_{table}");
    let declare = format!(
        "DECLARE {cursor} NO SCROLL CURSOR FOR SELECT {} FROM {table}",
        list.join(", ")
    );
    sqlx::query(audited(declare))
        .execute(&mut *tx)
        .await
        .map_err(StoreError::Pg)?;
    let mut tally = Tally::default();
    loop {
        let rows = sqlx::query(audited(format!("FETCH {BATCH_ROWS} FROM {cursor}")))
            .fetch_all(&mut *tx)
            .await
            .map_err(StoreError::Pg)?;
        if rows.is_empty() {
            break;
        }
        for row in rows {
            let mut values = Vec::with_capacity(columns.len());
            for (i, column) in columns.iter().enumerate() {
                let value = match column.kind {
                    Kind::Int => row.try_get::<Option<i64>, _>(i).map(|v| v.map(Value::Int)),
                    Kind::Bool => row
                        .try_get::<Option<bool>, _>(i)
                        .map(|v| v.map(Value::Bool)),
                    Kind::Text => row
                        .try_get::<Option<String>, _>(i)
                        .map(|v| v.map(Value::Text)),
                    Kind::Bytes => row
                        .try_get::<Option<Vec<u8>>, _>(i)
                        .map(|v| v.map(Value::Bytes)),
                }
                .map_err(StoreError::Pg)?
                .unwrap_or(Value::Null);
                values.push(value);
            }
            tally.add(&values);
        }
    }
    sqlx::query(audited(format!("CLOSE {cursor}")))
        .execute(&mut *tx)
        .await
        .map_err(StoreError::Pg)?;
    Ok(tally)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::test_support::open_in;

    #[tokio::test]
    async fn the_copy_knows_every_table_of_the_schema() {
        let dir = tempfile::tempdir().unwrap();
        let (path, store) = open_in(dir.path()).await;
        store.close().await;
        let conn = rusqlite::Connection::open(path).unwrap();
        let mut statement = conn
            .prepare(
                "SELECT name FROM sqlite_master WHERE type = 'table'
                 AND name NOT LIKE 'sqlite_%' AND name <> '_sqlx_migrations'",
            )
            .unwrap();
        let tables: BTreeSet<String> = statement
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let listed: BTreeSet<String> = TABLES.iter().map(|t| (*t).to_owned()).collect();
        assert_eq!(tables, listed);
    }

    #[test]
    fn sqlite_values_take_the_target_columns_type_or_are_refused() {
        use ValueRef as V;
        assert_eq!(
            Value::from_sqlite(V::Integer(1), Kind::Bool),
            Ok(Value::Bool(true))
        );
        assert_eq!(
            Value::from_sqlite(V::Integer(0), Kind::Bool),
            Ok(Value::Bool(false))
        );
        assert_eq!(
            Value::from_sqlite(V::Text(b"42"), Kind::Int),
            Ok(Value::Int(42))
        );
        assert_eq!(Value::from_sqlite(V::Null, Kind::Text), Ok(Value::Null));
        assert_eq!(
            Value::from_sqlite(V::Blob(b"k"), Kind::Bytes),
            Ok(Value::Bytes(b"k".to_vec()))
        );
        assert!(Value::from_sqlite(V::Text(b"x"), Kind::Int).is_err());
        assert!(Value::from_sqlite(V::Real(1.5), Kind::Bool).is_err());
        assert!(Value::from_sqlite(V::Blob(&[0xff]), Kind::Text).is_err());
    }

    #[test]
    fn a_tally_ignores_row_order_but_not_a_changed_or_missing_value() {
        let a = vec![Value::Int(1), Value::Text("a".into())];
        let b = vec![Value::Int(2), Value::Null];
        let mut one = Tally::default();
        one.add(&a);
        one.add(&b);
        let mut other = Tally::default();
        other.add(&b);
        other.add(&a);
        assert_eq!(one, other);
        let mut changed = Tally::default();
        changed.add(&a);
        changed.add(&[Value::Int(2), Value::Text(String::new())]);
        assert_ne!(one, changed);
        let mut fewer = Tally::default();
        fewer.add(&a);
        assert_ne!(one, fewer);
    }
}
