//! The hubs a client may talk to: one or more base URLs over one shared record, and the one in
//! use now. A client talks to one hub at a time; when that hub cannot answer, its caller moves
//! it on to the next URL, round robin (`Client::advance_from`).
//!
//! A move is conditional on the hub the failed request went to still being the current one, so
//! that many requests failing together against one dead hub move the client once, not once
//! each (which would skip over the next hub without trying it).

use crate::error::ClientError;
use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// The base URLs, each `https://host[:port]` without a trailing slash, and which one is in use.
#[derive(Debug)]
pub(crate) struct Hubs {
    /// The base URLs in the order they were given; never empty, no two alike.
    urls: Vec<String>,
    /// The index into `urls` of the hub new requests go to.
    current: AtomicUsize,
    /// Moves made so far (`advance_from` calls that changed `current`).
    moves: AtomicU64,
}

impl Hubs {
    /// The hubs `urls`, starting with the first. The caller has checked each URL and that there
    /// is at least one, none twice.
    pub(crate) fn new(urls: Vec<String>) -> Hubs {
        assert!(!urls.is_empty(), "a client needs at least one hub URL");
        Hubs { urls, current: AtomicUsize::new(0), moves: AtomicU64::new(0) }
    }

    /// Every base URL, in order.
    pub(crate) fn urls(&self) -> &[String] {
        &self.urls
    }

    /// The index of the hub in use now.
    pub(crate) fn index(&self) -> usize {
        self.current.load(Ordering::SeqCst)
    }

    /// The base URL of the hub in use now.
    pub(crate) fn current(&self) -> &str {
        let i = self.index();
        // `current` only ever holds an index of `urls` (`new` and `advance_from`).
        &self.urls[i % self.urls.len()]
    }

    /// Moves to the hub after `from` (round robin) when `from` is still the hub in use, and
    /// returns the new index; `None` when another caller moved first or there is only one hub.
    pub(crate) fn advance_from(&self, from: usize) -> Option<usize> {
        if self.urls.len() < 2 {
            return None;
        }
        let next = (from + 1) % self.urls.len();
        self.current.compare_exchange(from, next, Ordering::SeqCst, Ordering::SeqCst).ok()?;
        self.moves.fetch_add(1, Ordering::SeqCst);
        Some(next)
    }

    /// How many times the client moved to another hub since it was built.
    pub(crate) fn moves(&self) -> u64 {
        self.moves.load(Ordering::SeqCst)
    }
}

/// Runs `call` against the hub in use, moving on from a hub that is unavailable
/// (`ClientError::hub_unavailable`) and calling `moved(from, to, error)` for each move this
/// makes. A request that hub certainly did not act on (no connection was made, or it answered
/// 503) is sent again at once to the next hub, until every hub was tried once: one round of
/// the list. Anything else ends the round and is returned as is: an answer, a refusal, or a
/// request whose answer was lost (`ClientError::answer_lost`), which its caller replays to the
/// next hub exactly as it would to the same one (the call's own idempotency). So a caller that
/// backs off after each failure backs off once per round of a list that does not answer, not
/// once per hub.
pub(crate) async fn round<T, F, Fut>(
    hubs: &Hubs,
    mut call: F,
    mut moved: impl FnMut(&str, &str, &ClientError),
) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, ClientError>>,
{
    let mut tries = 0;
    loop {
        let at = hubs.index();
        let answer = call().await;
        let error = match &answer {
            Err(e) if e.hub_unavailable() => e,
            _ => return answer,
        };
        if let Some(to) = hubs.advance_from(at) {
            moved(&hubs.urls[at % hubs.urls.len()], &hubs.urls[to], error);
        }
        tries += 1;
        if tries >= hubs.urls.len() || error.answer_lost() {
            return answer;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ApiError;
    use std::sync::Mutex;

    fn hubs(n: usize) -> Hubs {
        Hubs::new((0..n).map(|i| format!("https://hub{i}:7443")).collect())
    }

    #[test]
    fn moves_go_round_robin_and_are_counted() {
        let h = hubs(3);
        assert_eq!((h.index(), h.current(), h.moves()), (0, "https://hub0:7443", 0));
        assert_eq!(h.advance_from(0), Some(1));
        assert_eq!(h.advance_from(1), Some(2));
        assert_eq!(h.advance_from(2), Some(0), "after the last comes the first");
        assert_eq!((h.current(), h.moves()), ("https://hub0:7443", 3));
    }

    #[test]
    fn failures_of_one_hub_move_the_client_once() {
        let h = hubs(3);
        // Three requests sent to hub 0 fail together: the first moves, the others find the
        // client already moved and leave it at hub 1, which is tried before hub 2.
        assert_eq!(h.advance_from(0), Some(1));
        assert_eq!(h.advance_from(0), None);
        assert_eq!(h.advance_from(0), None);
        assert_eq!((h.index(), h.moves()), (1, 1));
    }

    #[test]
    fn a_single_hub_never_moves() {
        let h = hubs(1);
        assert_eq!(h.advance_from(0), None);
        assert_eq!((h.index(), h.moves()), (0, 0));
    }

    /// How each hub answers in `round_check`.
    #[derive(Clone, Copy)]
    enum Answer {
        /// Nothing listens: the request never left.
        Refused,
        /// It took the request and the answer was lost (a reset, a timeout).
        Lost,
        /// 503: it cannot serve now.
        Draining,
        /// 409 `stale_claim`: a refusal it decided.
        Refuses,
        /// It answers.
        Answers,
    }

    fn failure(a: Answer) -> Result<usize, ClientError> {
        let api = |status: u16, code: &str| {
            ClientError::Api(ApiError { status, code: None, code_text: code.into(), message: String::new() })
        };
        Err(match a {
            Answer::Refused => ClientError::Transport { detail: "connection refused".into(), maybe_sent: false },
            Answer::Lost => ClientError::Transport { detail: "reset".into(), maybe_sent: true },
            Answer::Draining => api(503, "shutting_down"),
            Answer::Refuses => api(409, "stale_claim"),
            Answer::Answers => return Ok(0),
        })
    }

    /// One round over hubs answering `answers`, starting at hub `start`: which hubs were
    /// called, in order, whether the round ended with an answer, the hub in use after it and
    /// the moves logged as (from, to).
    fn round_check(answers: &[Answer], start: usize) -> (Vec<usize>, bool, usize, Vec<(String, String)>) {
        let h = hubs(answers.len());
        for i in 0..start {
            h.advance_from(i);
        }
        let called = Mutex::new(Vec::new());
        let mut moves = Vec::new();
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let answer = rt.block_on(round(
            &h,
            || {
                let i = h.index();
                called.lock().unwrap().push(i);
                let a = answers[i];
                async move { failure(a) }
            },
            |from, to, _| moves.push((from.to_string(), to.to_string())),
        ));
        (called.into_inner().unwrap(), answer.is_ok(), h.index(), moves)
    }

    fn url(i: usize) -> String {
        format!("https://hub{i}:7443")
    }

    #[test]
    fn a_dead_hub_is_passed_over_within_one_call() {
        use Answer::*;
        let (called, ok, now, moves) = round_check(&[Refused, Answers], 0);
        assert_eq!((called, ok, now), (vec![0, 1], true, 1));
        assert_eq!(moves, vec![(url(0), url(1))]);
        // A draining hub (503) is passed over the same way, from wherever the round starts.
        let (called, ok, now, _) = round_check(&[Answers, Draining, Refused], 1);
        assert_eq!((called, ok, now), (vec![1, 2, 0], true, 0));
    }

    #[test]
    fn a_list_that_does_not_answer_fails_once_per_round() {
        use Answer::*;
        // Every hub is tried once, then the caller gets one failure (and backs off once);
        // the round has come back to where it began.
        let (called, ok, now, moves) = round_check(&[Refused, Draining, Refused], 0);
        assert_eq!((called, ok, now, moves.len()), (vec![0, 1, 2], false, 0, 3));
    }

    #[test]
    fn a_lost_answer_moves_on_but_goes_back_to_the_caller() {
        use Answer::*;
        // The hub may have acted: the caller replays it (or resyncs), at the next hub.
        let (called, ok, now, moves) = round_check(&[Lost, Answers], 0);
        assert_eq!((called, ok, now), (vec![0], false, 1));
        assert_eq!(moves, vec![(url(0), url(1))]);
    }

    #[test]
    fn a_refusal_or_an_answer_never_moves() {
        use Answer::*;
        for first in [Refuses, Answers] {
            let (called, _, now, moves) = round_check(&[first, Answers], 0);
            assert_eq!((called, now, moves.len()), (vec![0], 0, 0));
        }
    }

    #[test]
    fn a_single_hub_is_tried_once_as_before() {
        use Answer::*;
        let (called, ok, now, moves) = round_check(&[Refused], 0);
        assert_eq!((called, ok, now, moves.len()), (vec![0], false, 0, 0));
    }
}
