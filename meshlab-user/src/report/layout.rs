//! Where to draw each segment of one request (waterfall, Perfetto).
//!
//! The client node's segments sit at their true times on the client's clock (start_ns minus
//! the request's start, both on the client's CLOCK_MONOTONIC). Another node's clock is never
//! compared with the client's: its segments keep their spacing on their own clock, and the
//! block they form is *centred for display* in the client's longest idle gap (the time the
//! client spent waiting for the peer). A derived cross-node segment (difference method) is
//! drawn as two halves filling that gap either side of the peer's block: where the request
//! and the response were on the wire if both directions took equally long. Both placements are
//! marked `exact: false` and labelled as display-only wherever they are drawn.

use crate::schema::MergedRequest;

/// One drawable piece of a segment (derived segments give two).
#[derive(Clone, Debug, PartialEq)]
pub struct Placed {
    /// Index into `request.segments`.
    pub segment: usize,
    /// Lane: a node name, or `derived`.
    pub lane: String,
    /// Display position in ns after the request's start on the client's clock.
    pub x0: i128,
    pub x1: i128,
    /// True when the position is the segment's own time on the client's clock.
    pub exact: bool,
    /// For split derived segments: (1, 2) = first half, (2, 2) = second half.
    pub part: Option<(u8, u8)>,
}

pub const DERIVED_LANE: &str = "derived";

/// Lanes in drawing order: the client node, other nodes in order of appearance, `derived`.
pub fn lanes(req: &MergedRequest) -> Vec<String> {
    let mut out = vec![req.client_node.clone()];
    let mut has_derived = false;
    for s in &req.segments {
        match &s.node {
            Some(n) if s.derived.is_none() => {
                if !out.iter().any(|o| o == n) {
                    out.push(n.to_string());
                }
            }
            _ => has_derived = true,
        }
    }
    if has_derived {
        out.push(DERIVED_LANE.into());
    }
    out
}

pub fn place(req: &MergedRequest) -> Vec<Placed> {
    let mut placed: Vec<Option<Placed>> = vec![None; req.segments.len()];
    let gap = place_client(req, &mut placed);
    for node in lanes(req).into_iter().skip(1).filter(|l| l != DERIVED_LANE) {
        place_peer(req, &node, gap, &mut placed);
    }
    place_the_rest(req, placed, gap)
}

/// Segments of `node` with a start on its own clock (not derived).
fn own_segments(req: &MergedRequest, node: &str) -> Vec<usize> {
    (0..req.segments.len())
        .filter(|&i| {
            let s = &req.segments[i];
            s.derived.is_none() && s.node.as_deref() == Some(node) && s.start_ns.is_some()
        })
        .collect()
}

/// The client's segments at their true times; returns the client's longest idle gap.
fn place_client(req: &MergedRequest, placed: &mut [Option<Placed>]) -> Option<(i128, i128)> {
    let origin = i128::from(req.start_ns);
    let mut client_spans: Vec<(i128, i128)> = Vec::new();
    for i in own_segments(req, &req.client_node) {
        let s = &req.segments[i];
        let x0 = i128::from(s.start_ns.expect("own segments have a start")) - origin;
        client_spans.push((x0, x0 + i128::from(s.dur_ns)));
        placed[i] = Some(Placed {
            segment: i,
            lane: req.client_node.clone(),
            x0,
            x1: x0 + i128::from(s.dur_ns),
            exact: true,
            part: None,
        });
    }
    longest_gap(&mut client_spans)
}

/// A peer node's segments, spaced on its own clock, as a block centred in the client's gap.
fn place_peer(
    req: &MergedRequest,
    node: &str,
    gap: Option<(i128, i128)>,
    placed: &mut [Option<Placed>],
) {
    let own = own_segments(req, node);
    let start = |i: usize| req.segments[i].start_ns.expect("own segments have a start");
    let Some(first) = own.iter().map(|&i| start(i)).min() else {
        return;
    };
    let last = own
        .iter()
        .map(|&i| i128::from(start(i)) + i128::from(req.segments[i].dur_ns))
        .max()
        .expect("non-empty");
    let len = last - i128::from(first);
    let (g0, g1) = gap.unwrap_or((0, 0));
    let at = g0 + ((g1 - g0) - len) / 2;
    for i in own {
        let x0 = at + i128::from(start(i) - first);
        placed[i] = Some(Placed {
            segment: i,
            lane: node.to_owned(),
            x0,
            x1: x0 + i128::from(req.segments[i].dur_ns),
            exact: false,
            part: None,
        });
    }
}

/// Everything in segment order: the placed segments, derived ones split into the gap either
/// side of the peer's block, and the rest after whatever came before them.
fn place_the_rest(
    req: &MergedRequest,
    mut placed: Vec<Option<Placed>>,
    gap: Option<(i128, i128)>,
) -> Vec<Placed> {
    let mut out: Vec<Placed> = Vec::new();
    let (mut left, mut right) = gap.unwrap_or((0, 0));
    let mut cursor = 0i128;
    for (i, s) in req.segments.iter().enumerate() {
        if let Some(p) = placed[i].take() {
            cursor = cursor.max(p.x1);
            out.push(p);
            continue;
        }
        let d = i128::from(s.dur_ns);
        if s.derived.is_some() && gap.is_some() {
            let first = d / 2;
            let second = d - first;
            let piece = |x0: i128, x1: i128, part: u8| Placed {
                segment: i,
                lane: DERIVED_LANE.into(),
                x0,
                x1,
                exact: false,
                part: Some((part, 2)),
            };
            out.push(piece(left, left + first, 1));
            out.push(piece(right - second, right, 2));
            left += first;
            right -= second;
        } else {
            // No own time and no gap to put it in: after whatever came before it.
            let lane = match &s.node {
                Some(n) if s.derived.is_none() => n.to_string(),
                _ => DERIVED_LANE.into(),
            };
            out.push(Placed {
                segment: i,
                lane,
                x0: cursor,
                x1: cursor + d,
                exact: false,
                part: None,
            });
            cursor += d;
        }
    }
    out
}

/// The longest stretch between two consecutive client segments (by start time).
fn longest_gap(spans: &mut [(i128, i128)]) -> Option<(i128, i128)> {
    spans.sort();
    let mut best: Option<(i128, i128)> = None;
    let mut end = i128::MIN;
    for &(x0, x1) in spans.iter() {
        if end != i128::MIN && x0 > end && best.is_none_or(|(b0, b1)| x0 - end > b1 - b0) {
            best = Some((end, x0));
        }
        end = end.max(x1);
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Built from JSON so additive schema fields do not break the test.
    fn request(start: u64, e2e: u64, segments: serde_json::Value) -> MergedRequest {
        serde_json::from_value(json!({
            "trace_id": "t", "client_node": "A", "server_node": "B", "join": "offset",
            "start_ns": start, "e2e_ns": e2e, "complete": true, "missing": [], "segments": segments,
        }))
        .unwrap()
    }

    fn seg(name: &str, node: Option<&str>, start: Option<u64>, dur: u64) -> serde_json::Value {
        let mut s =
            json!({"name": name, "layer": "kernel", "unit": "u", "kind": "compute", "dur_ns": dur});
        match node {
            Some(n) => s["node"] = json!(n),
            None => {
                s["derived"] = json!({"method": "difference", "outer_node": "A", "outer": [], "inner_node": "B", "inner": []})
            }
        }
        if let Some(t) = start {
            s["start_ns"] = json!(t);
        }
        s
    }

    #[test]
    fn peer_block_is_centred_in_the_client_gap_and_rtt_fills_the_rest() {
        // Client A: [0,10) [10,25) ... [125,140) on its clock (start 1000). B: 60 ns on its own
        // clock far away (5000..5060). Derived rtt 40 = gap 100 - B's 60.
        let req = request(
            1000,
            140,
            json!([
                seg("a1", Some("A"), Some(1000), 10),
                seg("a2", Some("A"), Some(1010), 15),
                seg("rtt", None, None, 40),
                seg("b1", Some("B"), Some(5000), 20),
                seg("b2", Some("B"), Some(5020), 40),
                seg("a3", Some("A"), Some(1125), 15),
            ]),
        );
        assert_eq!(lanes(&req), ["A", "B", "derived"]);
        let p = place(&req);
        let span = |name: &str| -> Vec<(i128, i128, bool)> {
            p.iter()
                .filter(|x| req.segments[x.segment].name == name)
                .map(|x| (x.x0, x.x1, x.exact))
                .collect()
        };
        assert_eq!(span("a1"), [(0, 10, true)]);
        assert_eq!(span("a3"), [(125, 140, true)]);
        assert_eq!(span("b1"), [(45, 65, false)]);
        assert_eq!(span("b2"), [(65, 105, false)]);
        assert_eq!(span("rtt"), [(25, 45, false), (105, 125, false)]);
        assert_eq!(p.len(), 7);
    }

    #[test]
    fn without_own_times_segments_follow_each_other() {
        let req = request(
            0,
            30,
            json!([seg("x", Some("A"), None, 10), seg("y", None, None, 20)]),
        );
        let p = place(&req);
        assert_eq!((p[0].x0, p[0].x1, p[1].x0, p[1].x1), (0, 10, 10, 30));
        assert_eq!(p[1].lane, "derived");
    }
}
