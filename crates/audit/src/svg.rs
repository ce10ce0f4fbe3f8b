//! The report's chart, drawn by hand: one dot per request at (time it was sent, its latency on a
//! log scale), coloured by how it ended, with a legend. Self-contained SVG, so the report opens
//! anywhere without scripts or fonts.

use std::fmt::Write;

use super::client::Outcome;
use super::finding::RequestRow;

const W: f64 = 960.0;
const H: f64 = 480.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 210.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;

/// A colour per outcome, distinct enough to tell apart on a white background.
pub fn colour(o: Outcome) -> &'static str {
    match o {
        Outcome::Ok => "#2e8b57",
        Outcome::Refused400 => "#1f77b4",
        Outcome::RateLimited429 => "#ff7f0e",
        Outcome::Unavailable503 => "#bcbd22",
        Outcome::ServerError5xx => "#d62728",
        Outcome::OtherStatus => "#8c564b",
        Outcome::DisconnectedByUs => "#9467bd",
        Outcome::StreamErrorEvent => "#e377c2",
        Outcome::StreamTruncated => "#7f7f7f",
        Outcome::TransportError => "#000000",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Ticks for 0..=max: about six, on 1, 2 or 5 times a power of ten.
fn linear_ticks(max: f64) -> Vec<f64> {
    if max <= 0.0 {
        return vec![0.0];
    }
    let raw = max / 6.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag);
    (0..).map(|i| i as f64 * step).take_while(|t| *t <= max * 1.0001).collect()
}

fn ms_label(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{} s", ms / 1000.0)
    } else {
        format!("{ms} ms")
    }
}

/// The chart of `rows` (latency in ms against start time in s).
pub fn chart(rows: &[RequestRow], title: &str) -> String {
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let t_max = rows.iter().map(|r| r.start_ms / 1000.0).fold(0.0f64, f64::max).max(1.0);
    let lat = |r: &RequestRow| r.total_ms.max(0.1);
    let lo = rows.iter().map(lat).fold(f64::INFINITY, f64::min);
    let hi = rows.iter().map(lat).fold(0.0f64, f64::max);
    // Whole decades around the data, at least one.
    let (d_lo, d_hi) = if rows.is_empty() {
        (0.0, 3.0)
    } else {
        let a = lo.log10().floor();
        let b = hi.log10().ceil();
        (a, if b > a { b } else { a + 1.0 })
    };
    let x = |t: f64| LEFT + t / t_max * pw;
    let y = |ms: f64| TOP + ph - (ms.max(0.1).log10() - d_lo) / (d_hi - d_lo) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" \
         font-family=\"sans-serif\" font-size=\"12\">"
    );
    let _ = writeln!(s, "<rect width=\"{W}\" height=\"{H}\" fill=\"white\"/>");
    let _ = writeln!(s, "<text x=\"{LEFT}\" y=\"24\" font-size=\"15\">{}</text>", esc(title));
    // Axes and grid.
    let _ =
        writeln!(s, "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw}\" height=\"{ph}\" fill=\"none\" stroke=\"#444\"/>");
    for t in linear_ticks(t_max) {
        let px = x(t);
        let _ = writeln!(
            s,
            "<line x1=\"{px:.1}\" y1=\"{TOP}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#e5e5e5\"/>\
             <text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{t}</text>",
            TOP + ph,
            TOP + ph + 16.0
        );
    }
    let mut d = d_lo;
    while d <= d_hi + 1e-9 {
        let ms = 10f64.powf(d);
        let py = y(ms);
        let _ = writeln!(
            s,
            "<line x1=\"{LEFT}\" y1=\"{py:.1}\" x2=\"{:.1}\" y2=\"{py:.1}\" stroke=\"#e5e5e5\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT + pw,
            LEFT - 6.0,
            py + 4.0,
            ms_label(ms)
        );
        d += 1.0;
    }
    let _ = writeln!(
        s,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">time since start (s)</text>",
        LEFT + pw / 2.0,
        H - 12.0
    );
    let _ = writeln!(
        s,
        "<text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">latency (log scale)</text>",
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    // Dots: re-runs hollow, so the isolated second pass is told apart from the load.
    for r in rows {
        let c = colour(r.outcome);
        let (cx, cy) = (x(r.start_ms / 1000.0), y(lat(r)));
        let fill = if r.phase == "rerun" { "none" } else { c };
        let _ = writeln!(
            s,
            "<circle cx=\"{cx:.1}\" cy=\"{cy:.1}\" r=\"3\" fill=\"{fill}\" stroke=\"{c}\" fill-opacity=\"0.8\">\
             <title>request {} ({}, {}): {} in {:.0} ms</title></circle>",
            r.id,
            esc(&r.tenant),
            r.scenario,
            r.outcome.name(),
            r.total_ms
        );
    }
    // Legend: every outcome that occurs, with its count.
    let lx = LEFT + pw + 20.0;
    let mut ly = TOP + 10.0;
    let _ = writeln!(s, "<text x=\"{lx}\" y=\"{ly}\" font-weight=\"bold\">outcome</text>");
    for o in Outcome::ALL {
        let n = rows.iter().filter(|r| r.outcome == o).count();
        if n == 0 {
            continue;
        }
        ly += 20.0;
        let _ = writeln!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\">{} ({n})</text>",
            lx + 5.0,
            ly - 4.0,
            colour(o),
            lx + 16.0,
            ly,
            o.name()
        );
    }
    if rows.iter().any(|r| r.phase == "rerun") {
        ly += 20.0;
        let _ = writeln!(
            s,
            "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"5\" fill=\"none\" stroke=\"#444\"/>\
             <text x=\"{:.1}\" y=\"{ly:.1}\">re-run alone</text>",
            lx + 5.0,
            ly - 4.0,
            lx + 16.0
        );
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(linear_ticks(10.0), vec![0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
        assert_eq!(linear_ticks(0.0), vec![0.0]);
        let t = linear_ticks(47.0);
        assert_eq!(t.first(), Some(&0.0));
        assert!(t.len() >= 4 && *t.last().unwrap_or(&0.0) <= 47.0);
    }
}
