//! The lock each connection sits behind.
//!
//! Statements run on the calling task's thread and nothing awaits while a
//! connection is held, so holding one is a matter of microseconds. What a
//! lock must not do here is hand the connection to a waiting task that is
//! not running yet. An async mutex that queues its waiters fairly (as
//! tokio's does) passes the lock at release to the first waiter, which then
//! waits for a runtime thread behind whatever that thread is doing — a JWS
//! verification is ~80 µs — while the connection sits idle and every other
//! taker queues behind. Measured on the writer at full load (concurrency 16):
//! four tasks waiting on average, 0.53 ms per turn, for some fifty
//! microseconds of statements per turn; with a slot, 1.3 tasks and 0.17 ms.
//!
//! A [`Slot`] is a `std` mutex that a task only ever *tries*: whoever asks
//! while it is free takes it at once, and a task that finds it held waits,
//! off the runtime's threads, for the holder's release to wake it (one
//! waiter per release, which then tries again). The operator's threads
//! (the checkpointer) may block on it instead. A `std` guard cannot be held
//! across an `.await` in the server's `Send` futures, so the compiler keeps
//! the promise that nothing awaits while a connection is held.

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard, TryLockError};

use rusqlite::Connection;
use tokio::sync::Notify;

use crate::{Result, StoreError};

/// One connection (`None` once closed) and the wake-ups of its waiters.
#[derive(Debug)]
pub(crate) struct Slot {
    conn: Mutex<Option<Connection>>,
    freed: Notify,
}

/// A connection held for one statement or transaction; its drop frees the
/// slot, then wakes one waiter.
pub(crate) struct Held<'a> {
    /// `Some` until dropped (taken in `drop` so that the mutex is unlocked
    /// before the waiter is woken), holding `Some` connection.
    guard: Option<MutexGuard<'a, Option<Connection>>>,
    slot: &'a Slot,
}

impl Slot {
    pub(crate) fn new(conn: Connection) -> Self {
        Self {
            conn: Mutex::new(Some(conn)),
            freed: Notify::new(),
        }
    }

    /// The connection once it is free; waits without holding a thread.
    pub(crate) async fn lock(&self) -> Result<Held<'_>> {
        if let Some(held) = self.try_lock() {
            return held;
        }
        loop {
            // Registered before trying again, so a release between the try
            // and the wait still wakes this task.
            let freed = self.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(held) = self.try_lock() {
                return held;
            }
            freed.await;
        }
    }

    /// The connection if it is free now.
    pub(crate) fn try_lock(&self) -> Option<Result<Held<'_>>> {
        match self.conn.try_lock() {
            Ok(guard) => Some(self.held(guard)),
            // A panic while held poisons the mutex; the connection is still
            // sound (a transaction left open is ended by the next `begin`
            // or read by key), as it was with an async mutex.
            Err(TryLockError::Poisoned(poisoned)) => Some(self.held(poisoned.into_inner())),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The connection, blocking this thread until it is free: for threads
    /// of the store's own, never a runtime's.
    pub(crate) fn blocking_lock(&self) -> Result<Held<'_>> {
        let guard = self
            .conn
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.held(guard)
    }

    /// Takes the connection out for closing; the slot answers
    /// [`StoreError::Closed`] from then on.
    pub(crate) async fn take(&self) -> Option<Connection> {
        let mut held = match self.lock().await {
            Ok(held) => held,
            Err(_) => return None,
        };
        held.guard.as_mut().and_then(|guard| guard.take())
    }

    /// Whether nobody holds the connection (for the pool's metrics).
    pub(crate) fn is_idle(&self) -> bool {
        self.try_lock().is_some()
    }

    fn held<'a>(&'a self, guard: MutexGuard<'a, Option<Connection>>) -> Result<Held<'a>> {
        let held = Held {
            guard: Some(guard),
            slot: self,
        };
        match held.guard.as_deref() {
            Some(Some(_)) => Ok(held),
            // Dropping `held` frees the slot and wakes the next waiter, who
            // finds it closed too.
            _ => Err(StoreError::Closed),
        }
    }
}

impl Deref for Held<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        match self.guard.as_deref() {
            Some(Some(conn)) => conn,
            // `Slot::held` hands out only a guard holding a connection, and
            // only `drop` takes the guard.
            _ => unreachable!("a held slot holds a connection"),
        }
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        match self.guard.as_deref_mut() {
            Some(Some(conn)) => conn,
            _ => unreachable!("a held slot holds a connection"),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        self.slot.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;

    fn slot() -> Arc<Slot> {
        Arc::new(Slot::new(Connection::open_in_memory().unwrap()))
    }

    #[tokio::test]
    async fn a_task_waiting_for_a_slot_a_thread_holds_takes_it_when_the_thread_lets_go() {
        let slot = slot();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn({
            let slot = Arc::clone(&slot);
            move || {
                let _held = slot.blocking_lock().unwrap();
                held_tx.send(()).unwrap();
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        held_rx.recv().unwrap();
        assert!(slot.try_lock().is_none(), "the thread holds it");
        let waited = tokio::time::timeout(Duration::from_secs(10), slot.lock())
            .await
            .expect("the release wakes the waiting task");
        assert!(waited.is_ok());
        holder.join().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn tasks_and_a_thread_contending_for_a_slot_each_hold_it_alone_and_none_is_left_waiting()
    {
        const TASKS: u64 = 32;
        const TURNS: u64 = 300;
        let slot = slot();
        let inside = Arc::new(AtomicBool::new(false));
        let turns = Arc::new(AtomicU64::new(0));
        // One turn: nobody else may be inside, and the connection works.
        let turn = |held: &Held<'_>, inside: &AtomicBool, turns: &AtomicU64| {
            assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
            let one: i64 = held.query_row("SELECT 1", [], |r| r.get(0)).unwrap();
            assert_eq!(one, 1);
            turns.fetch_add(1, Ordering::SeqCst);
            inside.store(false, Ordering::SeqCst);
        };
        let thread = std::thread::spawn({
            let (slot, inside, turns) =
                (Arc::clone(&slot), Arc::clone(&inside), Arc::clone(&turns));
            move || {
                for _ in 0..TURNS {
                    let held = slot.blocking_lock().unwrap();
                    turn(&held, &inside, &turns);
                    // Held a while, as the checkpointer's catch-up does,
                    // so that tasks queue behind it.
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
        });
        let mut tasks = Vec::new();
        for _ in 0..TASKS {
            let (slot, inside, turns) =
                (Arc::clone(&slot), Arc::clone(&inside), Arc::clone(&turns));
            tasks.push(tokio::spawn(async move {
                for i in 0..TURNS {
                    {
                        let held = slot.lock().await.unwrap();
                        turn(&held, &inside, &turns);
                    }
                    if i % 7 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        // A lost wake-up leaves a task waiting for ever: the timeout says so.
        tokio::time::timeout(Duration::from_secs(60), async {
            for task in tasks {
                task.await.unwrap();
            }
        })
        .await
        .expect("every task got its turns");
        thread.join().unwrap();
        assert_eq!(turns.load(Ordering::SeqCst), (TASKS + 1) * TURNS);
    }

    #[tokio::test]
    async fn a_closed_slot_answers_closed_to_the_task_that_was_waiting_and_to_every_later_one() {
        let slot = slot();
        let held = slot.lock().await.unwrap();
        let waiting = tokio::spawn({
            let slot = Arc::clone(&slot);
            async move { slot.take().await.is_some() }
        });
        let closing_waiter = tokio::spawn({
            let slot = Arc::clone(&slot);
            async move {
                tokio::time::sleep(Duration::from_millis(20)).await;
                slot.lock().await.map(|_| ())
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        drop(held);
        assert!(
            waiting.await.unwrap(),
            "the first waiter took the connection out"
        );
        assert!(matches!(
            closing_waiter.await.unwrap(),
            Err(StoreError::Closed)
        ));
        assert!(matches!(slot.lock().await, Err(StoreError::Closed)));
        assert!(matches!(slot.blocking_lock(), Err(StoreError::Closed)));
    }
}
