//! The NIC section of `report --html --nic`: the tables of `report --nic`.

use std::fmt::Write as _;

use super::super::nic::NicReport;
use super::svg::escape;

/// The HTML section of `report --html --nic`.
pub fn html_section(report: &NicReport) -> String {
    let mut s = String::from(
        "<section id=\"nic\"><h2>NIC: per queue and per CPU</h2><p class=\"note\">Kernel stages of \
         the requests by the queue and CPU they ran on (segment <code>place</code>), and the raw \
         IRQ/NAPI stream of the recordings (docs/report.md).</p>",
    );
    for t in super::super::nic_text::tables(report) {
        let _ = write!(
            s,
            "<h3>{}</h3><table class=\"num\"><thead><tr>",
            escape(&t.title)
        );
        t.columns
            .iter()
            .for_each(|(c, _)| s.push_str(&format!("<th>{}</th>", escape(c))));
        s.push_str("</tr></thead><tbody>");
        for row in &t.rows {
            s.push_str("<tr>");
            row.iter()
                .for_each(|c| s.push_str(&format!("<td>{}</td>", escape(c))));
            s.push_str("</tr>");
        }
        s.push_str("</tbody></table>");
    }
    s.push_str("</section>");
    s
}
