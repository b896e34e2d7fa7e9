//! The engine thread: owns the llama.cpp model and context and runs the
//! continuous-batching loop.
//!
//! Owns: admission, the per-step batch (running sequences' next tokens plus
//! chunks of newcomers' prompts, in one `llama_decode`), stop conditions, and
//! sending events to each request's channel. The step itself (plan, decode,
//! score, sample, send) is in [`step`]; this file keeps the loop around it:
//! receiving, admitting, preempting and releasing sequences. Which cells a
//! sequence may reuse and when cells are freed is [`super::cells`]'s. Must
//! not: block on anything but its own command channel when idle, or touch
//! async code (it talks to tokio only through unbounded, non-blocking
//! senders).
//!
//! One sequence's state is `tokens` (prompt + generated) and `fed` (how many
//! of them are in the KV cache). Each step feeds `tokens[fed..]` (whole or a
//! chunk); when that reaches the end, the logits of the last row give the next
//! token. Prefill, decode, and recompute after preemption are the same path.
//!
//! Admin operations ([`Control`]) travel on the same channel as requests:
//! one is taken only when every request received before it has finished,
//! and no request behind it is read until it has run ([`Exit::Control`]
//! hands it to [`super::lifecycle`], which owns the model and context).
//!
//! A scoring job (the replay check's teacher-forced pass) is a sequence that
//! only prefills: every one of its rows asks for logits, row `p` scores token
//! `p + 1` ([`super::score::score_row`]), and once the whole sequence is fed
//! its scores are sent and it leaves the batch without sampling anything. It
//! is batched and chunked exactly like a prompt, next to running decodes.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc::UnboundedSender;

use super::cells::Cells;
use super::ffi::{Batch, Context, Grammar, Lora, Model};
use super::sampler::Sampler;
use super::score::PositionScore;
use super::step_sample;
use super::{EngineInfo, EngineSettings};
use crate::backend::{BackendError, GenEvent, SamplingParams};

mod step;

pub(crate) type EventTx = UnboundedSender<Result<GenEvent, BackendError>>;
/// The LoRA adapters the engine serves, by name.
pub(crate) type Loras = std::collections::BTreeMap<String, std::rc::Rc<Lora>>;
/// Every position's score of a scoring job (position 0: `None`), sent once.
pub(crate) type ScoreTx = UnboundedSender<Result<Vec<Option<PositionScore>>, BackendError>>;

/// Where a job's results go, which also says what the job is.
pub(crate) enum Reply {
    /// Generate: sampled tokens are streamed here.
    Generate(EventTx),
    /// Score the prompt (teacher-forced), generate nothing.
    Score(ScoreTx),
}

impl Reply {
    fn is_closed(&self) -> bool {
        match self {
            Reply::Generate(tx) => tx.is_closed(),
            Reply::Score(tx) => tx.is_closed(),
        }
    }

    /// Sends a generation event; false when the receiver is gone (or this
    /// is a scoring job, which has no events).
    fn event(&self, ev: GenEvent) -> bool {
        match self {
            Reply::Generate(tx) => tx.send(Ok(ev)).is_ok(),
            Reply::Score(_) => false,
        }
    }

    /// Sends an error (ignored when the receiver is gone).
    pub(crate) fn fail(&self, e: BackendError) {
        match self {
            Reply::Generate(tx) => {
                let _ = tx.send(Err(e));
            }
            Reply::Score(tx) => {
                let _ = tx.send(Err(e));
            }
        }
    }
}

/// A request handed to the engine thread.
pub(crate) struct Job {
    pub prompt: Vec<u32>,
    pub params: SamplingParams,
    /// GBNF grammar constraining the output (from a JSON schema).
    pub grammar: Option<String>,
    /// The LoRA adapter to generate with, by name; `None`: the model alone.
    pub adapter: Option<Arc<str>>,
    pub tx: Reply,
}

/// What the engine thread receives, in order. (Requests are nearly every
/// message: not boxed, which would cost an allocation each.)
#[allow(clippy::large_enum_variant)]
pub(crate) enum Msg {
    Job(Job),
    Control(Control, Ack),
}

/// An admin operation for the engine thread ([`super::lifecycle`]).
#[derive(Debug)]
pub(crate) enum Control {
    /// Level 1: free the KV cache (the context); level 2: unload the model too.
    Sleep {
        level: u32,
    },
    WakeUp,
    /// Load the weights of this GGUF file (same tokenizer) in place of the
    /// loaded ones.
    Reload {
        path: PathBuf,
    },
    /// Serve the LoRA GGUF at `path` as adapter `name` (new weights for a
    /// served name).
    LoadAdapter {
        name: String,
        path: PathBuf,
    },
    UnloadAdapter {
        name: String,
    },
}

/// The answer to a [`Control`]: a text for the admin report, or why not.
pub(crate) type Ack = tokio::sync::oneshot::Sender<Result<String, String>>;

/// Why [`Worker::run`] returned.
pub(crate) enum Exit {
    /// The command channel closed and all work is done.
    Closed,
    /// An admin operation, taken with no request running or waiting.
    Control(Control, Ack),
}

/// Counters shared with the handle (benchmarks, metrics).
#[derive(Debug, Default)]
pub struct EngineStats {
    /// Prompt (and recomputed) tokens fed through the model.
    pub prefill_tokens: AtomicU64,
    /// Tokens sampled.
    pub sampled_tokens: AtomicU64,
    /// `llama_decode` calls.
    pub steps: AtomicU64,
    /// Sequences preempted because the KV cache was full.
    pub preemptions: AtomicU64,
    /// Prompt tokens taken from cached cells instead of being fed.
    pub reused_tokens: AtomicU64,
    /// Batch-invariant mode: cache clears that recomputed the running
    /// sequences to free parked cells.
    pub compactions: AtomicU64,
    /// Nanoseconds of the counted steps (those `steps` counts; a failed
    /// decode's try is in none), in all: planning to releasing the finished
    /// sequences.
    pub step_ns: AtomicU64,
    /// Of `step_ns`: in `llama_decode` until its logits are ready.
    pub decode_ns: AtomicU64,
    /// Of `step_ns`: sampling the step's rows (their grammar masks
    /// included; a grammar's advance on the drawn token is not).
    pub sample_ns: AtomicU64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// State the handle and the thread share.
pub(crate) struct Shared {
    pub queued: AtomicUsize,
    pub alive: AtomicBool,
    /// Set while asleep (and from a sleep's request on): new requests are
    /// refused at the handle.
    pub asleep: AtomicBool,
    /// Set when the last handle is dropped: the worker ends the requests it
    /// runs or holds (with an error) at its next step instead of finishing
    /// them, so dropping the handle does not wait for whole generations.
    pub stopping: AtomicBool,
    /// Set while a weight update in `abort` mode waits for the worker: the
    /// generations it runs or holds end now with an `abort` finish (the
    /// gateway continues them on the new weights). Scoring jobs finish.
    pub aborting: AtomicBool,
    pub stats: EngineStats,
}

struct Seq {
    slot: i32,
    tokens: Vec<u32>,
    prompt_len: usize,
    fed: usize,
    params: SamplingParams,
    sampler: Sampler,
    /// llama.cpp's grammar sampler, used only to mask the logits row.
    grammar: Option<Grammar>,
    /// The LoRA adapter its tokens are computed with.
    lora: Option<std::rc::Rc<Lora>>,
    tx: Reply,
    /// A scoring job's results so far, by position (empty otherwise).
    scores: Vec<Option<PositionScore>>,
}

impl Seq {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn scoring(&self) -> bool {
        matches!(self.tx, Reply::Score(_))
    }

    /// Which weights its cells were computed with: 0 for the model alone,
    /// else its adapter's load.
    fn weights(&self) -> u64 {
        self.lora.as_ref().map_or(0, |l| l.key)
    }
}

pub(crate) struct Worker {
    batch: Batch,
    info: EngineInfo,
    settings: EngineSettings,
    shared: Arc<Shared>,
    /// In admission order (oldest first).
    running: Vec<Seq>,
    /// Not yet admitted; preempted sequences go back to the front.
    waiting: VecDeque<Seq>,
    cells: Cells,
    /// (index into `running`, batch row) of rows whose logits are read.
    rows: Vec<(usize, i32)>,
    /// (index into `running`, position, batch row) of scoring jobs' rows.
    score_rows: Vec<(usize, usize, i32)>,
    /// The threads a step's rows are sampled on (`settings.threads`).
    sampling: step_sample::Sampling,
    /// Steps taken: which adapter's sequences the next step runs, when
    /// the running ones use several ([`Worker::step`]).
    turn: usize,
}

impl Worker {
    pub(crate) fn new(info: EngineInfo, settings: EngineSettings, shared: Arc<Shared>) -> Worker {
        let n_batch = super::lifecycle::batch_rows(&settings);
        let sampling = step_sample::Sampling::new(settings.threads as usize);
        Worker {
            batch: Batch::new(n_batch as usize),
            cells: Cells::new(
                settings.max_batch,
                settings.kv_reuse,
                settings.batch_invariant,
            ),
            info,
            settings,
            shared,
            running: Vec::new(),
            waiting: VecDeque::new(),
            rows: Vec::new(),
            score_rows: Vec::new(),
            sampling,
            turn: 0,
        }
    }

    /// Runs requests until the channel closes (and all work is done) or an
    /// admin operation arrives (then runs what it already has, and returns
    /// the operation once idle).
    pub(crate) fn run(
        &mut self,
        ctx: &mut Context<'_>,
        rx: &Receiver<Msg>,
        model: &Arc<Model>,
        loras: &Loras,
    ) -> Exit {
        let mut open = true;
        let mut control: Option<(Control, Ack)> = None;
        // A new context: nothing is cached.
        self.cells.reset();
        loop {
            if self.shared.stopping.load(Ordering::SeqCst) {
                self.stop(rx, control.take());
                return Exit::Closed;
            }
            if self.running.is_empty() && self.waiting.is_empty() {
                if let Some((c, ack)) = control.take() {
                    return Exit::Control(c, ack);
                }
                if !open {
                    return Exit::Closed;
                }
                match rx.recv() {
                    Ok(msg) => self.receive(msg, model, loras, &mut control),
                    Err(_) => return Exit::Closed,
                }
            }
            while open && control.is_none() {
                match rx.try_recv() {
                    Ok(msg) => self.receive(msg, model, loras, &mut control),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            self.drop_cancelled(ctx);
            if self.shared.aborting.load(Ordering::SeqCst) {
                self.abort_generations(ctx);
            }
            self.admit(ctx);
            if self.running.is_empty() {
                continue;
            }
            self.step(ctx);
            if self.running.is_empty() && !self.cells.has_kept() {
                // Idle with nothing worth keeping: reset the cache so the next
                // sequences start at cell 0. llama.cpp attends over cells up
                // to the highest one in use, so a cache left fragmented makes
                // every later step slower.
                self.cells.clear(ctx);
            }
        }
    }

    /// Ends every request the worker runs, holds or has not read yet (with
    /// an error) and refuses the pending admin operation: the last handle
    /// is gone ([`Shared::stopping`]).
    fn stop(&mut self, rx: &Receiver<Msg>, control: Option<(Control, Ack)>) {
        const STOPPING: &str = "the engine is stopping";
        let error = || BackendError::Unreachable {
            backend: self.settings.name.clone(),
            message: STOPPING.into(),
        };
        for s in self.running.drain(..).chain(self.waiting.drain(..)) {
            s.tx.fail(error());
        }
        let mut acks: Vec<Ack> = control.map(|(_, ack)| ack).into_iter().collect();
        for msg in rx.try_iter() {
            match msg {
                Msg::Job(job) => job.tx.fail(error()),
                Msg::Control(_, ack) => acks.push(ack),
            }
        }
        for ack in acks {
            let _ = ack.send(Err(STOPPING.into()));
        }
    }

    fn receive(
        &mut self,
        msg: Msg,
        model: &Arc<Model>,
        loras: &Loras,
        control: &mut Option<(Control, Ack)>,
    ) {
        match msg {
            Msg::Job(job) => self.enqueue(job, model, loras),
            Msg::Control(c, ack) => *control = Some((c, ack)),
        }
    }

    fn enqueue(&mut self, job: Job, model: &Arc<Model>, loras: &Loras) {
        let lora = match job.adapter.as_deref() {
            None => None,
            Some(name) => match loras.get(name) {
                Some(l) => Some(l.clone()),
                None => {
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    job.tx.fail(BackendError::Rejected {
                        backend: self.settings.name.clone(),
                        message: format!("the engine serves no LoRA adapter `{name}`"),
                    });
                    return;
                }
            },
        };
        let grammar = match job.grammar.as_deref() {
            Some(g) => match Grammar::new(model, g, "root") {
                Ok(s) => Some(s),
                Err(e) => {
                    self.shared.queued.fetch_sub(1, Ordering::SeqCst);
                    job.tx.fail(BackendError::Rejected {
                        backend: self.settings.name.clone(),
                        message: format!("the output constraint's grammar is invalid: {e}"),
                    });
                    return;
                }
            },
            None => None,
        };
        let sampler = Sampler::new(&job.params, &job.prompt, self.settings.logprobs_mode);
        let scores = match job.tx {
            Reply::Score(_) => vec![None; job.prompt.len()],
            Reply::Generate(_) => Vec::new(),
        };
        self.waiting.push_back(Seq {
            scores,
            grammar,
            lora,
            slot: -1,
            prompt_len: job.prompt.len(),
            tokens: job.prompt,
            fed: 0,
            params: job.params,
            sampler,
            tx: job.tx,
        });
    }

    /// Cells the running sequences hold (a shared prefix counts for each).
    fn running_cells(&self) -> usize {
        self.running.iter().map(|s| s.fed).sum()
    }

    fn drop_cancelled(&mut self, ctx: &mut Context<'_>) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.tx.is_closed());
        let gone = before - self.waiting.len();
        self.shared.queued.fetch_sub(gone, Ordering::SeqCst);
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].tx.is_closed() {
                let seq = self.running.remove(i);
                self.release(ctx, &seq);
            } else {
                i += 1;
            }
        }
    }

    /// Ends every generation running or waiting with an `abort` finish;
    /// what each sampled so far was already sent.
    fn abort_generations(&mut self, ctx: &mut Context<'_>) {
        let abort = GenEvent::Done {
            finish_reason: crate::backend::FinishReason::Abort,
        };
        let before = self.waiting.len();
        self.waiting.retain(|s| {
            s.scoring() || {
                s.tx.event(abort.clone());
                false
            }
        });
        let gone = before - self.waiting.len();
        self.shared.queued.fetch_sub(gone, Ordering::SeqCst);
        let mut i = 0;
        while i < self.running.len() {
            if self.running[i].scoring() {
                i += 1;
                continue;
            }
            let seq = self.running.remove(i);
            seq.tx.event(abort.clone());
            self.release(ctx, &seq);
        }
    }

    /// A sequence left the batch: its cells are kept for reuse or let go.
    fn release(&mut self, ctx: &mut Context<'_>, seq: &Seq) {
        if seq.slot >= 0 {
            self.cells
                .finish(ctx, seq.slot, &seq.tokens[..seq.fed], seq.weights());
        }
    }

    /// Moves waiting sequences into the batch while slots and KV cells last;
    /// a newcomer whose prompt starts with cached tokens shares their cells.
    fn admit(&mut self, ctx: &mut Context<'_>) {
        let n_ctx = self.info.n_ctx as usize;
        while let Some(front) = self.waiting.front() {
            if self.running.len() >= self.settings.max_batch as usize {
                break;
            }
            let prefix = if front.scoring() {
                // Every row of a scoring job must be computed for its logits.
                None
            } else {
                // Cells are shared only between sequences of the same
                // weights (the model alone, or one load of an adapter).
                let weights = front.weights();
                let running = self
                    .running
                    .iter()
                    .filter(|s| s.weights() == weights)
                    .map(|s| (s.slot, &s.tokens[..s.fed]));
                self.cells.find_prefix(&front.tokens, weights, running)
            };
            let reused = prefix.as_ref().map_or(0, |p| p.len);
            // Cells the running set needs to finish feeding what it already
            // has, plus one decode token each, plus the newcomer's tokens.
            let pending: usize = self
                .running
                .iter()
                .map(|s| s.tokens.len() - s.fed + 1)
                .sum();
            let need = self.running_cells() + pending + front.tokens.len() - reused + 1;
            if need > n_ctx && !self.running.is_empty() {
                break;
            }
            let Some(slot) = self.cells.take_id() else {
                break;
            };
            let Some(mut seq) = self.waiting.pop_front() else {
                break;
            };
            self.shared.queued.fetch_sub(1, Ordering::SeqCst);
            seq.slot = slot;
            seq.fed = 0;
            if let Some(p) = prefix {
                self.cells.share(ctx, &p, slot);
                seq.fed = p.len;
                self.shared
                    .stats
                    .reused_tokens
                    .fetch_add(p.len as u64, Ordering::Relaxed);
                crate::metrics::engine_reused_tokens(&self.settings.name, p.len);
            }
            self.running.push(seq);
        }
    }

    /// Sends the newest running sequence back to the waiting queue, clearing
    /// its KV cells; it is recomputed from its tokens when re-admitted.
    fn preempt_newest(&mut self, ctx: &mut Context<'_>) -> bool {
        if self.running.len() <= 1 {
            return false;
        }
        let Some(mut seq) = self.running.pop() else {
            return false;
        };
        self.cells.discard(ctx, seq.slot);
        seq.slot = -1;
        seq.fed = 0;
        self.shared.queued.fetch_add(1, Ordering::SeqCst);
        self.shared
            .stats
            .preemptions
            .fetch_add(1, Ordering::Relaxed);
        self.waiting.push_front(seq);
        crate::metrics::engine_preemption(&self.settings.name);
        true
    }

    /// Batch-invariant mode: clears the cache, which frees parked cells, and
    /// has every running sequence computed again from its tokens.
    fn compact(&mut self, ctx: &mut Context<'_>) {
        self.cells.clear(ctx);
        for s in &mut self.running {
            s.fed = 0;
        }
        self.shared
            .stats
            .compactions
            .fetch_add(1, Ordering::Relaxed);
        crate::metrics::engine_compaction(&self.settings.name);
    }
}
