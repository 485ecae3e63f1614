//! [`PriorityGate`]: a counting semaphore whose waiters are served highest priority first, for
//! the CPU-bound work of the stage workers (decoding, inference). Under a backlog of `low`
//! steps, a `high` step waits for the next free slot only, not behind every queued low one.
//!
//! The priority of the running step is a task-local ([`with_priority`], set by the step
//! skeleton for each delivery from its lane; [`current_priority`] reads it, `normal` outside).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};

use imagepipe_contracts::Priority;
use tokio::sync::oneshot;

tokio::task_local! {
    static PRIORITY: Priority;
}

/// Runs `work` with `priority` as the current step's priority.
pub async fn with_priority<F: Future>(priority: Priority, work: F) -> F::Output {
    PRIORITY.scope(priority, work).await
}

/// The priority of the step this task runs (`normal` outside one).
pub fn current_priority() -> Priority {
    PRIORITY.try_with(|p| *p).unwrap_or_default()
}

struct State {
    free: usize,
    /// Waiters by priority, each in arrival order.
    waiting: [VecDeque<oneshot::Sender<()>>; 3],
}

/// A semaphore serving its waiters highest priority first (see the module docs).
#[derive(Clone)]
pub struct PriorityGate {
    state: Arc<Mutex<State>>,
}

/// A slot of a [`PriorityGate`], given back when dropped.
pub struct GateSlot {
    state: Arc<Mutex<State>>,
}

/// The process's CPU gate: one slot per core, shared by every stage of the process (the three
/// of `imagepipe run`), so CPU-bound steps never outnumber the cores and a high one is next.
pub fn cpu() -> &'static PriorityGate {
    static CPU: std::sync::OnceLock<PriorityGate> = std::sync::OnceLock::new();
    CPU.get_or_init(|| PriorityGate::new(std::thread::available_parallelism().map_or(1, |n| n.get())))
}

impl PriorityGate {
    /// A gate of `slots` slots (at least 1).
    pub fn new(slots: usize) -> Self {
        let waiting = [VecDeque::new(), VecDeque::new(), VecDeque::new()];
        Self { state: Arc::new(Mutex::new(State { free: slots.max(1), waiting })) }
    }

    /// A slot, for the current step's priority ([`current_priority`]).
    pub async fn acquire(&self) -> GateSlot {
        self.acquire_as(current_priority()).await
    }

    /// A slot for a step of `priority`: at once when one is free, else when every waiter of a
    /// higher priority, and every earlier one of the same, got one.
    pub async fn acquire_as(&self, priority: Priority) -> GateSlot {
        let waiting = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.free > 0 {
                state.free -= 1;
                None
            } else {
                let (tx, rx) = oneshot::channel();
                state.waiting[priority.index()].push_back(tx);
                Some(rx)
            }
        };
        if let Some(rx) = waiting {
            let mut wait = Waiting { rx: Some(rx), state: self.state.clone() };
            if let Some(rx) = wait.rx.as_mut() {
                // The sender goes only after handing the slot on, so this cannot fail.
                let _ = rx.await;
            }
            wait.rx = None;
        }
        GateSlot { state: self.state.clone() }
    }
}

/// A wait for a slot; dropped before it ends (its future cancelled), it gives back a slot that
/// was handed to it meanwhile.
struct Waiting {
    rx: Option<oneshot::Receiver<()>>,
    state: Arc<Mutex<State>>,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                drop(GateSlot { state: self.state.clone() });
            }
        }
    }
}

impl Drop for GateSlot {
    fn drop(&mut self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Hand the slot to the first waiter still waiting, highest priority first.
        for lane in 0..3 {
            while let Some(waiter) = state.waiting[lane].pop_front() {
                if waiter.send(()).is_ok() {
                    return;
                }
            }
        }
        state.free += 1;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_freed_slot_goes_to_the_highest_waiter_then_in_arrival_order() {
        let gate = PriorityGate::new(1);
        let held = gate.acquire_as(Priority::Low).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for (name, priority) in
            [("low1", Priority::Low), ("normal", Priority::Normal), ("low2", Priority::Low), ("high", Priority::High)]
        {
            let (gate, order) = (gate.clone(), order.clone());
            waiters.push(tokio::spawn(async move {
                let slot = gate.acquire_as(priority).await;
                order.lock().unwrap().push(name);
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(slot);
            }));
            tokio::task::yield_now().await;
        }
        drop(held);
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["high", "normal", "low1", "low2"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_wait_does_not_lose_the_slot() {
        let gate = PriorityGate::new(1);
        let held = gate.acquire_as(Priority::Normal).await;
        let cancelled = tokio::spawn({
            let gate = gate.clone();
            async move { drop(gate.acquire_as(Priority::High).await) }
        });
        tokio::task::yield_now().await;
        cancelled.abort();
        let _ = cancelled.await;
        drop(held);
        let again = tokio::time::timeout(Duration::from_secs(1), gate.acquire_as(Priority::Low)).await;
        assert!(again.is_ok(), "the slot came back to the gate");
    }

    #[tokio::test]
    async fn the_current_priority_is_the_scopes() {
        assert_eq!(current_priority(), Priority::Normal);
        assert_eq!(with_priority(Priority::High, async { current_priority() }).await, Priority::High);
    }
}
