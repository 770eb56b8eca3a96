//! Requests the merge noted as retransmitted (`retransmitted: ...` in `notes`) and what they
//! took, for the causes that lose frames: a lost frame stalls one request for a tail loss
//! probe or an RTO, which the p50 does not show, so these requests are reported on their own. Shared by the
//! namespace runs (crate::truth) and the guests' (crate::truth_vm); the cause's target comes
//! in as a function, so this module depends on neither.

/// Requests of one condition the merge noted as retransmitted, and what they took.
#[derive(Debug, Default, PartialEq)]
pub struct Retransmissions {
    pub requests: usize,
    pub noted: usize,
    pub noted_complete: usize,
    /// Sums over the complete noted requests: e2e, and the cause's target segments.
    pub e2e_ns: u64,
    pub target_ns: u64,
}

impl Retransmissions {
    /// Adds another run's counts (the rows sum all runs of a condition).
    pub fn add(&mut self, other: &Retransmissions) {
        self.requests += other.requests;
        self.noted += other.noted;
        self.noted_complete += other.noted_complete;
        self.e2e_ns += other.e2e_ns;
        self.target_ns += other.target_ns;
    }
}

/// The merge notes a request whose bytes an skb hook saw twice (the first transmission is
/// the one timed): `retransmitted: ...` in its `notes`.
fn is_retransmitted(request: &serde_json::Value) -> bool {
    (request["notes"].as_array().into_iter().flatten())
        .any(|n| n.as_str().is_some_and(|n| n.starts_with("retransmitted:")))
}

/// Counts over merged `requests`; `target_ns` is the sum of a request's segments where the
/// cause lives.
pub fn retransmissions<'a>(
    requests: impl Iterator<Item = &'a serde_json::Value>,
    target_ns: impl Fn(&serde_json::Value) -> u64,
) -> Retransmissions {
    let mut counts = Retransmissions::default();
    for request in requests {
        counts.requests += 1;
        if !is_retransmitted(request) {
            continue;
        }
        counts.noted += 1;
        if request["complete"] != true {
            continue;
        }
        counts.noted_complete += 1;
        counts.e2e_ns += request["e2e_ns"].as_u64().unwrap_or(0);
        counts.target_ns += target_ns(request);
    }
    counts
}

pub fn print_header() {
    println!(
        "\nretransmissions (requests the merge notes `retransmitted:`, all rounds of the \
         condition; mean e2e and target over the complete ones)"
    );
}

/// One condition's row: `cause` and `target` are the table's names.
pub fn print_row(cause: &str, target: &str, on: bool, counts: &Retransmissions) {
    let mean = |ns: u64| ns as f64 / counts.noted_complete.max(1) as f64 / 1e3;
    println!(
        "{:<28} {:<7} {:>4} of {:>6} requests retransmitted ({} complete): mean e2e \
         {:>9.1} us, in {} {:>9.1} us ({:.0} %)",
        cause,
        if on { "cause" } else { "without" },
        counts.noted,
        counts.requests,
        counts.noted_complete,
        mean(counts.e2e_ns),
        target,
        mean(counts.target_ns),
        counts.target_ns as f64 / counts.e2e_ns.max(1) as f64 * 100.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(complete: bool, notes: &[&str], e2e_ns: u64) -> serde_json::Value {
        json!({"type": "request", "complete": complete, "e2e_ns": e2e_ns, "notes": notes})
    }

    /// Only noted requests count, only complete ones are timed, and a condition's runs add up.
    #[test]
    fn noted_requests_are_counted_timed_when_complete_and_summed_over_runs() {
        let run = [
            request(true, &["retransmitted: request on A; ..."], 1_000),
            request(false, &["retransmitted: response on B; ..."], 9_000),
            request(true, &["rx context: ..."], 500),
            request(true, &[], 400),
        ];
        let target = |r: &serde_json::Value| r["e2e_ns"].as_u64().unwrap() - 100;
        let counts = retransmissions(run.iter(), target);
        let expected = Retransmissions {
            requests: 4,
            noted: 2,
            noted_complete: 1,
            e2e_ns: 1_000,
            target_ns: 900,
        };
        assert_eq!(counts, expected);
        let mut total = Retransmissions::default();
        total.add(&counts);
        total.add(&retransmissions(run[..2].iter(), target));
        assert_eq!(
            total,
            Retransmissions {
                requests: 6,
                noted: 4,
                noted_complete: 2,
                e2e_ns: 2_000,
                target_ns: 1_800
            }
        );
    }
}
