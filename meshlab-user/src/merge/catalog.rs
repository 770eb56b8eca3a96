//! Any probe catalog (docs/probes.md): point names outside the standard chains, and points of
//! processes other than `client` and `server` (probed proxies such as `envoy-out`), placed into
//! a node's chain by time.
//!
//! All points of one node are on that node's clock, so a point placed between two chain
//! points splits their segment exactly (Σ = end-to-end still holds). A point of the client's
//! node that falls inside its wait for the other node is placed only when the contract says
//! which side of the wait it is on: a point naming a TCP connection (`conn` without
//! `unix_path`) with `dir: tx` marks the request leaving the node (it and every earlier point
//! of the wait join the chain before the wait), one with `dir: rx` the response arriving (it
//! and every later point join the chain after the wait). Any other point inside the wait, and
//! any point before the client's first or after its last point, is not placed; nor is a point
//! of the half's own process that falls between two kernel stages (it ran while the kernel
//! carried the message). Those are counted in `merge_summary.unplaced_points`, never silently
//! dropped.

use crate::schema::{ConnRef, Direction};

use super::chain::Point;
use super::custom_points;
use super::event::Stamp;
use super::segments::PointId;

/// The point id of a custom point name (`ROLE.NAME`); `None` past 65 536 distinct names.
pub fn intern(name: &str) -> Option<PointId> {
    custom_points::intern(name).map(PointId::Custom)
}

/// A probe point outside the standard chains, waiting to be placed into its node's chain.
#[derive(Clone, Debug)]
pub(crate) struct Extra {
    pub id: PointId,
    pub stamp: Stamp,
    /// The probe's `process`.
    pub process: String,
    /// Which side of a cross-node wait the point marks, if it names a TCP connection.
    pub tcp_dir: Option<Direction>,
}

impl Extra {
    pub fn new(
        id: PointId,
        stamp: Stamp,
        process: String,
        conn: Option<&ConnRef>,
        dir: Option<Direction>,
    ) -> Extra {
        let tcp = conn.is_some_and(|c| c.unix_path.is_none());
        Extra {
            id,
            stamp,
            process,
            tcp_dir: dir.filter(|_| tcp),
        }
    }
}

/// Places `extras` into a half's chain by time: `pre` (client: up to its wait; server: the
/// whole chain) and `post` (client: after its wait). `owners` is the half's process list
/// (index 0 = the half's own process); new processes are appended. Returns how many points
/// could not be placed.
pub fn place(
    pre: &mut Vec<Point>,
    post: &mut Vec<Point>,
    client: bool,
    extras: Vec<Extra>,
    owners: &mut Vec<String>,
) -> u64 {
    let mut extras = extras;
    extras.sort_by_key(|e| e.stamp.ns());
    let leaves = extras
        .iter()
        .rposition(|e| e.tcp_dir == Some(Direction::Tx));
    let arrives = extras.iter().position(|e| e.tcp_dir == Some(Direction::Rx));
    let bounds = |v: &[Point]| observed(v).map(|(a, b)| (a.min(b), a.max(b)));
    let spans = (bounds(pre), bounds(post));
    let mut unplaced = 0;
    for (i, e) in extras.into_iter().enumerate() {
        let t = e.stamp.ns();
        let owner = owner_of(owners, &e.process);
        let point = Point::seen(e.id, Some(e.stamp)).owned_by(owner);
        let part = if client {
            client_part(
                t,
                spans,
                leaves.is_some_and(|l| i <= l),
                arrives.is_some_and(|r| i >= r),
            )
        } else {
            Some(Part::Pre)
        };
        let target = match part {
            Some(Part::Pre) => Some(&mut *pre),
            Some(Part::Post) => Some(&mut *post),
            None => None,
        };
        let placed = target.is_some_and(|chain| insert_by_time(chain, point, owner == 0));
        if !placed {
            unplaced += 1;
        }
    }
    unplaced
}

/// First and last observed node times of a chain part.
type Span = (u64, u64);

enum Part {
    Pre,
    Post,
}

/// Which part of the client's chain a point at `t` joins: inside a part's observed span, or in
/// the wait before the request-leaving marker (`leaving`) / after the response-arriving one
/// (`arriving`); `None` when it cannot be told.
fn client_part(
    t: u64,
    (pre, post): (Option<Span>, Option<Span>),
    leaving: bool,
    arriving: bool,
) -> Option<Part> {
    let within = |span: Option<Span>| span.is_some_and(|(a, b)| t >= a && t <= b);
    if within(pre) || (leaving && pre.is_some_and(|(a, _)| t >= a)) {
        Some(Part::Pre)
    } else if within(post) || (arriving && post.is_some_and(|(_, b)| t <= b)) {
        Some(Part::Post)
    } else {
        None
    }
}

/// First and last observed times of a chain part.
fn observed(points: &[Point]) -> Option<(u64, u64)> {
    let mut seen = points.iter().filter_map(|p| p.stamp.map(|s| s.ns()));
    let first = seen.next()?;
    Some((first, seen.next_back().unwrap_or(first)))
}

fn owner_of(owners: &mut Vec<String>, process: &str) -> u8 {
    let at = owners.iter().position(|o| o == process).unwrap_or_else(|| {
        owners.push(process.to_owned());
        owners.len() - 1
    });
    u8::try_from(at).unwrap_or(u8::MAX)
}

/// Inserts `point` right after the last observed point not later than it. A point of the
/// half's own process (`own`) that falls between two kernel stages ran while the kernel
/// carried the message (e.g. a syscall's return while the data travels): it is not on the
/// request's path and is not inserted (returns false).
fn insert_by_time(chain: &mut Vec<Point>, point: Point, own: bool) -> bool {
    let t = point.stamp.map_or(0, |s| s.ns());
    let before = chain
        .iter()
        .rposition(|p| p.stamp.is_some_and(|s| s.ns() <= t));
    let after = chain
        .iter()
        .skip(before.map_or(0, |i| i + 1))
        .find(|p| p.stamp.is_some());
    let kernel = |p: &Point| !p.id.is_probe();
    if own && before.is_some_and(|i| kernel(&chain[i])) && after.is_some_and(kernel) {
        return false;
    }
    chain.insert(before.map_or(0, |i| i + 1), point);
    true
}
