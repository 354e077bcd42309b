//! How a statement reaches the database: its arguments, the rows it
//! returns, the connection it runs on and the transaction it is part of,
//! as one API that each operation of the store is written against once.
//!
//! A statement is awaited. On SQLite it has already run on the calling
//! thread when the await is reached (see `slot.rs` for why), so a
//! transaction's awaits never suspend it: a future is dropped, if at all,
//! before its transaction began or after it ended.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{OnceLock, RwLock};

use rusqlite::types::{FromSql, ToSqlOutput, Value, ValueRef};
use rusqlite::{ToSql, params_from_iter};
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::{Postgres, Row as _};
use sqlx_core::transaction::TransactionManager as _;

use crate::nonces::{Carry, Due, Riders};
use crate::pg_pool::Pooled;
use crate::slot::Held;
use crate::{Result, StoreError, parse_text};

/// One argument of a statement, typed (a NULL too), so that every engine
/// can be told what it is.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Arg<'a> {
    Int(Option<i64>),
    Text(Option<&'a str>),
    Bool(bool),
    Bytes(Option<&'a [u8]>),
    /// PostgreSQL's `text[]` and `bigint[]`, for statements only it runs
    /// (`unnest(?1::text[])` writes many rows with one statement text).
    Texts(&'a [&'a str]),
    Ints(&'a [i64]),
}

/// A value that can be a statement's argument, borrowed.
pub(crate) trait ToArg {
    fn to_arg(&self) -> Arg<'_>;
}

impl ToArg for i64 {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(Some(*self))
    }
}

impl ToArg for Option<i64> {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(*self)
    }
}

impl ToArg for u32 {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(Some(i64::from(*self)))
    }
}

impl ToArg for u8 {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(Some(i64::from(*self)))
    }
}

impl ToArg for Option<u8> {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Int(self.map(i64::from))
    }
}

impl ToArg for bool {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Bool(*self)
    }
}

impl ToArg for &str {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(Some(self))
    }
}

impl ToArg for String {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(Some(self))
    }
}

impl ToArg for Option<&str> {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(*self)
    }
}

impl ToArg for Option<String> {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self.as_deref())
    }
}

impl ToArg for Option<&String> {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Text(self.map(String::as_str))
    }
}

impl ToArg for &[u8] {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Bytes(Some(self))
    }
}

impl ToArg for Vec<u8> {
    fn to_arg(&self) -> Arg<'_> {
        Arg::Bytes(Some(self))
    }
}

impl<T: ToArg + ?Sized> ToArg for &T {
    fn to_arg(&self) -> Arg<'_> {
        (**self).to_arg()
    }
}

impl ToSql for Arg<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match *self {
            Arg::Int(Some(v)) => ToSqlOutput::Owned(Value::Integer(v)),
            Arg::Bool(v) => ToSqlOutput::Owned(Value::Integer(i64::from(v))),
            Arg::Text(Some(v)) => ToSqlOutput::Borrowed(ValueRef::Text(v.as_bytes())),
            Arg::Bytes(Some(v)) => ToSqlOutput::Borrowed(ValueRef::Blob(v)),
            Arg::Int(None) | Arg::Text(None) | Arg::Bytes(None) => ToSqlOutput::Owned(Value::Null),
            Arg::Texts(_) | Arg::Ints(_) => {
                return Err(rusqlite::Error::ToSqlConversionFailure(
                    "arrays are arguments of PostgreSQL's statements only".into(),
                ));
            }
        })
    }
}

/// The arguments of a statement, each borrowed: `args![a, b]` is
/// `&[a.to_arg(), b.to_arg()]`.
macro_rules! args {
    ($($arg:expr),* $(,)?) => {
        &[$($crate::db::ToArg::to_arg(&$arg)),*] as &[$crate::db::Arg<'_>]
    };
}
pub(crate) use args;

/// Binds `args` to a PostgreSQL statement, each with its type (a NULL
/// too), which is what lets one statement text serve both engines:
/// PostgreSQL infers nothing from `?1 IS NULL OR x = ?1` or `?1 + ?2`.
fn bind<'q>(
    mut query: sqlx::query::Query<'q, Postgres, PgArguments>,
    args: &[Arg<'q>],
) -> sqlx::query::Query<'q, Postgres, PgArguments> {
    for arg in args {
        query = match *arg {
            Arg::Int(v) => query.bind(v),
            Arg::Text(v) => query.bind(v),
            Arg::Bool(v) => query.bind(v),
            Arg::Bytes(v) => query.bind(v),
            Arg::Texts(v) => query.bind(v),
            Arg::Ints(v) => query.bind(v),
        };
    }
    query
}

/// A statement's text for PostgreSQL: each `?N` parameter (a `?` and a
/// digit outside a quoted literal) written `$N`. The store's statements
/// are written once, with SQLite's `?N` (SQLite numbers `$N` parameters by
/// first appearance, not by N); each is `'static` text, converted once per
/// process and looked up by its address, so a statement costs a pointer
/// hash and a shared read lock, not a hash of its text.
pub(crate) fn postgres_text(sql: &'static str) -> &'static str {
    static CONVERTED: Converted<(usize, usize)> = OnceLock::new();
    made_once(&CONVERTED, (sql.as_ptr() as usize, sql.len()), || {
        let bytes = sql.as_bytes();
        let mut out = String::with_capacity(sql.len());
        let mut quoted = false;
        for (i, c) in sql.char_indices() {
            if c == '\'' {
                quoted = !quoted;
            }
            let parameter = c == '?' && !quoted && bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
            out.push(if parameter { '$' } else { c });
        }
        out
    })
}

/// Statement texts made from the store's `'static` ones, by a key.
type Converted<K> = OnceLock<RwLock<HashMap<K, &'static str>>>;

/// The text `cache` keeps for `key`, made by `make` the first time. The
/// store's statements are a fixed set: this keeps one copy of each.
fn made_once<K: std::hash::Hash + Eq>(
    cache: &'static Converted<K>,
    key: K,
    make: impl FnOnce() -> String,
) -> &'static str {
    let cache = cache.get_or_init(Default::default);
    if let Some(text) = cache
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .get(&key)
    {
        return text;
    }
    let text: &'static str = Box::leak(make().into_boxed_str());
    cache
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .insert(key, text);
    text
}

/// `sql` for PostgreSQL ([`postgres_text`]) carrying a request's nonce:
/// with a `WITH` that records it in `used_nonces` first among its own, its
/// value and expiry the two parameters after `sql`'s `params`. No `ON
/// CONFLICT`: a nonce used before fails the whole statement on the primary
/// key, so nothing else it does is written. A read's record does not wait
/// for its WAL flush (`synchronous_commit` off for its transaction, as for
/// the nonce records written alone, `Store::use_nonce`); a write's commit
/// waits, for the write. Made once per statement, as `postgres_text` is.
///
/// With `riders`, a second `WITH` records other requests' nonces
/// ([`crate::nonces::Riders`]), their values and expiries as two arrays in
/// the two parameters after those.
pub(crate) fn carrying_text(
    sql: &'static str,
    params: usize,
    carry: Carry,
    riders: bool,
) -> &'static str {
    static CONVERTED: Converted<(usize, usize, usize, Carry, bool)> = OnceLock::new();
    let key = (sql.as_ptr() as usize, sql.len(), params, carry, riders);
    made_once(&CONVERTED, key, || {
        with_nonce_record(sql, params, carry, riders)
    })
}

/// [`carrying_text`]'s text, made.
fn with_nonce_record(sql: &'static str, params: usize, carry: Carry, riders: bool) -> String {
    let (value, expires_at) = (params + 1, params + 2);
    let (values, expiries) = (params + 3, params + 4);
    let mut record = match carry {
        Carry::Write => format!(
            "acme_nonce AS (INSERT INTO used_nonces (value, expires_at) VALUES (${value}, ${expires_at}))"
        ),
        Carry::Read => format!(
            "acme_nonce AS (INSERT INTO used_nonces (value, expires_at)
                             SELECT ${value}, ${expires_at}
                               FROM (SELECT set_config('synchronous_commit', 'off', true)) AS no_wait)"
        ),
    };
    if riders {
        // Sorted by the caller, as the nonces written alone are.
        record.push_str(&format!(
            ",\nacme_riders AS (INSERT INTO used_nonces (value, expires_at)
                              SELECT r.v, r.e FROM unnest(${values}::text[], ${expiries}::bigint[]) AS r(v, e))"
        ));
    }
    let text = postgres_text(sql).trim_start();
    // The statement's own `WITH` list, if it has one, gets one more (first)
    // entry.
    match strip_keyword(text, "WITH") {
        Some(rest) => match strip_keyword(rest, "RECURSIVE") {
            Some(rest) => format!("WITH RECURSIVE {record},\n{rest}"),
            None => format!("WITH {record},\n{rest}"),
        },
        None => format!("WITH {record}\n{text}"),
    }
}

/// `text` after its first word and the blanks that follow, if that word is
/// `keyword` (in any case).
fn strip_keyword<'t>(text: &'t str, keyword: &str) -> Option<&'t str> {
    let word = text.get(..keyword.len())?;
    let rest = &text[keyword.len()..];
    (word.eq_ignore_ascii_case(keyword) && rest.starts_with(char::is_whitespace))
        .then(|| rest.trim_start())
}

/// The nonce a statement carries: held (no other statement of the request
/// spends it meanwhile) until the statement's answer says what became of
/// it.
struct Carried {
    due: tokio::sync::OwnedMutexGuard<Due>,
    value: String,
    expires_at: i64,
    carry: Carry,
    riders: Riders,
}

/// The nonce the next statement on this connection is to carry, taking
/// `carry` (only a connection's first statement carries one):
/// [`StoreError::NonceReplayed`] when the request's nonce was found used
/// before, `None` when none is due. With `riding`, other requests' queued
/// nonce uses go along.
async fn carried(carry: &mut Option<Carry>, riding: bool) -> Result<Option<Carried>> {
    let Some(carry) = carry.take() else {
        return Ok(None);
    };
    let Some(due) = crate::nonces::due() else {
        return Ok(None);
    };
    let due = due.lock_owned().await;
    let (value, expires_at) = match &*due {
        Due::Spent => return Ok(None),
        Due::Replayed => return Err(StoreError::NonceReplayed),
        Due::Pending {
            value, expires_at, ..
        } => (value.clone(), *expires_at),
    };
    let riders = if riding {
        crate::nonces::riders()
    } else {
        Riders::default()
    };
    Ok(Some(Carried {
        due,
        value,
        expires_at,
        carry,
        riders,
    }))
}

/// The text of `sql` to send, with the nonce it carries if any.
fn statement_text(sql: &'static str, params: usize, carried: Option<&Carried>) -> &'static str {
    match carried {
        Some(carried) => carrying_text(sql, params, carried.carry, !carried.riders.is_empty()),
        None => postgres_text(sql),
    }
}

/// Binds the carried nonce's two parameters after the statement's own.
fn bind_carried<'q>(
    query: sqlx::query::Query<'q, Postgres, PgArguments>,
    carried: Option<&Carried>,
) -> sqlx::query::Query<'q, Postgres, PgArguments> {
    let Some(carried) = carried else {
        return query;
    };
    let query = query.bind(carried.value.clone()).bind(carried.expires_at);
    if carried.riders.is_empty() {
        return query;
    }
    let (values, expiries) = carried.riders.columns();
    query.bind(values).bind(expiries)
}

/// What became of a carried nonce, by its statement's result: spent with
/// a statement that committed, found used before when its record failed
/// on the primary key (and with it the statement: nothing was written),
/// still due after any other failure (rolled back with the statement).
/// `None` when the statement carried riders and the server refused it:
/// the riders are queued again and it is to run again without them.
fn settle_carried<T>(carried: Option<Carried>, result: Result<T>) -> Option<Result<T>> {
    let Some(mut carried) = carried else {
        return Some(result);
    };
    let riders = std::mem::take(&mut carried.riders);
    if !riders.is_empty() {
        match result {
            Ok(done) => {
                riders.written();
                *carried.due = Due::Spent;
                return Some(Ok(done));
            }
            // Refused: which nonce (or what else) it was, the statement
            // alone will say. The riders go back as they drop.
            Err(StoreError::Pg(sqlx::Error::Database(_))) => return None,
            Err(e) => return Some(Err(e)),
        }
    }
    Some(match result {
        Ok(done) => {
            *carried.due = Due::Spent;
            Ok(done)
        }
        Err(e) if e.is_unique_violation_of("used_nonces.value", "used_nonces_pkey") => {
            *carried.due = Due::Replayed;
            Err(StoreError::NonceReplayed)
        }
        Err(e) => Err(e),
    })
}

/// One row of a result.
#[derive(Clone, Copy)]
pub(crate) enum Row<'r> {
    Sqlite(&'r rusqlite::Row<'r>),
    Postgres(&'r PgRow),
}

/// How a column is picked out of a row.
pub(crate) trait ColumnAt {
    fn position(&self, row: Row<'_>) -> Result<usize>;
}

impl ColumnAt for usize {
    fn position(&self, _: Row<'_>) -> Result<usize> {
        Ok(*self)
    }
}

impl ColumnAt for &str {
    fn position(&self, row: Row<'_>) -> Result<usize> {
        match row {
            Row::Sqlite(row) => Ok(row.as_ref().column_index(self)?),
            Row::Postgres(row) => {
                use sqlx::Column as _;
                Ok(row.try_column(*self).map_err(StoreError::Pg)?.ordinal())
            }
        }
    }
}

/// A type a column is read as.
pub(crate) trait Column: Sized {
    fn read(row: Row<'_>, index: usize) -> Result<Self>;
}

impl<T> Column for T
where
    T: FromSql + for<'r> sqlx::Decode<'r, Postgres> + sqlx::Type<Postgres>,
{
    fn read(row: Row<'_>, index: usize) -> Result<Self> {
        match row {
            Row::Sqlite(row) => Ok(row.get(index)?),
            Row::Postgres(row) => row.try_get(index).map_err(StoreError::Pg),
        }
    }
}

impl Row<'_> {
    /// A column by its position, or by its name (for a statement of a few
    /// columns read once, not a row read on every request).
    pub(crate) fn get<T: Column>(self, at: impl ColumnAt) -> Result<T> {
        T::read(self, at.position(self)?)
    }

    /// The name of column `index`, for the debug check of [`col`].
    fn column_name(&self, index: usize) -> Option<&str> {
        use sqlx::Column as _;
        match self {
            Row::Sqlite(row) => row.as_ref().column_name(index).ok(),
            Row::Postgres(row) => row.columns().get(index).map(|c| c.name()),
        }
    }

    /// Column `index` as borrowed text.
    fn text(&self, index: usize) -> Result<&str> {
        match self {
            Row::Sqlite(row) => Ok(row.get_ref(index)?.as_str().map_err(|e| {
                rusqlite::Error::FromSqlConversionFailure(
                    index,
                    rusqlite::types::Type::Text,
                    Box::new(e),
                )
            })?),
            Row::Postgres(row) => row.try_get(index).map_err(StoreError::Pg),
        }
    }
}

/// Column `index` of a row, read by its position. Looking a column up by
/// name compares the name with each column's before it, on every row: part
/// of the 1.2 % of the server's CPU such lookups took
/// (docs/performance.md). Debug builds — the tests — check that the column
/// at `index` is `name`, so a column list and its reader cannot drift apart
/// unnoticed.
pub(crate) fn col<T: Column>(row: Row<'_>, index: usize, name: &str) -> Result<T> {
    debug_assert_eq!(
        row.column_name(index),
        Some(name),
        "column {index} of the row"
    );
    T::read(row, index)
}

/// Column `index` of a row, TEXT naming a member of a closed set (a
/// status, an identifier or challenge type): parsed here, once, so that
/// every row the store returns carries the enum. `column` (table.column)
/// names it in the error for a value the set does not have.
pub(crate) fn col_enum<T: FromStr>(
    row: Row<'_>,
    index: usize,
    name: &str,
    column: &'static str,
) -> Result<T> {
    debug_assert_eq!(
        row.column_name(index),
        Some(name),
        "column {index} of the row"
    );
    // Borrowed: no String per row for a value that becomes a `Copy` enum.
    parse_text(row.text(index)?, column)
}

/// One statement on a PostgreSQL connection through sqlx's `$fetch`
/// (`execute`, `fetch_optional`, `fetch_all`), carrying the request's
/// nonce when it is the connection's first and one is due, with queued
/// uses riding along; run again without them when the server refused it
/// with riders ([`settle_carried`]). A macro, not a function, because
/// each `$fetch` is a different method of sqlx's query.
macro_rules! run_carrying {
    ($pooled:expr, $carry:expr, $sql:expr, $args:expr, $fetch:ident) => {{
        let (kind, mut riding) = (*$carry, true);
        loop {
            let carried = carried($carry, riding).await?;
            let session = $pooled.session()?;
            let text = statement_text($sql, $args.len(), carried.as_ref());
            let result = bind_carried(bind(sqlx::query(text), $args), carried.as_ref())
                .$fetch(session.start())
                .await;
            let result = session.settle(result);
            match settle_carried(carried, result) {
                Some(result) => break result,
                None => (*$carry, riding) = (kind, false),
            }
        }
    }};
}

/// A connection, held for one statement or transaction. A PostgreSQL
/// connection's first statement may carry the request's nonce
/// (`Store::spending_nonce`).
pub(crate) enum Conn<'s> {
    Sqlite(Held<'s>),
    Postgres(Pooled, Option<Carry>),
}

impl<'s> Conn<'s> {
    /// Runs a statement that returns no rows; the number of rows it
    /// changed.
    pub(crate) async fn exec(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<u64> {
        match self {
            Conn::Sqlite(conn) => {
                Ok(conn.prepare_cached(sql)?.execute(params_from_iter(args))? as u64)
            }
            Conn::Postgres(pooled, carry) => {
                Ok(run_carrying!(pooled, carry, sql, args, execute)?.rows_affected())
            }
        }
    }

    /// The first row of a statement, mapped.
    pub(crate) async fn one<T>(
        &mut self,
        sql: &'static str,
        args: &[Arg<'_>],
        map: impl FnOnce(Row<'_>) -> Result<T>,
    ) -> Result<Option<T>> {
        match self {
            Conn::Sqlite(conn) => {
                let mut statement = conn.prepare_cached(sql)?;
                let mut rows = statement.query(params_from_iter(args))?;
                match rows.next()? {
                    Some(row) => map(Row::Sqlite(row)).map(Some),
                    None => Ok(None),
                }
            }
            Conn::Postgres(pooled, carry) => {
                let row = run_carrying!(pooled, carry, sql, args, fetch_optional)?;
                row.as_ref().map(|row| map(Row::Postgres(row))).transpose()
            }
        }
    }

    /// Every row of a statement, mapped.
    pub(crate) async fn all<T>(
        &mut self,
        sql: &'static str,
        args: &[Arg<'_>],
        mut map: impl FnMut(Row<'_>) -> Result<T>,
    ) -> Result<Vec<T>> {
        match self {
            Conn::Sqlite(conn) => {
                let mut statement = conn.prepare_cached(sql)?;
                let mut rows = statement.query(params_from_iter(args))?;
                let mut out = Vec::new();
                while let Some(row) = rows.next()? {
                    out.push(map(Row::Sqlite(row))?);
                }
                Ok(out)
            }
            Conn::Postgres(pooled, carry) => {
                let rows = run_carrying!(pooled, carry, sql, args, fetch_all)?;
                rows.iter().map(|row| map(Row::Postgres(row))).collect()
            }
        }
    }

    /// The first column of the first row, if there is a row.
    pub(crate) async fn scalar<T: Column>(
        &mut self,
        sql: &'static str,
        args: &[Arg<'_>],
    ) -> Result<Option<T>> {
        self.one(sql, args, |row| T::read(row, 0)).await
    }

    /// Whether a statement returns a row.
    pub(crate) async fn exists(&mut self, sql: &'static str, args: &[Arg<'_>]) -> Result<bool> {
        Ok(self.one(sql, args, |_| Ok(())).await?.is_some())
    }

    /// Whether this is a PostgreSQL connection: for the few statements
    /// only PostgreSQL needs (row locks that SQLite's single writer makes
    /// unnecessary) or that each engine words its own way.
    pub(crate) fn is_postgres(&self) -> bool {
        matches!(self, Conn::Postgres(..))
    }

    /// Starts a transaction on this connection (the writer's, on SQLite).
    /// `IMMEDIATE` takes SQLite's write lock at once, so a transaction that
    /// reads before it writes cannot fail half-way on another process's
    /// lock. PostgreSQL's transactions are READ COMMITTED: an operation
    /// that reads before it writes locks what it read.
    pub(crate) async fn begin(&mut self) -> Result<Tx<'_, 's>> {
        match self {
            Conn::Sqlite(conn) => {
                if !conn.is_autocommit() {
                    // A transaction an earlier `ROLLBACK` failed to end would
                    // refuse every `BEGIN` from now on: end it first.
                    conn.prepare_cached("ROLLBACK")?.execute([])?;
                }
                conn.prepare_cached("BEGIN IMMEDIATE")?.execute([])?;
            }
            Conn::Postgres(pooled, carry) => {
                // A connection whose first statement was to carry the
                // request's nonce is for one statement: a transaction's
                // statements would run before the nonce is recorded.
                if carry.is_some() && crate::nonces::due().is_some() {
                    return Err(StoreError::NotOnThisEngine(
                        "a transaction on a connection meant for one statement carrying the request's nonce",
                    ));
                }
                let session = pooled.session()?;
                let begun =
                    <Postgres as sqlx::Database>::TransactionManager::begin(session.start(), None)
                        .await;
                session.settle(begun)?;
            }
        }
        Ok(Tx {
            conn: self,
            open: true,
        })
    }
}

/// A transaction: committed by [`Tx::commit`], rolled back if dropped
/// before. Its statements are the connection's (it derefs to it).
///
/// `BEGIN`, `COMMIT` and `ROLLBACK` are statements prepared once per
/// connection and cached like every other; rusqlite's own `Transaction`
/// compiled their text on every use (0.4 % of the server's CPU with three
/// write transactions per issuance, docs/performance.md).
pub(crate) struct Tx<'c, 's> {
    conn: &'c mut Conn<'s>,
    open: bool,
}

impl Tx<'_, '_> {
    pub(crate) async fn commit(mut self) -> Result<()> {
        match &mut *self.conn {
            Conn::Sqlite(_) => {
                self.conn.exec("COMMIT", &[]).await?;
            }
            Conn::Postgres(pooled, _) => {
                let session = pooled.session()?;
                let committed =
                    <Postgres as sqlx::Database>::TransactionManager::commit(session.start()).await;
                session.settle(committed)?;
            }
        }
        self.open = false;
        Ok(())
    }
}

impl<'s> std::ops::Deref for Tx<'_, 's> {
    type Target = Conn<'s>;

    fn deref(&self) -> &Conn<'s> {
        self.conn
    }
}

impl<'s> std::ops::DerefMut for Tx<'_, 's> {
    fn deref_mut(&mut self) -> &mut Conn<'s> {
        self.conn
    }
}

impl Drop for Tx<'_, '_> {
    fn drop(&mut self) {
        if !self.open {
            return;
        }
        match &mut *self.conn {
            // Nothing to end after an error SQLite answered by rolling back
            // on its own.
            Conn::Sqlite(conn) => {
                if !conn.is_autocommit()
                    && let Ok(mut rollback) = conn.prepare_cached("ROLLBACK")
                {
                    let _ = rollback.execute([]);
                }
            }
            // Sent before the connection's next statement, or before it
            // goes back to the pool (`pg_pool.rs`).
            Conn::Postgres(pooled, _) => {
                if let Ok(session) = pooled.session() {
                    session.queue_rollback();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{carrying_text, postgres_text};
    use crate::nonces::Carry;

    #[test]
    fn a_carrying_statement_records_the_nonce_first_in_its_own_with_list_after_its_parameters() {
        const PLAIN: &str = "SELECT x FROM t WHERE a = ?1 AND b = ?2";
        const WITH: &str = "  with a AS (SELECT ?1 AS v) SELECT v FROM a";
        const RECURSIVE: &str = "WITH RECURSIVE r(n) AS (SELECT 1) SELECT n FROM r";
        let plain = carrying_text(PLAIN, 2, Carry::Write, false);
        assert_eq!(
            plain,
            "WITH acme_nonce AS (INSERT INTO used_nonces (value, expires_at) VALUES ($3, $4))\n\
             SELECT x FROM t WHERE a = $1 AND b = $2"
        );
        assert!(
            std::ptr::eq(plain, carrying_text(PLAIN, 2, Carry::Write, false)),
            "made once"
        );
        assert!(
            carrying_text(WITH, 1, Carry::Write, false).starts_with(
                "WITH acme_nonce AS (INSERT INTO used_nonces (value, expires_at) VALUES ($2, $3)),\n\
                 a AS (SELECT $1 AS v) SELECT v FROM a"
            ),
            "{}",
            carrying_text(WITH, 1, Carry::Write, false)
        );
        assert!(
            carrying_text(RECURSIVE, 0, Carry::Write, false)
                .starts_with("WITH RECURSIVE acme_nonce AS")
        );
        assert!(
            carrying_text(RECURSIVE, 0, Carry::Write, false)
                .ends_with(",\nr(n) AS (SELECT 1) SELECT n FROM r")
        );
        // A read's record does not wait for its WAL flush; a write's does.
        let read = carrying_text(PLAIN, 2, Carry::Read, false);
        assert!(
            read.contains("SELECT $3, $4") && read.contains("'synchronous_commit', 'off'"),
            "{read}"
        );
        assert!(!plain.contains("synchronous_commit"));
    }

    #[test]
    fn a_statement_gets_dollar_parameters_outside_quotes_once_and_keeps_the_rest() {
        const SQL: &str =
            "SELECT '?1 stays', x FROM t WHERE a = ?1 AND b = ?12 AND c = '?' AND d = ?2";
        let converted = postgres_text(SQL);
        assert_eq!(
            converted,
            "SELECT '?1 stays', x FROM t WHERE a = $1 AND b = $12 AND c = '?' AND d = $2"
        );
        assert!(
            std::ptr::eq(converted, postgres_text(SQL)),
            "converted once"
        );
    }
}
