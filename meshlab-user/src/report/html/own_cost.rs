//! The "meshlab's own cost" section of the HTML page (figures: report/own_cost.rs).

use std::fmt::Write as _;

use crate::schema::BpfStatsState;

use super::super::own_cost::OwnCost;
use super::super::table::percent;
use super::svg::escape;

fn ns(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |v| format!("{v:.0}"))
}

fn share(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), percent)
}

pub fn section(out: &mut String, c: &OwnCost) {
    out.push_str("<section id=\"own-cost\"><h2>meshlab's own cost</h2>");
    if c.nodes.is_empty() {
        out.push_str(
            "<p class=\"note\">Not recorded: the merge summary has no self_cost (recordings made \
             before self-accounting, or probe files only).</p></section>",
        );
        return;
    }
    out.push_str(
        "<table class=\"num\"><thead><tr><th>node</th><th>BPF stats</th><th>BPF ns total</th>\
         <th>BPF ns/request</th><th>CPU user ns</th><th>CPU sys ns</th><th>events</th>\
         <th>CPU ns/event</th><th>CPU ns/request</th></tr></thead><tbody>",
    );
    for n in &c.nodes {
        let measured = n.bpf_stats == BpfStatsState::Measured;
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td></tr>",
            escape(&n.node),
            n.bpf_stats.as_str().replace('_', " "),
            if measured {
                n.bpf_total_ns.to_string()
            } else {
                "–".into()
            },
            ns(n.bpf_ns_per_request),
            n.user_cpu_ns,
            n.sys_cpu_ns,
            n.events,
            ns(n.cpu_ns_per_event),
            ns(n.cpu_ns_per_request),
        );
    }
    out.push_str("</tbody></table>");
    for n in &c.nodes {
        if let Some(missed) = n.missed_runs_line() {
            let _ = write!(
                out,
                "<p class=\"note\"><strong>{}: events lost</strong>, the kernel skipped programs \
                 already running on that CPU (not in dropped): {}</p>",
                escape(&n.node),
                escape(&missed)
            );
        }
    }
    programs(out, c);
    stages(out, c);
    let _ = write!(
        out,
        "<p class=\"note\">BPF: the kernel's run-time statistics of meshlab's own programs over the \
         recording (not measured when kernel.bpf_stats_enabled was 0: record with --bpf-stats). \
         CPU: the recorder process's getrusage over the recording. Per request: over the {} \
         requests of this report. Per stage: the programs at the stage's ends, one average run each \
         (est) and each one's run time per event it emitted (≤, a bound), over the stage's median \
         (docs/report.md).</p></section>",
        c.requests
    );
}

fn programs(out: &mut String, c: &OwnCost) {
    out.push_str(
        "<table class=\"num\"><thead><tr><th>node</th><th>program</th><th>hook</th><th>runs</th>\
         <th>ns/run</th><th>total ns</th><th>events</th><th>ns/event ≤</th></tr></thead><tbody>",
    );
    for n in &c.nodes {
        for p in &n.programs {
            let _ = write!(
                out,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td></tr>",
                escape(&n.node),
                escape(&p.program),
                escape(&p.hook),
                p.runs,
                ns(p.ns_per_run),
                p.total_ns,
                p.events,
                ns(p.ns_per_event_max)
            );
        }
    }
    out.push_str("</tbody></table>");
}

fn stages(out: &mut String, c: &OwnCost) {
    if c.stages.is_empty() {
        return;
    }
    out.push_str(
        "<table class=\"num\"><thead><tr><th>node</th><th>stage</th><th>stage p50 ns</th>\
         <th>own ns est</th><th>share est</th><th>own ns ≤</th><th>share ≤</th><th>programs of</th>\
         </tr></thead><tbody>",
    );
    for s in &c.stages {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.0}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td></tr>",
            escape(&s.node),
            escape(&s.stage),
            s.stage_p50_ns,
            s.own_ns_est,
            percent(s.share_of_p50_est),
            ns(s.own_ns_max),
            share(s.share_of_p50_max),
            escape(&s.hooks.join(", "))
        );
    }
    out.push_str("</tbody></table>");
}
