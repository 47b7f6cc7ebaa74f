//! `index.html`: one self-contained page (inline CSS, no script, no external resource) with the
//! findings in words, each chart with its caption, the worst sites as a table, and what could not
//! be drawn and why. Images are referenced by relative file name, so the directory can be moved.

use crate::report::build::{Report, RunFindings};
use crate::report::{Chart, percent, short};

/// Escapes text for HTML content and attribute values.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            _ => o.push(c),
        }
    }
    o
}

const STYLE: &str = "body{font-family:system-ui,-apple-system,'DejaVu Sans',sans-serif;max-width:1260px;margin:1.5em auto;padding:0 1em;color:#1a1a1a;line-height:1.45}\
h1{font-size:1.6em;margin-bottom:.2em}h2{margin-top:1.8em;border-bottom:2px solid #ddd;padding-bottom:.2em}\
.meta{color:#555}figure{margin:1.2em 0}figure img{max-width:100%;height:auto;border:1px solid #ddd}\
figcaption{color:#333;font-size:.95em;margin-top:.3em}ul.findings li{margin:.3em 0}\
.nodraw{background:#fff6e0;border-left:4px solid #e69f00;padding:.5em 1em}\
table{border-collapse:collapse;font-size:.92em;margin:.8em 0}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:right}\
th{background:#f2f2f2}td.l,th.l{text-align:left}code{background:#f4f4f4;padding:0 .2em}";

fn figure(c: &Chart) -> String {
    format!(
        "<figure><img src=\"{}\" width=\"{}\" height=\"{}\" alt=\"{}\"><figcaption><b>{}</b>. {}</figcaption></figure>\n",
        esc(&c.file),
        c.width,
        c.height,
        esc(&format!("{}. {}", c.title, c.caption)),
        esc(&c.title),
        esc(&c.caption)
    )
}

fn sites_table(f: &RunFindings) -> String {
    let Some(l) = &f.locate else { return String::new() };
    if l.ranked.is_empty() {
        return String::new();
    }
    let mut o = String::from(
        "<table><tr><th>#</th><th class=l>GEMM</th><th>error added (1 − cos)</th><th>at step</th><th>first crossed</th><th class=l>operand</th><th>format</th><th>saturated</th><th>underflow</th><th>amax</th><th>amax used</th><th>scale</th><th>amax channel</th><th>top 1% channels' Σx²</th></tr>\n",
    );
    for (i, g) in l.ranked.iter().take(10).enumerate() {
        let span = g.evidence.len().max(1);
        let head = format!(
            "<td rowspan={span}>{}</td><td class=l rowspan={span}><code>{}</code></td><td rowspan={span}>{}</td><td rowspan={span}>{}</td><td rowspan={span}>{}</td>",
            i + 1,
            esc(&g.gemm_name),
            short(g.peak_error),
            g.peak_error_step,
            g.first_crossed.map(|s| s.to_string()).unwrap_or_else(|| "–".into())
        );
        if g.evidence.is_empty() {
            o += &format!("<tr>{head}<td class=l colspan=9>no stats at that step</td></tr>\n");
        }
        for (k, e) in g.evidence.iter().enumerate() {
            let opt = |x: Option<f64>, f: fn(f64) -> String| x.map(f).unwrap_or_else(|| "–".into());
            o += &format!(
                "<tr>{}<td class=l>{} (step {})</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
                if k == 0 { head.as_str() } else { "" },
                esc(&e.role),
                e.step,
                esc(&e.format.clone().unwrap_or_default().to_uppercase()),
                opt(e.saturated_frac, percent),
                opt(e.underflow_frac, percent),
                opt(e.amax, short),
                opt(e.amax_used, short),
                opt(e.scale, short),
                match (e.amax_channel, e.channel_step) {
                    (Some(c), Some(at)) if at != e.step => format!("{c} (step {at})"),
                    (Some(c), _) => c.to_string(),
                    (None, _) => "–".into(),
                },
                opt(e.top_channel_sq_frac, percent)
            );
        }
    }
    o + "</table>\n"
}

fn health_table(f: &RunFindings) -> String {
    let s = &f.summary;
    let mut rows: Vec<&crate::analysis::summary::TensorHealth> = s.worst_saturation.iter().chain(&s.worst_underflow).collect();
    rows.dedup_by(|a, b| a.tensor == b.tensor && a.gemm == b.gemm);
    if rows.is_empty() {
        return String::new();
    }
    let mut o = String::from(
        "<table><tr><th class=l>operand</th><th class=l>cast for</th><th>underflow mean</th><th>underflow max</th><th>saturated mean</th><th>saturated max</th></tr>\n",
    );
    for t in rows {
        o += &format!(
            "<tr><td class=l><code>{}</code></td><td class=l>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>\n",
            esc(&t.tensor),
            esc(&t.gemm),
            percent(t.mean_underflow_frac),
            percent(t.max_underflow_frac),
            percent(t.mean_saturated_frac),
            percent(t.max_saturated_frac)
        );
    }
    o + "</table>\n"
}

fn not_drawn(items: &[String]) -> String {
    if items.is_empty() {
        return String::new();
    }
    let mut o = String::from("<div class=nodraw><b>Not drawn</b><ul>\n");
    for n in items {
        o += &format!("<li>{}</li>\n", esc(n));
    }
    o + "</ul></div>\n"
}

/// The page.
pub fn page(r: &Report) -> String {
    let mut o =
        String::from("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>\n<meta name=viewport content=\"width=device-width, initial-scale=1\">\n");
    o += "<title>fp8scope report</title>\n<style>";
    o += STYLE;
    o += "</style></head><body>\n<h1>Why did the FP8 run go wrong?</h1>\n";
    let names: Vec<String> = r.runs.iter().map(|f| format!("<code>{}</code>", esc(&f.run))).collect();
    o += &format!(
        "<p class=meta>Run(s) {} {}; written by fp8-analyze report in {:.1} s.</p>\n",
        names.join(", "),
        match &r.baseline {
            Some(b) => format!("against baseline <code>{}</code>", esc(b)),
            None => "without a baseline".into(),
        },
        r.seconds
    );
    o += "<h2>Findings</h2>\n";
    for f in &r.runs {
        o += &format!(
            "<h3><code>{}</code> — recipe {}, {} ({} of {} steps)</h3>\n<ul class=findings>\n",
            esc(&f.run),
            esc(&f.recipe),
            esc(&f.status),
            f.steps_completed,
            f.steps_planned
        );
        for line in &f.findings {
            o += &format!("<li>{}</li>\n", esc(line));
        }
        o += "</ul>\n";
    }
    for w in &r.warnings {
        o += &format!("<p class=meta>Warning: {}</p>\n", esc(w));
    }
    o += &not_drawn(&r.not_drawn);

    o += "<h2>Loss</h2>\n";
    for c in r.charts.iter().filter(|c| c.run.is_none()) {
        o += &figure(c);
    }
    for f in &r.runs {
        o += &format!("<h2>Run <code>{}</code></h2>\n", esc(&f.run));
        o += &not_drawn(&f.not_drawn);
        let mine: Vec<&Chart> = r.charts.iter().filter(|c| c.run.as_deref() == Some(f.run.as_str())).collect();
        for kind in ["sites"] {
            for c in mine.iter().filter(|c| c.kind == kind) {
                o += &figure(c);
            }
        }
        let t = sites_table(f);
        if !t.is_empty() {
            o += "<h3>Worst sites (locate), with their operands' FP8 statistics</h3>\n";
            o += &t;
        }
        for kind in [
            "amax",
            "channels",
            "histogram",
            "heatmap-cosine",
            "heatmap-saturated",
            "heatmap-underflow",
            "heatmap-block-spread",
            "heatmap-block-flushed",
            "heatmap-whatif",
        ] {
            for c in mine.iter().filter(|c| c.kind == kind) {
                o += &figure(c);
            }
        }
        let h = health_table(f);
        if !h.is_empty() {
            o += "<h3>Worst operands by saturation and underflow (mean over the recorded steps)</h3>\n";
            o += &h;
        }
    }
    o += "</body></html>\n";
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup() {
        assert_eq!(esc("a<b & \"c\"'"), "a&lt;b &amp; &quot;c&quot;&#39;");
    }
}
