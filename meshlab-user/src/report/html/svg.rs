//! Small SVG helpers: linear scales, round axis ticks, escaping, the kind palette.

use std::fmt::Write as _;

use crate::schema::Kind;

/// Maps a domain [d0, d1] linearly onto pixels [r0, r1].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scale {
    pub d0: f64,
    pub d1: f64,
    pub r0: f64,
    pub r1: f64,
}

impl Scale {
    pub fn new(d0: f64, d1: f64, r0: f64, r1: f64) -> Self {
        let d1 = if d1 > d0 { d1 } else { d0 + 1.0 };
        Scale { d0, d1, r0, r1 }
    }

    pub fn at(&self, v: f64) -> f64 {
        self.r0 + (v - self.d0) / (self.d1 - self.d0) * (self.r1 - self.r0)
    }
}

/// Round tick values from 0 to at least `max` (steps of 1, 2 or 5 times a power of ten),
/// about `target` of them. Returns (ticks, step); the last tick is >= max.
pub fn nice_ticks(max: f64, target: usize) -> (Vec<f64>, f64) {
    let max = if max > 0.0 { max } else { 1.0 };
    let raw = max / target.max(1) as f64;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude);
    let count = (max / step).ceil() as usize;
    ((0..=count).map(|i| i as f64 * step).collect(), step)
}

/// Ticks for a log axis over [lo, hi] (lo > 0): 1-2-5 per decade when the range spans more
/// than about a decade and a half, else 1, 1.5, 2, 3 ... 9 per decade so that a narrow range
/// still gets a few labels.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mantissas: &[f64] = if hi / lo > 30.0 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    };
    let mut out = Vec::new();
    let mut decade = 10f64.powf(lo.log10().floor());
    while decade <= hi {
        for m in mantissas {
            let v = m * decade;
            if v >= lo && v <= hi {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

/// A tick label without needless decimals: 0, 20, 2.5, 0.25.
pub fn tick_label(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_owned()
}

pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Colour of a kind (colour-blind-safe Tableau-like palette).
pub fn kind_color(k: Kind) -> &'static str {
    match k {
        Kind::Compute => "#4c78a8",
        Kind::Wait => "#f58518",
        Kind::Queue => "#e45756",
        Kind::Network => "#54a24b",
    }
}

pub const KINDS: [Kind; 4] = [Kind::Compute, Kind::Wait, Kind::Queue, Kind::Network];

/// Hatch patterns for derived (display-placed) bars, one per kind; put once in each <svg>.
pub fn defs() -> String {
    let mut s = String::from("<defs>");
    for k in KINDS {
        let _ = write!(
            s,
            "<pattern id=\"hatch-{name}\" width=\"6\" height=\"6\" patternUnits=\"userSpaceOnUse\" \
             patternTransform=\"rotate(45)\"><rect width=\"6\" height=\"6\" fill=\"{c}\" fill-opacity=\"0.35\"/>\
             <line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"6\" stroke=\"{c}\" stroke-width=\"3\"/></pattern>",
            name = k.as_str(),
            c = kind_color(k)
        );
    }
    s.push_str("</defs>");
    s
}

/// A vertical-gridline x axis with labels in microseconds; `y0..y1` is the plot's height.
pub fn x_axis(out: &mut String, scale: &Scale, ticks: &[f64], y0: f64, y1: f64, unit: &str) {
    for &t in ticks {
        let x = scale.at(t);
        let _ = write!(
            out,
            "<line class=\"grid\" x1=\"{x:.1}\" y1=\"{y0:.1}\" x2=\"{x:.1}\" y2=\"{y1:.1}\"/>\
             <text class=\"tick\" x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            y1 + 14.0,
            tick_label(t)
        );
    }
    let _ = write!(
        out,
        "<text class=\"axis-label\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{unit}</text>",
        scale.r1,
        y1 + 30.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_maps_ends_and_middle() {
        let s = Scale::new(0.0, 200.0, 100.0, 500.0);
        assert_eq!(s.at(0.0), 100.0);
        assert_eq!(s.at(200.0), 500.0);
        assert_eq!(s.at(50.0), 200.0);
        // A zero-width domain does not divide by zero.
        assert!(Scale::new(5.0, 5.0, 0.0, 10.0).at(5.0).is_finite());
    }

    #[test]
    fn ticks_are_round_and_cover_the_maximum() {
        let (t, step) = nice_ticks(117.3, 6);
        assert_eq!(step, 20.0);
        assert_eq!(t, [0.0, 20.0, 40.0, 60.0, 80.0, 100.0, 120.0]);
        let (t, step) = nice_ticks(0.9, 4);
        assert_eq!(step, 0.5);
        assert_eq!(*t.last().unwrap(), 1.0);
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(20.0), "20");
    }

    #[test]
    fn log_ticks_span_the_range() {
        assert_eq!(
            log_ticks(0.8, 600.0),
            [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0]
        );
        assert_eq!(log_ticks(95.0, 360.0), [100.0, 150.0, 200.0, 300.0]);
        assert_eq!(log_ticks(8.5, 12.0), [9.0, 10.0]);
    }

    #[test]
    fn escaping() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
