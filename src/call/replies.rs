//! Recorded answers for retries. A request carrying `Idempotency-Key: K`
//! that matches a recorded call, or an OpenAI SDK retry
//! (`x-stainless-retry-count` >= 1) whose body is byte-identical to the last
//! call of its trajectory, gets the recorded answer instead of a new
//! generation, within `[trajectory] retry_window_s`. A retry that arrives
//! while the original is still running waits for it; if the original fails
//! or is cancelled (its client left before the last token), the first waiter
//! generates instead.
//!
//! An `Idempotency-Key` names one request: reused with another body (the
//! same JSON, however serialized, is the same body) it is refused, as
//! Stripe's keys are, rather than answered with the other request's call.
//!
//! Scope: the trajectory id the client named (path, header or body field),
//! or none when it named none (every such call is a trajectory of its own,
//! and only `Idempotency-Key` finds it again: a body names nobody's call).
//! Answers are kept in memory, bounded by count and bytes: a retry of a call
//! made before a gateway restart generates again.

use std::collections::{HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::watch;

use super::Answer;

/// Most answers kept, whatever their age.
const MAX_ANSWERS: usize = 100_000;
/// Most bytes of answers kept (approximate).
const MAX_BYTES: usize = 256 << 20;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Explicit { scope: Option<String>, key: String },
    Body { scope: Option<String>, hash: u64 },
}

/// What a request brings to the lookup.
#[derive(Debug, Clone)]
pub struct Request {
    /// The trajectory id the client named, if any.
    pub scope: Option<String>,
    /// `Idempotency-Key`.
    pub key: Option<String>,
    /// `x-stainless-retry-count` >= 1.
    pub retry: bool,
    pub body: Bytes,
}

impl Request {
    fn body_key(&self) -> Key {
        let mut h = rustc_hash::FxHasher::default();
        self.body.hash(&mut h);
        Key::Body {
            scope: self.scope.clone(),
            hash: h.finish(),
        }
    }

    fn explicit_key(&self) -> Option<Key> {
        self.key.as_ref().map(|k| Key::Explicit {
            scope: self.scope.clone(),
            key: k.clone(),
        })
    }
}

/// What a finished original hands its waiters: its answer and its body.
type Recorded = (Arc<Answer>, Bytes);

enum Slot {
    Running {
        owner: u64,
        rx: watch::Receiver<Option<Recorded>>,
    },
    Done {
        answer: Arc<Answer>,
        body: Bytes,
        at: Instant,
        /// What this entry counts in [`Inner::bytes`]: the answer and the
        /// request body.
        bytes: usize,
    },
}

#[derive(Default)]
struct Inner {
    slots: HashMap<Key, Slot>,
    /// Completion order, for expiry and the bounds.
    order: VecDeque<(Instant, Key)>,
    /// Per named trajectory: the body key of its last recorded call.
    latest: HashMap<String, Key>,
    bytes: usize,
    next_owner: u64,
}

pub struct Replies {
    inner: Mutex<Inner>,
    window: Duration,
    max_answers: usize,
    max_bytes: usize,
}

/// The outcome of a lookup.
pub enum Claim {
    /// Answer this recorded call again.
    Recorded(Arc<Answer>),
    /// Nothing recorded: generate, then [`Owner::complete`].
    Owner(Owner),
}

/// The `Idempotency-Key` names a recorded call of another request body.
#[derive(Debug)]
pub struct KeyReused;

/// The right (and duty) to generate for a set of keys. Dropping it without
/// completing releases the keys and wakes any waiter.
pub struct Owner {
    replies: Arc<Replies>,
    id: u64,
    keys: Vec<Key>,
    scope: Option<String>,
    body: Bytes,
    tx: watch::Sender<Option<Recorded>>,
}

impl Replies {
    pub fn new(window: Duration) -> Arc<Replies> {
        Self::bounded(window, MAX_ANSWERS, MAX_BYTES)
    }

    fn bounded(window: Duration, max_answers: usize, max_bytes: usize) -> Arc<Replies> {
        Arc::new(Replies {
            inner: Mutex::new(Inner::default()),
            window,
            max_answers,
            max_bytes,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Looks `req` up; waits for a running original. Without a key and
    /// without the retry header nothing is looked up, but the call is still
    /// registered so that its retries find it.
    pub async fn claim(self: &Arc<Self>, req: Request) -> Result<Claim, KeyReused> {
        let body_key = req.body_key();
        // A body names a call only within a named trajectory: without one,
        // two agents sending the same prompt (the samples of one group) are
        // told apart by nothing, and a retry of one must not be answered
        // with the other's call. Such calls are matched by key only.
        let by_body = req.scope.is_some();
        let lookup = match req.explicit_key() {
            Some(k) => Some(k),
            None if req.retry && by_body => Some(body_key.clone()),
            None => None,
        };
        loop {
            let mut wait = None;
            let mut keyed = None;
            {
                let mut inner = self.lock();
                inner.expire(self.window, self.max_answers, self.max_bytes);
                crate::metrics::retry_cache_bytes(inner.bytes);
                if let Some(key) = &lookup {
                    match inner.slots.get(key) {
                        // A key's body is compared out of the lock (it may
                        // need both bodies parsed).
                        Some(Slot::Done { answer, body, .. })
                            if matches!(key, Key::Explicit { .. }) =>
                        {
                            keyed = Some((answer.clone(), body.clone()));
                        }
                        Some(Slot::Done { answer, body, .. })
                            if inner.is_current(key, &req, body) =>
                        {
                            crate::metrics::replay();
                            return Ok(Claim::Recorded(answer.clone()));
                        }
                        Some(Slot::Running { rx, .. }) => wait = Some(rx.clone()),
                        _ => {}
                    }
                }
                if wait.is_none() && keyed.is_none() {
                    let id = inner.next_owner;
                    inner.next_owner += 1;
                    let (tx, rx) = watch::channel(None);
                    // The body key first: `complete` makes it the scope's latest.
                    let mut keys: Vec<Key> =
                        by_body.then(|| body_key.clone()).into_iter().collect();
                    keys.extend(req.explicit_key());
                    for k in &keys {
                        let replaced = inner.slots.insert(
                            k.clone(),
                            Slot::Running {
                                owner: id,
                                rx: rx.clone(),
                            },
                        );
                        if let Some(Slot::Done { bytes, .. }) = replaced {
                            inner.bytes -= bytes;
                        }
                    }
                    return Ok(Claim::Owner(Owner {
                        replies: self.clone(),
                        id,
                        keys,
                        scope: req.scope.clone(),
                        // A copy: the extracted body can be a view into the
                        // connection's read buffer, which it would keep alive.
                        body: Bytes::copy_from_slice(&req.body),
                        tx,
                    }));
                }
            }
            if let Some(mut rx) = wait {
                // The original finishes (its answer), or goes away (look
                // again: this request may generate).
                let done = rx
                    .wait_for(Option::is_some)
                    .await
                    .ok()
                    .and_then(|d| d.clone());
                keyed = done;
            }
            if let Some((answer, body)) = keyed {
                if same_request(&body, &req.body) {
                    crate::metrics::replay();
                    return Ok(Claim::Recorded(answer));
                }
                if matches!(lookup, Some(Key::Explicit { .. })) {
                    return Err(KeyReused);
                }
                // Another body behind the same body hash: not this
                // request's call; look again, and generate.
            }
        }
    }
}

/// Whether two request bodies are the same request: the same bytes, or the
/// same JSON value serialized another way.
fn same_request(a: &Bytes, b: &Bytes) -> bool {
    if a == b {
        return true;
    }
    let parse = |b: &Bytes| serde_json::from_slice::<serde_json::Value>(b).ok();
    matches!((parse(a), parse(b)), (Some(x), Some(y)) if x == y)
}

impl Inner {
    /// A recorded answer counts for `req` when the bodies are identical and
    /// it is the named trajectory's last call (for a key: when the bodies
    /// are the same request, checked before).
    fn is_current(&self, key: &Key, req: &Request, body: &Bytes) -> bool {
        match key {
            Key::Explicit { .. } => true,
            Key::Body { scope, .. } => {
                *body == req.body
                    && scope
                        .as_ref()
                        .is_some_and(|s| self.latest.get(s) == Some(key))
            }
        }
    }

    fn expire(&mut self, window: Duration, max_answers: usize, max_bytes: usize) {
        let now = Instant::now();
        while let Some((at, _)) = self.order.front() {
            let old = now.duration_since(*at) > window;
            if !old && self.order.len() <= max_answers && self.bytes <= max_bytes {
                break;
            }
            let Some((at, key)) = self.order.pop_front() else {
                break;
            };
            if let Some(Slot::Done { at: done_at, .. }) = self.slots.get(&key) {
                if *done_at == at {
                    if let Some(Slot::Done { bytes, .. }) = self.slots.remove(&key) {
                        self.bytes -= bytes;
                    }
                    if let Key::Body { scope: Some(s), .. } = &key {
                        if self.latest.get(s) == Some(&key) {
                            self.latest.remove(s);
                        }
                    }
                }
            }
        }
    }
}

impl Owner {
    /// Records the answer for the owned keys and wakes waiters.
    pub fn complete(self, answer: Arc<Answer>) {
        let at = Instant::now();
        let bytes = answer.approx_bytes() + self.body.len();
        {
            let mut inner = self.replies.lock();
            for k in &self.keys {
                let ours = matches!(inner.slots.get(k), Some(Slot::Running { owner, .. }) if *owner == self.id);
                if !ours {
                    continue;
                }
                inner.bytes += bytes;
                inner.slots.insert(
                    k.clone(),
                    Slot::Done {
                        answer: answer.clone(),
                        body: self.body.clone(),
                        at,
                        bytes,
                    },
                );
                inner.order.push_back((at, k.clone()));
            }
            if let (Some(scope), Some(k)) = (&self.scope, self.keys.first()) {
                inner.latest.insert(scope.clone(), k.clone());
            }
            crate::metrics::retry_cache_bytes(inner.bytes);
        }
        self.tx.send_replace(Some((answer, self.body.clone())));
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let mut inner = self.replies.lock();
        for k in &self.keys {
            let ours = matches!(inner.slots.get(k), Some(Slot::Running { owner, .. }) if *owner == self.id);
            if ours {
                inner.slots.remove(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(prompt_tokens: usize, text: &str) -> Arc<Answer> {
        Arc::new(Answer {
            request_id: "r".into(),
            created: 0,
            trajectory_id: "t".into(),
            prompts: vec![Arc::new(vec![7; prompt_tokens])],
            n: 1,
            choices: vec![super::super::ChoiceResult {
                text: text.into(),
                ids: vec![1; text.len()],
                ..Default::default()
            }],
            generated_in: Duration::ZERO,
        })
    }

    fn request(scope: &str, body: Bytes) -> Request {
        Request {
            scope: Some(scope.into()),
            key: None,
            retry: false,
            body,
        }
    }

    /// The bytes of every recorded entry, summed afresh.
    fn counted(inner: &Inner) -> usize {
        inner
            .slots
            .values()
            .map(|s| match s {
                Slot::Done { bytes, .. } => *bytes,
                Slot::Running { .. } => 0,
            })
            .sum()
    }

    /// The byte bound counts what an entry holds, request body included, so
    /// a stream of calls with large bodies keeps the cache under it; an
    /// entry replaced by a new call of the same body is counted out.
    #[tokio::test]
    async fn the_cache_stays_within_its_byte_bound_counting_bodies() {
        let bound = 1 << 20;
        let replies = Replies::bounded(Duration::from_secs(600), 1_000_000, bound);
        let body = Bytes::from(vec![b'x'; 64 * 1024]);
        let mut largest = 0;
        for i in 0..200 {
            let Ok(Claim::Owner(owner)) =
                replies.claim(request(&format!("t{i}"), body.clone())).await
            else {
                panic!("nothing recorded yet");
            };
            let a = answer(1000, "reply");
            largest = largest.max(a.approx_bytes() + body.len());
            owner.complete(a);
            let inner = replies.lock();
            assert!(inner.bytes <= bound + largest, "{} bytes", inner.bytes);
            assert_eq!(inner.bytes, counted(&inner));
        }
        // Each entry counts its body: 64 KiB bodies under a 1 MiB bound
        // leave at most 16 entries.
        assert!(replies.lock().slots.len() <= 17);
        // The same body again in one trajectory: the old entry is counted out.
        let again = request("same", Bytes::from_static(b"{}"));
        for _ in 0..3 {
            let Ok(Claim::Owner(owner)) = replies.claim(again.clone()).await else {
                panic!("not a retry: generates again");
            };
            owner.complete(answer(10, "r"));
        }
        let inner = replies.lock();
        assert_eq!(inner.bytes, counted(&inner));
    }
}
