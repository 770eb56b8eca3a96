//! Units of every command-line value: durations and sample rates, parsed by one set of rules
//! so `record --duration`, `merge --window` and the lab's `--warmup` cannot disagree.
//!
//! A duration is a decimal number followed by a unit, no space: `ns`, `us` (or `µs`), `ms`,
//! `s`, `m` (or `min`), `h`. The unit is required: a bare `5` is refused rather than read as
//! seconds by one flag and as nanoseconds by another. Arithmetic is exact (integer
//! nanoseconds), so `1.5us` is 1500 ns.

use std::time::Duration;

/// The rule every duration flag's `--help` refers to.
pub const DURATION_HELP: &str = "a number with a unit: ns, us, ms, s, m or h (e.g. 250ms, 2s)";

/// Nanoseconds per unit, longest names first so `ms` is not read as `m`.
const UNITS: &[(&str, u128)] = &[
    ("min", 60_000_000_000),
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// A non-negative duration, e.g. `500ms`, `2.5s`, `10m`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let ns = magnitude_ns(text.trim(), text)?;
    let secs = u64::try_from(ns / 1_000_000_000).map_err(|_| format!("`{text}`: out of range"))?;
    Ok(Duration::new(secs, (ns % 1_000_000_000) as u32))
}

/// A signed offset in nanoseconds, e.g. `-250ms`, `16.34s` (`--inject-skew`).
pub fn parse_offset_ns(text: &str) -> Result<i64, String> {
    let t = text.trim();
    let (negative, body) = match t.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let ns = i128::try_from(magnitude_ns(body, text)?).map_err(|_| out_of_range(text))?;
    i64::try_from(if negative { -ns } else { ns }).map_err(|_| out_of_range(text))
}

fn out_of_range(text: &str) -> String {
    format!("`{text}`: out of range")
}

/// `number unit` without sign, in nanoseconds (fractions below 1 ns are truncated).
fn magnitude_ns(body: &str, text: &str) -> Result<u128, String> {
    let expected = || format!("`{text}`: expected {DURATION_HELP}");
    let split = body
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(expected)?;
    let (number, unit) = body.split_at(split);
    let scale = UNITS
        .iter()
        .find(|(name, _)| *name == unit)
        .map(|(_, scale)| *scale)
        .ok_or_else(|| format!("`{text}`: unknown unit `{unit}`; expected {DURATION_HELP}"))?;
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() && frac.is_empty() || frac.contains('.') {
        return Err(expected());
    }
    let mantissa: u128 = format!("{int}{frac}").parse().map_err(|_| expected())?;
    let divisor = 10u128
        .checked_pow(frac.len() as u32)
        .ok_or_else(|| out_of_range(text))?;
    mantissa
        .checked_mul(scale)
        .map(|v| v / divisor)
        .ok_or_else(|| out_of_range(text))
}

/// A sample rate `1/N`: one in N (N ≥ 1).
pub fn parse_sample_rate(text: &str) -> Result<u32, String> {
    let n = text
        .strip_prefix("1/")
        .ok_or_else(|| format!("`{text}`: expected 1/N, e.g. 1/10"))?;
    let n: u32 = n
        .parse()
        .map_err(|_| format!("`{text}`: N must be a positive integer"))?;
    if n == 0 {
        return Err(format!("`{text}`: N must be at least 1"));
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_unit_scales_exactly() {
        let cases = [
            ("7ns", 7),
            ("1.5us", 1_500),
            ("2µs", 2_000),
            ("250ms", 250_000_000),
            ("2.5s", 2_500_000_000),
            ("2m", 120_000_000_000),
            ("1min", 60_000_000_000),
            ("1h", 3_600_000_000_000),
            (".5s", 500_000_000),
        ];
        for (text, ns) in cases {
            assert_eq!(parse_duration(text), Ok(Duration::from_nanos(ns)), "{text}");
            assert_eq!(parse_offset_ns(text), Ok(ns as i64), "{text}");
        }
    }

    #[test]
    fn a_unit_is_required_and_errors_say_what_is_expected() {
        for bad in ["5", "", "s", "5 s", "5parsecs", "1.2.3s", "-5s"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(err.contains(&format!("`{bad}`")), "{bad}: {err}");
            assert!(err.contains("ns, us, ms, s, m or h"), "{bad}: {err}");
        }
    }

    #[test]
    fn offsets_are_signed_and_range_checked() {
        assert_eq!(parse_offset_ns("-250ms"), Ok(-250_000_000));
        assert_eq!(parse_offset_ns("+16.34s"), Ok(16_340_000_000));
        assert!(
            parse_offset_ns("300000000h")
                .unwrap_err()
                .contains("out of range")
        );
    }

    #[test]
    fn sample_rates_are_one_in_n() {
        assert_eq!(parse_sample_rate("1/10"), Ok(10));
        assert!(parse_sample_rate("1/0").is_err());
        assert!(parse_sample_rate("2/3").is_err());
    }
}
