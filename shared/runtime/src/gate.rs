//! [`PriorityGate`]: a counting semaphore whose waiters are served highest priority first, for
//! the CPU-bound work of the stage workers (decoding, inference). Under a backlog of `low`
//! steps, a `high` step waits for the next free slot only, not behind every queued low one.
//!
//! While `high` work is about (a `high` step began within [`HIGH_RESERVE`]), a gate of two slots
//! or more keeps one of them for it: lower steps take a slot only while another stays free, so
//! the next CPU-bound step of a `high` task does not wait for a running low one to end. Low
//! throughput dips only while `high` tasks are passing through.
//!
//! The priority of the running step is a task-local ([`with_priority`], set by the step
//! skeleton for each delivery from its lane; [`current_priority`] reads it, `normal` outside).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use imagepipe_contracts::Priority;
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How long a gate keeps a slot for `high` work after a `high` step began or took a slot.
pub const HIGH_RESERVE: Duration = Duration::from_millis(300);

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
    /// Whether the gate keeps a slot for `high` work (it has two or more).
    reserves: bool,
    /// Until when a slot is kept for `high` work.
    high_until: Option<Instant>,
    /// Waiters by priority, each in arrival order.
    waiting: [VecDeque<oneshot::Sender<()>>; 3],
}

impl State {
    /// Whether a slot is kept for `high` work at `now`.
    fn reserved(&self, now: Instant) -> bool {
        self.reserves && self.high_until.is_some_and(|until| now < until)
    }

    /// Whether a step of `priority` may take one of `free` slots at `now`.
    fn may_take(&self, priority: Priority, free: usize, now: Instant) -> bool {
        match priority {
            Priority::High => free > 0,
            _ if self.reserved(now) => free > 1,
            _ => free > 0,
        }
    }
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
        let slots = slots.max(1);
        Self { state: Arc::new(Mutex::new(State { free: slots, reserves: slots > 1, high_until: None, waiting })) }
    }

    /// Notes that `high` work is about: for [`HIGH_RESERVE`] from now, lower steps leave a slot
    /// free for it.
    pub fn note_high(&self) {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.high_until = Some(Instant::now() + HIGH_RESERVE);
    }

    /// A slot, for the current step's priority ([`current_priority`]).
    pub async fn acquire(&self) -> GateSlot {
        self.acquire_as(current_priority()).await
    }

    /// A slot for extra work of a step of `priority` (a second thread of a step already holding
    /// one), only if one is free now and nobody waits for it; never waits. A step uses an idle
    /// core this way; a step that comes meanwhile waits for that extra work alone, so keep it
    /// short (the metadata step holds it for one encode).
    pub fn try_acquire_as(&self, priority: Priority) -> Option<GateSlot> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let nobody_waits = state.waiting.iter().all(VecDeque::is_empty);
        if nobody_waits && state.may_take(priority, state.free, Instant::now()) {
            state.free -= 1;
            return Some(GateSlot { state: self.state.clone() });
        }
        None
    }

    /// A slot for a step of `priority`: at once when one is free, else when every waiter of a
    /// higher priority, and every earlier one of the same, got one.
    pub async fn acquire_as(&self, priority: Priority) -> GateSlot {
        if priority == Priority::High {
            self.note_high();
        }
        let rx = {
            let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            if state.may_take(priority, state.free, Instant::now()) {
                state.free -= 1;
                return GateSlot { state: self.state.clone() };
            }
            let (tx, rx) = oneshot::channel();
            state.waiting[priority.index()].push_back(tx);
            rx
        };
        let mut wait = Waiting { rx: Some(rx), state: self.state.clone() };
        loop {
            let rx = wait.rx.as_mut().expect("a wait holds its receiver until it ends");
            // A lower waiter also looks again when a kept slot may have come free: a slot kept
            // for `high` work is not handed on when the reservation lapses.
            let recheck = {
                let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                match state.high_until {
                    Some(until) if priority != Priority::High && state.reserves => until.max(Instant::now()),
                    _ if priority != Priority::High && state.reserves => Instant::now() + HIGH_RESERVE,
                    _ => Instant::now() + Duration::from_secs(3600),
                }
            };
            tokio::select! {
                // The sender goes only after handing the slot on, so this cannot fail.
                _ = &mut *rx => break,
                () = tokio::time::sleep_until(recheck) => {
                    let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
                    if state.may_take(priority, state.free, Instant::now()) {
                        rx.close();
                        // Handed a slot meanwhile (under this lock, so not any more): use it.
                        if rx.try_recv().is_err() {
                            state.free -= 1;
                        }
                        break;
                    }
                }
            }
        }
        wait.rx = None;
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
        // Hand the slot to the first waiter still waiting, highest priority first; a lower one
        // only if that leaves a slot free while one is kept for `high` work.
        for lane in 0..3 {
            if lane > Priority::High.index() && !state.may_take(Priority::Low, state.free + 1, Instant::now()) {
                break;
            }
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

    #[tokio::test(start_paused = true)]
    async fn while_high_work_is_about_lower_steps_leave_a_slot_free() {
        let gate = PriorityGate::new(2);
        gate.note_high();
        let first = gate.acquire_as(Priority::Low).await;
        let second = tokio::spawn({
            let gate = gate.clone();
            async move {
                let slot = gate.acquire_as(Priority::Normal).await;
                (Instant::now(), slot)
            }
        });
        tokio::task::yield_now().await;
        let high = tokio::time::timeout(Duration::from_millis(1), gate.acquire_as(Priority::High)).await;
        assert!(high.is_ok(), "the kept slot went to the high step at once");
        drop(high);
        // The normal step has its slot once the reservation lapses, not before.
        let noted = Instant::now();
        let (at, _slot) = second.await.unwrap();
        assert!(at >= noted + HIGH_RESERVE - Duration::from_millis(5), "the normal step waited for the reservation");
        drop(first);
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_of_one_slot_keeps_nothing_back() {
        let gate = PriorityGate::new(1);
        gate.note_high();
        let low = tokio::time::timeout(Duration::from_millis(1), gate.acquire_as(Priority::Low)).await;
        assert!(low.is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_spare_slot_is_taken_only_while_one_is_free() {
        let gate = PriorityGate::new(2);
        let _first = gate.acquire_as(Priority::Normal).await;
        let spare = gate.try_acquire_as(Priority::Normal).expect("the second slot is free");
        assert!(gate.try_acquire_as(Priority::High).is_none(), "no slot is left");
        drop(spare);
        assert!(gate.try_acquire_as(Priority::Normal).is_some(), "a spare goes back when dropped");
    }

    #[tokio::test(start_paused = true)]
    async fn a_spare_slot_never_goes_before_a_waiter() {
        let gate = PriorityGate::new(2);
        gate.note_high();
        let _low = gate.acquire_as(Priority::Low).await;
        let waiter = tokio::spawn({
            let gate = gate.clone();
            async move { gate.acquire_as(Priority::Low).await }
        });
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert!(!waiter.is_finished(), "the last slot is kept for high work");
        assert!(gate.try_acquire_as(Priority::High).is_none(), "a step waits for the free slot");
        waiter.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn a_spare_slot_of_a_low_step_leaves_the_high_reserve() {
        let gate = PriorityGate::new(2);
        gate.note_high();
        let _low = gate.acquire_as(Priority::Low).await;
        assert!(gate.try_acquire_as(Priority::Low).is_none(), "the last slot is kept for high work");
        assert!(gate.try_acquire_as(Priority::High).is_some());
    }

    #[tokio::test]
    async fn the_current_priority_is_the_scopes() {
        assert_eq!(current_priority(), Priority::Normal);
        assert_eq!(with_priority(Priority::High, async { current_priority() }).await, Priority::High);
    }
}
