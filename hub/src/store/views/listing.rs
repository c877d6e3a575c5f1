//! Delivery listings that scale: filters (state, outcome, host, conversation, a time window),
//! either order, and keyset paging by queue position (`deliveries.n`) with a cursor, so a page
//! costs the same however deep it lies and nothing is silently cut off. And ids taken by a
//! unique prefix.

use crate::store::Store;
use crate::store::engine::params;
use crate::store::engine::{Db, dialect};
use crate::store::views::explain;
use crate::store::views::read::{DeliveryRow, delivery_row};
use crate::store::{StoreError, StoreResult};
use baton_shared::states::{DeliveryState, Outcome};

impl Store {
    /// The delivery an id or a unique prefix names.
    pub async fn resolve_delivery(&self, prefix: String) -> StoreResult<Resolved> {
        self.conns.read(move |c| resolve_delivery(c, &prefix)).await
    }

    /// One page of deliveries, each that is not final with its one-line reason judged by `judging`
    /// (and, with `short_ids`, its shortest unique id prefix), and the cursor of the next page.
    pub async fn deliveries_page(
        &self,
        q: ListQuery,
        judging: crate::store::views::pool_standing::Judging,
        short_ids: bool,
    ) -> StoreResult<(Vec<Listed>, Option<i64>)> {
        self.conns
            .read(move |c| {
                let page = page(c, &q)?;
                let mut explainer = explain::Explainer::new(c, judging)?;
                let mut listed = Vec::with_capacity(page.rows.len());
                for (row, cursor) in page.rows.into_iter().zip(page.cursors) {
                    let why = explainer.reason(&row)?;
                    let short_id = if short_ids { Some(short_id(c, &row.delivery_id)?) } else { None };
                    listed.push(Listed { row, why, cursor, short_id });
                }
                Ok((listed, page.next))
            })
            .await
    }
}

/// The most matches an ambiguous id prefix reports.
pub const PREFIX_MATCHES_SHOWN_MAX: usize = 10;

/// What `deliveries list` asks for.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    /// Only this state.
    pub state: Option<DeliveryState>,
    /// Only deliveries with this outcome (`read::outcome_sql`: the one word every listing,
    /// filter and `redrive` uses).
    pub outcome: Option<Outcome>,
    /// Only this host.
    pub host: Option<String>,
    /// Only this conversation.
    pub conversation: Option<String>,
    /// Only deliveries last changed at or after this time (unix ms).
    pub since_ms: Option<i64>,
    /// Only deliveries last changed before this time (unix ms).
    pub until_ms: Option<i64>,
    /// Newest first (else oldest first).
    pub newest: bool,
    /// Continue after this cursor (from the previous page).
    pub after: Option<i64>,
    /// At most this many rows.
    pub limit: u32,
}

/// A listed delivery, as `deliveries list` and `held list` show it.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The delivery.
    pub row: DeliveryRow,
    /// Why a delivery that is not final is where it is (`deliveries explain`'s one line).
    pub why: Option<crate::store::views::explain::Reason>,
    /// The cursor (`--after`) of the page that continues after this row.
    pub cursor: i64,
    /// The shortest unique prefix of its id (`short_id`), when the listing asked for it.
    pub short_id: Option<String>,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    /// The rows, in the asked order.
    pub rows: Vec<DeliveryRow>,
    /// Each row's position: the cursor (`--after`) of the page that continues after it.
    pub cursors: Vec<i64>,
    /// The cursor of the next page (`--after`), when more rows remain.
    pub next: Option<i64>,
}

const SELECT: &str = concat!(
    "SELECT ",
    crate::store::views::read::delivery_columns!(),
    ", d.n
    FROM deliveries d
    WHERE (CAST($1 AS TEXT) IS NULL OR d.state = $1) AND (CAST($2 AS TEXT) IS NULL OR d.host = $2) AND (CAST($3 AS TEXT) IS NULL OR d.conversation = $3)
      AND (CAST($4 AS BIGINT) IS NULL OR d.updated_at >= $4) AND (CAST($5 AS BIGINT) IS NULL OR d.updated_at < $5)
      AND (CAST($6 AS TEXT) IS NULL OR ",
    crate::store::views::read::outcome_sql!(),
    " = $6)"
);

/// One page of deliveries.
pub fn page(conn: &dyn Db, q: &ListQuery) -> StoreResult<Page> {
    let sql = if q.newest {
        format!("{SELECT} AND (CAST($7 AS BIGINT) IS NULL OR d.n < $7) ORDER BY d.n DESC LIMIT $8")
    } else {
        format!("{SELECT} AND (CAST($7 AS BIGINT) IS NULL OR d.n > $7) ORDER BY d.n LIMIT $8")
    };
    let mut rows: Vec<(DeliveryRow, i64)> = conn
        .prepare_cached(&sql)?
        .query_map(
            params![
                q.state.map(DeliveryState::as_str),
                q.host,
                q.conversation,
                q.since_ms,
                q.until_ms,
                q.outcome.map(Outcome::as_str),
                q.after,
                i64::from(q.limit) + 1,
            ],
            |r| Ok((delivery_row(r)?, r.get(11)?)),
        )?
        .collect::<Result<_, _>>()?;
    let more = rows.len() > q.limit as usize;
    rows.truncate(q.limit as usize);
    let next = if more { rows.last().map(|(_, n)| *n) } else { None };
    let (rows, cursors) = rows.into_iter().unzip();
    Ok(Page { rows, cursors, next })
}

/// What an id prefix names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolved {
    /// Exactly one delivery (or the prefix is a whole id).
    One(String),
    /// None.
    Nothing,
    /// Several: the first `PREFIX_MATCHES_SHOWN_MAX` of them, in id order.
    Many(Vec<String>),
}

/// The fewest characters a delivery id is shown with in a table (`--wide` shows it whole).
pub const SHORT_ID_CHARS_MIN: usize = 8;

/// How many deliveries have an id starting with `prefix` (0, 1, or 2 meaning "several").
fn ids_starting_with(conn: &dyn Db, prefix: &str) -> StoreResult<usize> {
    // The prefix is a piece of a stored id, so it holds no `*` or other GLOB metacharacter.
    let n: i64 = conn
        .prepare_cached(dialect::DELIVERY_PREFIX_COUNT.of(conn))?
        .query_row([format!("{prefix}*")], |r| r.get(0))?;
    Ok(usize::try_from(n).unwrap_or(2))
}

/// The shortest prefix of `id`, at least `SHORT_ID_CHARS_MIN` characters, that names it alone
/// in the record now: what every command taking a delivery id accepts. Ids made in one
/// millisecond share their first 13 characters (the time), so it is often longer than the
/// minimum; it is never longer than the id.
pub fn short_id(conn: &dyn Db, id: &str) -> StoreResult<String> {
    if id.len() <= SHORT_ID_CHARS_MIN || !id.is_ascii() {
        return Ok(id.to_string());
    }
    // Fewer ids share a longer prefix, so the shortest unique one is found by halving.
    let (mut lo, mut hi) = (SHORT_ID_CHARS_MIN, id.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if ids_starting_with(conn, &id[..mid])? <= 1 {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Ok(id[..lo].to_string())
}

/// Finds the delivery an id or a unique prefix of one names. A prefix may hold only the
/// characters ids are made of (letters, digits, `-`, `_`, `.`, `:`).
pub fn resolve_delivery(conn: &dyn Db, prefix: &str) -> StoreResult<Resolved> {
    if prefix.is_empty() || !prefix.chars().all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c)) {
        return Err(StoreError::Invalid(format!(
            "{prefix:?} is not a delivery id or a prefix of one (letters, digits, '-', '_', '.', ':')"
        )));
    }
    let exact: bool = conn
        .prepare_cached("SELECT EXISTS (SELECT 1 FROM deliveries WHERE id = $1)")?
        .query_row([prefix], |r| r.get(0))?;
    if exact {
        return Ok(Resolved::One(prefix.to_string()));
    }
    // The prefix holds no `*` or other GLOB metacharacter (checked above).
    let mut found: Vec<String> = conn
        .prepare_cached(dialect::DELIVERY_PREFIX_MATCHES.of(conn))?
        .query_map(params![format!("{prefix}*"), PREFIX_MATCHES_SHOWN_MAX as i64 + 1], |r| r.get(0))?
        .collect::<Result<_, _>>()?;
    Ok(match found.len() {
        0 => Resolved::Nothing,
        1 => Resolved::One(found.remove(0)),
        _ => {
            found.truncate(PREFIX_MATCHES_SHOWN_MAX);
            Resolved::Many(found)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::lifecycle::accept::testing::accept_one;
    use crate::store::testing;

    #[test]
    fn pages_follow_their_cursor_in_either_order_and_say_when_more_remain() {
        let db = testing::db();
        let c = &db.conn;
        for i in 0..5 {
            accept_one(c, "c", &format!("k{i}"), &["host-a"]);
        }
        let all: Vec<String> = c
            .prepare("SELECT id FROM deliveries ORDER BY n")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        for newest in [true, false] {
            let mut expected = all.clone();
            if newest {
                expected.reverse();
            }
            let mut seen = Vec::new();
            let mut q = ListQuery { newest, limit: 2, ..Default::default() };
            loop {
                let p = page(c, &q).unwrap();
                seen.extend(p.rows.iter().map(|r| r.delivery_id.clone()));
                match p.next {
                    Some(n) => q.after = Some(n),
                    None => break,
                }
            }
            assert_eq!(seen, expected, "newest: {newest}");
        }
        let exact = page(c, &ListQuery { limit: 5, ..Default::default() }).unwrap();
        assert_eq!((exact.rows.len(), exact.next), (5, None), "a page that holds the rest has no cursor");
        let none = page(c, &ListQuery { limit: 5, outcome: Some(Outcome::Failed), ..Default::default() }).unwrap();
        assert!(none.rows.is_empty());
        assert_eq!(exact.cursors.len(), 5);
        let after_second =
            page(c, &ListQuery { limit: 5, after: Some(exact.cursors[1]), ..Default::default() }).unwrap();
        assert_eq!(after_second.rows, exact.rows[2..], "a row's cursor continues after it");
    }

    #[test]
    fn a_short_id_is_the_shortest_unique_prefix_of_at_least_eight_characters() {
        let db = testing::db();
        let c = &db.conn;
        // Ids made in one millisecond share their time: a burst makes long common prefixes.
        for i in 0..40 {
            accept_one(c, "c", &format!("k{i}"), &["host-a", "host-b"]);
        }
        let ids: Vec<String> = c
            .prepare("SELECT id FROM deliveries")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let mut longest = 0;
        for id in &ids {
            let short = short_id(c, id).unwrap();
            assert!(id.starts_with(&short) && short.len() >= SHORT_ID_CHARS_MIN, "{short} of {id}");
            assert_eq!(resolve_delivery(c, &short).unwrap(), Resolved::One(id.clone()), "{short} names {id} alone");
            if short.len() > SHORT_ID_CHARS_MIN {
                let shorter = &id[..short.len() - 1];
                assert!(ids.iter().filter(|o| o.starts_with(shorter)).count() > 1, "{shorter} was already unique");
            }
            longest = longest.max(short.len());
        }
        assert!(longest < ids[0].len(), "shorter than a whole id: {longest}");
        assert_eq!(short_id(c, "short").unwrap(), "short");
    }

    #[test]
    fn a_prefix_names_one_delivery_or_is_ambiguous() {
        let db = testing::db();
        let c = &db.conn;
        accept_one(c, "c", "k", &["host-a", "host-b"]);
        c.execute_batch("PRAGMA foreign_keys = OFF").unwrap();
        c.execute("UPDATE deliveries SET id = 'abc1' WHERE host = 'host-a'", []).unwrap();
        c.execute("UPDATE deliveries SET id = 'abc2' WHERE host = 'host-b'", []).unwrap();
        assert_eq!(resolve_delivery(c, "abc1").unwrap(), Resolved::One("abc1".into()));
        assert_eq!(resolve_delivery(c, "abc").unwrap(), Resolved::Many(vec!["abc1".into(), "abc2".into()]));
        assert_eq!(resolve_delivery(c, "ab").unwrap(), Resolved::Many(vec!["abc1".into(), "abc2".into()]));
        assert_eq!(resolve_delivery(c, "x").unwrap(), Resolved::Nothing);
        assert!(matches!(resolve_delivery(c, "a*"), Err(StoreError::Invalid(_))));
    }
}
