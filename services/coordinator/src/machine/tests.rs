//! The whole machine: every step in order, priorities across the steps, the state graph, and
//! random interleavings of every input that keep every invariant.

use proptest::prelude::*;

/// A step's worker output, as other modules' tests (the controls', the store suite) name it.
pub(crate) use crate::machine::fixtures::output;
use crate::machine::fixtures::*;

#[test]
fn the_happy_path_runs_every_step_in_order_and_completes_once() {
    let mut task = new_task();
    let d = apply(&task, Input::Start, 2_000);
    assert_eq!(queues(&d), ["tasks.download"]);
    let command: DownloadCommand = serde_json::from_str(&d.outbox[0].body).unwrap();
    assert_eq!(command.attempt, 1);
    task = d.task;
    assert_eq!(task.state, TaskState::Downloading);

    let d = apply(&task, ok(Step::Download, 1), 3_000);
    assert_eq!(queues(&d), ["tasks.metadata"]);
    let command: MetadataCommand = serde_json::from_str(&d.outbox[0].body).unwrap();
    assert_eq!(command.blob_key, BLOB);
    task = d.task;
    let d = apply(&task, ok(Step::Metadata, 1), 4_000);
    assert_eq!(queues(&d), ["tasks.ai"]);
    task = d.task;
    let d = apply(&task, ok(Step::Analyze, 1), 5_000);
    assert_eq!(d.task.state, TaskState::Completed);
    assert_eq!(events(&d), ["task.completed"]);
    let event: Event<TaskCompleted> = Event::from_json(d.outbox[0].body.as_bytes()).unwrap();
    assert_eq!(event.payload.duration_ms, 4_000);
    assert_eq!(d.task.version, 5);
    assert!(d.task.timer.is_none());

    let again = decide(&d.task, &ok(Step::Analyze, 1), &ctx(6_000), &policy()).unwrap();
    assert_eq!(again, Verdict::Ignore(Ignored::StaleResult));
}

// --- priorities -----------------------------------------------------------------------------

#[test]
fn a_high_priority_task_sends_every_step_to_the_high_lanes() {
    let d = apply(&task_of(Priority::High), Input::Start, 0);
    assert_eq!(queues(&d), ["tasks.download.high"]);
    let d = apply(&d.task, ok(Step::Download, 1), 1);
    assert_eq!(queues(&d), ["tasks.metadata.high"]);
    let d = apply(&d.task, ok(Step::Metadata, 1), 2);
    assert_eq!(queues(&d), ["tasks.ai.high"]);
    // a retry stays in its lane
    let d = apply(&d.task, retryable(Step::Analyze, 1), 3);
    let d = apply(&d.task, Input::Timer(d.task.timer.unwrap()), 100_000);
    assert_eq!(queues(&d), ["tasks.ai.high"]);
}

#[test]
fn normal_and_low_priority_tasks_use_the_plain_queue_and_the_low_lane() {
    let d = apply(&task_of(Priority::Normal), Input::Start, 0);
    assert_eq!(queues(&d), ["tasks.download"]);
    let d = apply(&d.task, ok(Step::Download, 1), 1);
    assert_eq!(queues(&d), ["tasks.metadata"]);

    let d = apply(&task_of(Priority::Low), Input::Start, 0);
    assert_eq!(queues(&d), ["tasks.download.low"]);
    let d = apply(&d.task, ok(Step::Download, 1), 1);
    assert_eq!(queues(&d), ["tasks.metadata.low"]);
}

#[test]
fn every_edge_of_the_state_graph_is_known() {
    use TaskState::*;
    assert!(Queued.can_become(Downloading));
    assert!(!Queued.can_become(Analyzing));
    assert!(!Downloading.can_become(Queued));
    assert!(Analyzing.can_become(Cancelled));
    assert!(!Completed.can_become(Failed));
    assert!(!Failed.can_become(Failed));
}

/// One step of a random interleaving.
#[derive(Debug, Clone)]
enum Op {
    Start,
    Result {
        step: Step,
        attempt_offset: i8,
        /// 0, 1: ok; 2: retryable; 3: permanent; 4: deferred.
        kind: u8,
    },
    /// Fire the task's current timer at its due time.
    FireTimer,
    /// Fire a timer that is not (or no longer) the task's.
    FireStale {
        kind: bool,
        step: Step,
        attempt: u32,
    },
    /// Redeliver the last result.
    Duplicate,
    Cancel,
    Pause,
    Resume,
    Reprocess {
        from: Step,
        priority: Option<Priority>,
    },
    /// An operator pauses or resumes the queue of a step.
    ToggleQueue(Step),
    /// The bus lost the commands in flight.
    Redispatch,
    Advance(u32),
}

fn op() -> impl Strategy<Value = Op> {
    let step = prop_oneof![Just(Step::Download), Just(Step::Metadata), Just(Step::Analyze)];
    let priority =
        prop_oneof![Just(None), Just(Some(Priority::High)), Just(Some(Priority::Normal)), Just(Some(Priority::Low))];
    prop_oneof![
        1 => Just(Op::Start),
        7 => (step.clone(), -2i8..=1, 0u8..5).prop_map(|(step, attempt_offset, kind)| Op::Result { step, attempt_offset, kind }),
        3 => Just(Op::FireTimer),
        1 => (any::<bool>(), step.clone(), 0u32..5).prop_map(|(kind, step, attempt)| Op::FireStale { kind, step, attempt }),
        2 => Just(Op::Duplicate),
        1 => Just(Op::Cancel),
        1 => Just(Op::Pause),
        1 => Just(Op::Resume),
        1 => (step.clone(), priority).prop_map(|(from, priority)| Op::Reprocess { from, priority }),
        1 => step.prop_map(Op::ToggleQueue),
        1 => Just(Op::Redispatch),
        1 => (0u32..120_000).prop_map(Op::Advance),
    ]
}

fn check_task(task: &Task, policy: &Policy) {
    // Attempt `attempt` of `step` is within the current generation's retry budget.
    let in_budget = |step: Step, attempt: u32| {
        let used = attempt.saturating_sub(task.steps.get(step).attempt_base);
        assert!(used >= 1 && used <= policy.step(step).max_attempts, "{step} attempt {attempt}: {:?}", task.steps);
    };
    match (task.state, task.timer) {
        (TaskState::Queued, None) => {}
        (TaskState::Paused, None) => {
            let at = task.paused.as_ref().expect("a paused task knows where it stopped");
            if let Some(step) = at.step {
                let attempts = task.steps.get(step).attempts;
                assert!(at.attempt == attempts || at.attempt == attempts + 1, "paused at {at:?}, {attempts} sent");
                in_budget(step, at.attempt);
            }
        }
        (s, None) if s.is_terminal() => assert!(task.pause_requested.is_none(), "a finished task pauses no more"),
        (s, Some(timer)) if s.step() == Some(timer.step) => {
            let record = task.steps.get(timer.step);
            match timer.kind {
                TimerKind::Deadline => assert_eq!(timer.attempt, record.attempts),
                TimerKind::Retry => assert!(
                    timer.attempt == record.attempts + 1 || (timer.attempt == record.attempts && record.deferrals > 0),
                    "{timer:?} with {record:?}"
                ),
            }
            in_budget(timer.step, timer.attempt);
        }
        (s, t) => panic!("state {s} with timer {t:?} loses the task"),
    }
    if !task.state.is_terminal() && task.state != TaskState::Paused {
        assert!(task.paused.is_none(), "a running task is not paused");
    }
    if task.state == TaskState::Completed {
        assert!(task.outputs.download.is_some() && task.outputs.metadata.is_some() && task.outputs.analysis.is_some());
    }
    if task.state == TaskState::Failed {
        assert!(task.failure.is_some());
    }
}

/// Why `input` has no edge from `task`'s state, when the interleavings can produce such an
/// input: a cancel or pause of a finished task, a reprocessing of an unfinished one or of one
/// lacking an earlier step's output, or a result the task cannot have asked for (before the
/// start, for a later step, for an attempt never dispatched, or with another step's output).
/// [`decide`] must refuse exactly these with an [`IllegalTransition`].
fn expected_illegal(task: &Task, input: &Input) -> Option<&'static str> {
    match input {
        Input::Cancel { .. } if task.state.is_terminal() => Some("cancel of a finished task"),
        Input::Pause { .. } if task.state.is_terminal() => Some("pause of a finished task"),
        Input::Resume if task.state.is_terminal() => Some("resume of a finished task"),
        Input::Reprocess { .. } if !task.state.is_terminal() => Some("reprocessing of an unfinished task"),
        Input::Reprocess { from, .. } => {
            let outputs = &task.outputs;
            let lacks = (*from > Step::Download && outputs.download.is_none())
                || (*from > Step::Metadata && outputs.metadata.is_none());
            lacks.then_some("reprocessing without an earlier step's output")
        }
        Input::Result(result) if !task.state.is_terminal() => {
            let wrong_output = matches!(&result.outcome, StepOutcome::Ok { output } if !output.belongs_to(result.step));
            match task.state.step() {
                _ if result.attempt == 0 => Some("attempt 0"),
                _ if wrong_output => Some("another step's output"),
                None if task.state == TaskState::Paused => None,
                None => Some("result before the start"),
                Some(current) if result.step > current => Some("result for a later step"),
                Some(current) if result.step == current && result.attempt > task.steps.get(current).attempts => {
                    Some("result for an attempt never dispatched")
                }
                Some(_) => None,
            }
        }
        _ => None,
    }
}

/// The attempt in a command's body.
fn attempt_of(entry: &OutboxEntry) -> u32 {
    let body: serde_json::Value = serde_json::from_str(&entry.body).unwrap();
    u32::try_from(body["attempt"].as_u64().unwrap()).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn random_interleavings_keep_every_invariant(ops in prop::collection::vec(op(), 0..80), seed in any::<u64>()) {
        let policy = policy();
        let mut task = new_task();
        let mut now = 1_000u64;
        let mut paused_queues: Vec<Step> = Vec::new();
        let mut last_result: Option<Input> = None;
        // Per generation: terminal events and task.completed events published.
        let mut terminal_events = 0;
        let mut completed_events = 0;
        // Over the whole run: every command sent (a broker drops a repeated id) and every event.
        let mut command_ids = std::collections::HashSet::new();
        let mut event_ids = std::collections::HashSet::new();
        // In a quarter of the runs the metadata queue keeps a backlog: its deadlines never fire.
        let held = if seed % 4 == 0 { HeldSteps::default().with(Step::Metadata, Held::Undated) } else { HeldSteps::default() };
        let mut step = |task: &mut Task, input: Input, now: u64, paused: PausedSteps, held: HeldSteps| {
            let before = task.clone();
            let decided = decide(task, &input, &Context { now, seed, paused, held }, &policy);
            if let Some(why) = expected_illegal(&before, &input) {
                assert!(decided.is_err(), "{input:?} on a {} task ({why}) was not refused: {decided:?}", before.state);
                return;
            }
            match decided {
                Err(error) => panic!("{input:?} on a {} task: unexpected {error}", before.state),
                Ok(Verdict::Apply(d)) => {
                    let reprocess = matches!(input, Input::Reprocess { .. });
                    assert_eq!(before.state.is_terminal(), reprocess, "{input:?} changed a {} task", before.state);
                    assert!(before.state.can_become(d.task.state), "{} -> {}", before.state, d.task.state);
                    assert_eq!(d.task.version, before.version + 1);
                    assert_eq!((d.history.version, d.history.to), (d.task.version, d.task.state));
                    check_task(&d.task, &policy);
                    if let Some(t @ Timer { kind: TimerKind::Deadline, .. }) = d.task.timer {
                        let postponed = before.timer.is_some_and(|b| {
                            (b.kind, b.step, b.attempt) == (TimerKind::Deadline, t.step, t.attempt)
                        });
                        let lane = d.task.priority.lane(t.step.queue());
                        assert!(
                            postponed || d.outbox.iter().any(|e| e.destination == Destination::Queue(lane.clone()) && attempt_of(e) == t.attempt),
                            "attempt dispatched without a command on {lane}: {:?}", d.outbox
                        );
                    }
                    for entry in &d.outbox {
                        match &entry.destination {
                            Destination::Queue(_) if matches!(input, Input::Redispatch) => {
                                assert!(command_ids.contains(&entry.message_id), "a redispatch re-sends what was sent");
                            }
                            Destination::Queue(_) => {
                                assert_ne!(d.task.state, TaskState::Paused, "a paused task sends nothing");
                                assert!(command_ids.insert(entry.message_id.clone()), "command id {} sent twice", entry.message_id);
                            }
                            Destination::Event(_) => {
                                assert!(event_ids.insert(entry.message_id.clone()), "event id {} published twice: {:?}", entry.message_id, events(&d));
                            }
                        }
                    }
                    if reprocess {
                        (terminal_events, completed_events) = (0, 0);
                    }
                    let evs = events(&d);
                    terminal_events += evs.iter().filter(|e| ["task.completed", "task.failed", "task.cancelled"].contains(e)).count();
                    completed_events += evs.iter().filter(|e| **e == "task.completed").count();
                    assert_eq!(d.task.state.is_terminal(), terminal_events == 1);
                    assert!(completed_events <= 1);
                    *task = d.task;
                }
                Ok(Verdict::Ignore(_)) => {}
            }
        };
        for op in ops {
            let input = match op {
                Op::Start => Input::Start,
                Op::Result { step, attempt_offset, kind } => {
                    let base = i64::from(task.steps.get(step).attempts);
                    let attempt = u32::try_from((base + i64::from(attempt_offset)).max(1)).unwrap();
                    let input = match kind {
                        0 | 1 => ok(step, attempt),
                        2 => retryable(step, attempt),
                        3 => permanent(step, attempt),
                        _ => deferred(step, attempt, 2_000),
                    };
                    last_result = Some(input.clone());
                    input
                }
                Op::FireTimer => match task.timer {
                    Some(timer) => {
                        now = now.max(timer.due_at);
                        Input::Timer(timer)
                    }
                    None => continue,
                },
                Op::FireStale { kind, step, attempt } => {
                    let kind = if kind { TimerKind::Deadline } else { TimerKind::Retry };
                    let timer = Timer { kind, step, attempt, due_at: now };
                    if task.timer.is_some_and(|t| Timer { due_at: now, ..t } == timer) {
                        continue;
                    }
                    Input::Timer(timer)
                }
                Op::Duplicate => match &last_result {
                    Some(input) => input.clone(),
                    None => continue,
                },
                Op::Cancel => Input::Cancel { reason: None },
                Op::Pause => Input::Pause { reason: None },
                Op::Resume => Input::Resume,
                Op::Reprocess { from, priority } => Input::Reprocess { from, priority },
                Op::ToggleQueue(queue) => {
                    match paused_queues.iter().position(|s| *s == queue) {
                        Some(i) => drop(paused_queues.remove(i)),
                        None => paused_queues.push(queue),
                    }
                    continue;
                }
                Op::Redispatch => Input::Redispatch,
                Op::Advance(ms) => {
                    now += u64::from(ms);
                    continue;
                }
            };
            let mut paused = PausedSteps::of(paused_queues.iter().copied());
            // In a third of the runs the paused queues run nothing: a cancel there is at once.
            if seed % 3 == 1 {
                paused = paused_queues.iter().fold(paused, |paused, step| paused.idle(*step));
            }
            step(&mut task, input, now, paused, held.clone());
        }
        // Liveness: once operators resume the task and its queues and the queues drain, timers
        // alone (no worker answering) bring every task to an end.
        for _ in 0..32 {
            if task.state.is_terminal() {
                break;
            }
            let input = match task.timer {
                Some(timer) => {
                    now = now.max(timer.due_at);
                    Input::Timer(timer)
                }
                None if task.state == TaskState::Paused => Input::Resume,
                None => Input::Start,
            };
            step(&mut task, input, now, PausedSteps::default(), HeldSteps::default());
        }
        prop_assert!(task.state.is_terminal(), "task stuck in {}", task.state);
        prop_assert_eq!(terminal_events, 1);
    }
}
