//! Plain-text tables: fixed column order, widths from the content, numbers right-aligned,
//! no colours (the output is the same on a terminal and in a pipe).

use std::io::{self, Write};

/// Nanoseconds as microseconds with two decimals, rounded half up in integers so the text
/// never depends on binary floating point (12_345 ns -> "12.35").
pub fn us(ns: u64) -> String {
    let hundredths = (u128::from(ns) + 5) / 10;
    format!("{}.{:02}", hundredths / 100, hundredths % 100)
}

/// A mean (fractional nanoseconds) as microseconds with two decimals.
pub fn us_f(ns: f64) -> String {
    us(ns.round() as u64)
}

/// A signed nanosecond difference as microseconds with a sign ("+1.50", "-0.25").
pub fn us_signed(ns: i128) -> String {
    let sign = if ns < 0 { "-" } else { "+" };
    format!("{sign}{}", us(ns.unsigned_abs() as u64))
}

/// A step between two runs' figures: signed microseconds, `*` when it is flagged as larger
/// than the noise ("+1.50*").
pub fn step_us(ns: i128, flagged: bool) -> String {
    format!("{}{}", us_signed(ns), if flagged { "*" } else { "" })
}

/// A step in percent, signed, one decimal ("+12.3%").
pub fn step_pct(pct: f64) -> String {
    format!("{pct:+.1}%")
}

/// A fraction as a percentage with one decimal (0.1234 -> "12.3%").
pub fn percent(fraction: f64) -> String {
    format!("{:.1}%", (fraction * 1000.0).round() / 10.0)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

pub struct Table {
    headers: Vec<String>,
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(columns: &[(&str, Align)]) -> Self {
        Table {
            headers: columns.iter().map(|(h, _)| (*h).to_owned()).collect(),
            align: columns.iter().map(|(_, a)| *a).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        assert_eq!(cells.len(), self.headers.len(), "row width");
        self.rows.push(cells);
    }

    pub fn write(&self, out: &mut dyn Write, indent: &str) -> io::Result<()> {
        let width = |i: usize| {
            self.rows
                .iter()
                .map(|r| r[i].chars().count())
                .chain([self.headers[i].chars().count()])
                .max()
                .unwrap_or(0)
        };
        let widths: Vec<usize> = (0..self.headers.len()).map(width).collect();
        let line = |out: &mut dyn Write, cells: &[String]| -> io::Result<()> {
            let mut text = String::from(indent);
            for (i, cell) in cells.iter().enumerate() {
                if i > 0 {
                    text.push_str("  ");
                }
                let pad = widths[i] - cell.chars().count();
                match self.align[i] {
                    Align::Left => {
                        text.push_str(cell);
                        text.extend(std::iter::repeat_n(' ', pad));
                    }
                    Align::Right => {
                        text.extend(std::iter::repeat_n(' ', pad));
                        text.push_str(cell);
                    }
                }
            }
            writeln!(out, "{}", text.trim_end())
        };
        line(out, &self.headers)?;
        for r in &self.rows {
            line(out, r)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn microseconds_round_half_up_in_integers() {
        assert_eq!(us(12_345), "12.35");
        assert_eq!(us(12_344), "12.34");
        assert_eq!(us(0), "0.00");
        assert_eq!(us(999_995), "1000.00");
        assert_eq!(us_signed(-1_500), "-1.50");
        assert_eq!(us_signed(250), "+0.25");
        assert_eq!(percent(0.1234), "12.3%");
    }

    #[test]
    fn columns_align() {
        let mut t = Table::new(&[("name", Align::Left), ("p50", Align::Right)]);
        t.row(vec!["a".into(), "1.00".into()]);
        t.row(vec!["longer".into(), "10.00".into()]);
        let mut out = Vec::new();
        t.write(&mut out, "  ").unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "  name      p50\n  a        1.00\n  longer  10.00\n"
        );
    }
}
