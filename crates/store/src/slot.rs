//! The lock each connection sits behind.
//!
//! Statements run on the calling task's thread and nothing waits while a
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
//! A [`Slot`] is a lock that a task only ever *tries*: whoever asks
//! while it is free takes it at once, and a task that finds it held waits,
//! off the runtime's threads, for the holder's release to wake it (one
//! waiter per release, which then tries again). So the order is not
//! first-come: a waiter woken by a release may find the connection taken
//! again by a task that just arrived, and waits for the next release.
//!
//! The store's own thread (the checkpointer) blocks on a slot instead, and
//! must not be starved by tasks that keep taking it in turn: while it
//! waits, tasks find the slot busy, so it gets the connection at the next
//! release.
//!
//! A held connection is owned by its holder (taken out of the slot and put
//! back on release), so a future holding one is `Send`: a transaction's
//! statements are awaited one after another. On SQLite each of those awaits
//! is ready at once (the statement ran on the calling thread), so holding
//! is still a matter of microseconds.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

use rusqlite::Connection;
use tokio::sync::Notify;

use crate::{Result, StoreError};

/// Where a slot's connection is.
enum State {
    Free(Connection),
    Held,
    /// Taken out for closing.
    Closed,
}

/// One connection and the wake-ups of its waiters.
pub(crate) struct Slot {
    state: Mutex<State>,
    /// Wakes one task waiting in [`Slot::lock`] at each release.
    freed: Notify,
    /// Wakes the thread waiting in [`Slot::blocking_lock`].
    thread_freed: Condvar,
    /// A thread waits in [`Slot::blocking_lock`]: tasks keep off.
    thread_waiting: AtomicBool,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot").finish_non_exhaustive()
    }
}

/// A connection held for one statement or transaction; its drop puts it
/// back in the slot, then wakes one waiter.
pub(crate) struct Held<'a> {
    /// `Some` until dropped, or until taken out for closing.
    conn: Option<Connection>,
    slot: &'a Slot,
}

impl Slot {
    pub(crate) fn new(conn: Connection) -> Self {
        Self {
            state: Mutex::new(State::Free(conn)),
            freed: Notify::new(),
            thread_freed: Condvar::new(),
            thread_waiting: AtomicBool::new(false),
        }
    }

    /// The state, whose mutex is only ever held to move the connection in
    /// or out (no code that could panic runs under it).
    fn state(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
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

    /// The connection if it is free now (and no thread is waiting for it).
    pub(crate) fn try_lock(&self) -> Option<Result<Held<'_>>> {
        if self.thread_waiting.load(Ordering::Acquire) {
            return None;
        }
        self.take_free(&mut self.state())
    }

    /// Takes the connection out of `state` if it is free.
    fn take_free(&self, state: &mut State) -> Option<Result<Held<'_>>> {
        match std::mem::replace(state, State::Held) {
            State::Free(conn) => Some(Ok(Held {
                conn: Some(conn),
                slot: self,
            })),
            State::Held => None,
            State::Closed => {
                *state = State::Closed;
                Some(Err(StoreError::Closed))
            }
        }
    }

    /// The connection, blocking this thread until it is free: for threads
    /// of the store's own, never a runtime's.
    pub(crate) fn blocking_lock(&self) -> Result<Held<'_>> {
        self.thread_waiting.store(true, Ordering::Release);
        let mut state = self.state();
        let held = loop {
            if let Some(held) = self.take_free(&mut state) {
                break held;
            }
            state = self
                .thread_freed
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
        };
        drop(state);
        // Tasks that found the slot busy meanwhile wait for a release: this
        // thread's, when its `Held` drops.
        self.thread_waiting.store(false, Ordering::Release);
        held
    }

    /// Takes the connection out for closing; the slot answers
    /// [`StoreError::Closed`] from then on.
    pub(crate) async fn take(&self) -> Option<Connection> {
        let mut held = self.lock().await.ok()?;
        held.conn.take()
    }

    /// Whether nobody holds the connection (for the pool's metrics).
    pub(crate) fn is_idle(&self) -> bool {
        matches!(*self.state(), State::Free(_))
    }
}

impl Deref for Held<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        match &self.conn {
            Some(conn) => conn,
            // Only `take` and `drop` take the connection out, and nothing
            // reads it after either.
            None => unreachable!("a held slot holds a connection"),
        }
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Connection {
        match &mut self.conn {
            Some(conn) => conn,
            None => unreachable!("a held slot holds a connection"),
        }
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        *self.slot.state() = match self.conn.take() {
            Some(conn) => State::Free(conn),
            None => State::Closed,
        };
        self.slot.thread_freed.notify_one();
        self.slot.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::time::Duration;

    use super::*;

    /// Waits for every task, failing with `what` if one is still waiting
    /// after a minute.
    async fn all_finish(tasks: Vec<tokio::task::JoinHandle<()>>, what: &str) {
        tokio::time::timeout(Duration::from_secs(60), async {
            for task in tasks {
                task.await.unwrap();
            }
        })
        .await
        .expect(what);
    }

    /// Holds the slot on a thread of its own, from when this returns until
    /// the returned sender is dropped.
    fn held_by_a_thread(
        slot: &Arc<Slot>,
    ) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (release, released) = std::sync::mpsc::channel::<()>();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn({
            let slot = Arc::clone(slot);
            move || {
                let _held = slot.blocking_lock().unwrap();
                held_tx.send(()).unwrap();
                // Err once the sender is dropped: the release.
                let _ = released.recv();
            }
        });
        held_rx.recv().unwrap();
        (release, holder)
    }

    fn slot() -> Arc<Slot> {
        Arc::new(Slot::new(Connection::open_in_memory().unwrap()))
    }

    #[tokio::test]
    async fn a_task_waiting_for_a_slot_a_thread_holds_takes_it_when_the_thread_lets_go() {
        let slot = slot();
        let (release, holder) = held_by_a_thread(&slot);
        assert!(slot.try_lock().is_none(), "the thread holds it");
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(release);
        });
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
        all_finish(tasks, "every task got its turns").await;
        thread.join().unwrap();
        assert_eq!(turns.load(Ordering::SeqCst), (TASKS + 1) * TURNS);
    }

    /// Polls a future once, with a waker that does nothing: enough to
    /// have it queue for the slot without awaiting in the test.
    fn poll_once<F: std::future::Future>(future: std::pin::Pin<&mut F>) -> bool {
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        future.poll(&mut cx).is_pending()
    }

    #[tokio::test]
    async fn a_closed_slot_answers_closed_to_the_task_that_was_waiting_and_to_every_later_one() {
        let slot = slot();
        let held = slot.try_lock().unwrap().unwrap();
        let mut take = std::pin::pin!(slot.take());
        let mut waiting = std::pin::pin!(slot.lock());
        assert!(poll_once(take.as_mut()), "the take waits");
        assert!(poll_once(waiting.as_mut()), "so does the later lock");
        drop(held);
        assert!(
            take.await.is_some(),
            "the first waiter took the connection out"
        );
        assert!(matches!(waiting.await, Err(StoreError::Closed)));
        assert!(matches!(slot.lock().await, Err(StoreError::Closed)));
        assert!(matches!(slot.blocking_lock(), Err(StoreError::Closed)));
    }

    #[tokio::test]
    async fn a_waiter_woken_by_a_release_and_dropped_before_it_tries_passes_its_turn_on() {
        let slot = slot();
        let held = slot.try_lock().unwrap().unwrap();
        let mut first = Box::pin(slot.lock());
        let mut second = Box::pin(slot.lock());
        assert!(poll_once(first.as_mut()));
        assert!(poll_once(second.as_mut()));
        // The release wakes the first waiter, whose request then goes away
        // (a client hung up): the second must not wait for ever.
        drop(held);
        drop(first);
        let taken = tokio::time::timeout(Duration::from_secs(10), second)
            .await
            .expect("the dropped waiter's wake-up reached the next one");
        assert!(taken.is_ok());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thread_waiting_for_a_slot_gets_it_at_the_next_release_before_tasks_that_keep_trying()
    {
        let slot = slot();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        // A holder of its own, so that this test's future holds nothing.
        let (release, holder) = held_by_a_thread(&slot);
        let thread = std::thread::spawn({
            let (slot, order) = (Arc::clone(&slot), Arc::clone(&order));
            move || {
                let _held = slot.blocking_lock().unwrap();
                order.lock().unwrap().push("thread");
            }
        });
        while !slot.thread_waiting.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        // Tasks trying all the time, as a busy server's requests do: any of
        // them would take the slot the moment it is free, long before the
        // kernel has woken the waiting thread.
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let (slot, order) = (Arc::clone(&slot), Arc::clone(&order));
                tokio::spawn(async move {
                    loop {
                        if let Some(held) = slot.try_lock() {
                            let _held = held.unwrap();
                            order.lock().unwrap().push("task");
                            break;
                        }
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(release);
        holder.join().unwrap();
        all_finish(tasks, "every task got the slot after the thread").await;
        thread.join().unwrap();
        let order = order.lock().unwrap();
        assert_eq!(order.len(), 9);
        assert_eq!(order[0], "thread", "{order:?}");
    }
}
