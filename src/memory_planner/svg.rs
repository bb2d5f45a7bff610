//! Pictures of plans: an SVG of offsets against time.
//!
//! This module owns drawing a [`Problem`] with its offsets the way the memory planning
//! papers draw them (TFLite's, MiniMalloc's): steps across, bytes up, one rectangle
//! per buffer, so that a plan's holes and its peak can be seen at a glance. [`svg`]
//! draws it; [`write_svg`] writes it to a file. The picture has:
//!
//! - one rectangle per buffer that is at least a pixel wide and a pixel tall, with
//!   its id, offset, size and lifetime in a `<title>` (shown on hover);
//! - buffers smaller than a pixel drawn together as *aggregates*: the plot is cut into
//!   4×4-pixel cells, and each cell is shaded by how much of it such buffers cover
//!   (runs of equal shade in a row are one rectangle), so a trace of 60,000 buffers
//!   stays readable and its file stays small;
//! - the live bytes at every step (the profile) as a line, the lower bound and the
//!   arena as horizontal lines, and the step of the peak marked;
//! - every buffer, drawn or aggregated, listed once in the SVG's `<metadata>` as CSV
//!   (`index,id,lower,upper,size,offset,drawn`), so the plan can be read back from its
//!   picture (and a test can check it).
//!
//! Nothing here plans: any offsets can be drawn, an invalid plan included (overlaps
//! show as overlapping rectangles), as long as there is one per buffer.

use std::fmt::Write as _;

use super::check::profile;
use super::error::PlanError;
use super::problem::Problem;

/// How [`svg`] draws a plan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SvgOptions {
    /// Width of the picture in pixels (at least 240; larger values are kept).
    pub width: u32,
    /// Height of the picture in pixels (at least 160).
    pub height: u32,
    /// A line of text at the top (a file name, a segment key); may be empty.
    pub title: String,
    /// A name per buffer for the hover text and the metadata (say the ids of a CSV
    /// trace, as written); empty to use each [`Buffer::id`](super::Buffer::id).
    pub names: Vec<String>,
}

impl Default for SvgOptions {
    /// 1200 × 640 pixels, no title, buffers named by their ids.
    fn default() -> SvgOptions {
        SvgOptions {
            width: 1200,
            height: 640,
            title: String::new(),
            names: Vec::new(),
        }
    }
}

/// Margins around the plot, in pixels: left (offset labels), right, top (title),
/// bottom (step labels).
const MARGIN: (f64, f64, f64, f64) = (80.0, 24.0, 48.0, 40.0);
/// Side of an aggregate cell, in pixels.
const CELL: f64 = 4.0;
/// Shades of an aggregate cell.
const SHADES: f64 = 16.0;

/// Draws `problem` planned at `offsets` (one per buffer, in the order of
/// [`Problem::buffers`]) as an SVG document (see the module documentation for what it
/// shows).
///
/// Fails with the problem's own error when it is not valid ([`Problem::validate`]),
/// and with [`PlanError::InvalidPlan`] when the number of offsets (or of names in
/// `options`) is not the number of buffers.
pub fn svg(problem: &Problem, offsets: &[u64], options: &SvgOptions) -> Result<String, PlanError> {
    problem.validate()?;
    let bufs = &problem.buffers;
    let n = bufs.len();
    if offsets.len() != n {
        return Err(PlanError::InvalidPlan {
            message: format!("{} offsets for {n} buffers", offsets.len()),
        });
    }
    if !options.names.is_empty() && options.names.len() != n {
        return Err(PlanError::InvalidPlan {
            message: format!("{} names for {n} buffers", options.names.len()),
        });
    }
    let name = |i: usize| -> String {
        match options.names.get(i) {
            Some(s) => escape(s),
            None => bufs[i].id.to_string(),
        }
    };
    let frame = Frame::new(problem, offsets, options);
    let mut out = String::with_capacity(4096 + 96 * n);
    frame.head(&mut out, n, &escape(&options.title));

    // Which buffers are drawn alone; the others shade the aggregate cells.
    let mut drawn = vec![false; n];
    let mut cells = Cells::new(frame.plot.0, frame.plot.1);
    for (i, (b, &off)) in bufs.iter().zip(offsets).enumerate() {
        let r = frame.rect(b.lower, b.upper, off, b.size);
        if r.2 >= 1.0 && r.3 >= 1.0 {
            drawn[i] = true;
        } else {
            cells.add(r.0 - MARGIN.0, r.1 - MARGIN.2, r.2, r.3);
        }
    }
    cells.write(&mut out);
    out.push_str("<g class=\"buffers\">\n");
    for (i, (b, &off)) in bufs.iter().zip(offsets).enumerate() {
        if !drawn[i] {
            continue;
        }
        let (x, y, w, h) = frame.rect(b.lower, b.upper, off, b.size);
        let hue = (i as f64 * 137.508) % 360.0;
        let _ = writeln!(
            out,
            "<rect class=\"b\" data-index=\"{i}\" x=\"{x:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" height=\"{h:.2}\" fill=\"hsl({hue:.0},55%,62%)\"><title>{}: offset {off}, {} bytes, steps [{}, {})</title></rect>",
            name(i),
            b.size,
            b.lower,
            b.upper
        );
    }
    out.push_str("</g>\n");
    frame.lines(&mut out);
    out.push_str("<metadata id=\"buffers\">\nindex,id,lower,upper,size,offset,drawn\n");
    for (i, (b, &off)) in bufs.iter().zip(offsets).enumerate() {
        let _ = writeln!(
            out,
            "{i},{},{},{},{},{off},{}",
            name(i),
            b.lower,
            b.upper,
            b.size,
            u8::from(drawn[i])
        );
    }
    out.push_str("</metadata>\n</svg>\n");
    Ok(out)
}

/// Draws the plan as [`svg`] does and writes it to `path`; a file that cannot be
/// written is [`PlanError::Io`] naming it.
pub fn write_svg(
    path: impl AsRef<std::path::Path>,
    problem: &Problem,
    offsets: &[u64],
    options: &SvgOptions,
) -> Result<(), PlanError> {
    let text = svg(problem, offsets, options)?;
    let path = path.as_ref();
    std::fs::write(path, text).map_err(|e| PlanError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// The scales of a picture and the figures it marks.
struct Frame {
    width: f64,
    height: f64,
    /// Plot width and height in pixels.
    plot: (f64, f64),
    /// First and end step shown.
    steps: (u64, u64),
    /// Bytes at the top of the plot.
    top: u64,
    arena: u64,
    lower_bound: u64,
    /// The first step at which the live bytes reach the lower bound.
    peak: u64,
    /// `(step, live bytes from it on)` where they change.
    profile: Vec<(u64, u64)>,
}

impl Frame {
    fn new(problem: &Problem, offsets: &[u64], options: &SvgOptions) -> Frame {
        let bufs = &problem.buffers;
        let width = f64::from(options.width.max(240));
        let height = f64::from(options.height.max(160));
        let plot = (width - MARGIN.0 - MARGIN.1, height - MARGIN.2 - MARGIN.3);
        let first = bufs.iter().map(|b| b.lower).min().unwrap_or(0);
        let end = bufs
            .iter()
            .map(|b| b.upper)
            .max()
            .unwrap_or(1)
            .max(first + 1);
        let arena = bufs
            .iter()
            .zip(offsets)
            .map(|(b, &o)| o.saturating_add(b.size))
            .max()
            .unwrap_or(0);
        let profile = profile(problem);
        let lower_bound = profile.iter().map(|p| p.1).max().unwrap_or(0);
        let peak = profile
            .iter()
            .find(|p| p.1 == lower_bound)
            .map_or(first, |p| p.0);
        Frame {
            width,
            height,
            plot,
            steps: (first, end),
            top: arena.max(lower_bound).max(1),
            arena,
            lower_bound,
            peak,
            profile,
        }
    }

    fn x(&self, step: u64) -> f64 {
        let (first, end) = self.steps;
        MARGIN.0 + (step.saturating_sub(first)) as f64 / (end - first) as f64 * self.plot.0
    }

    fn y(&self, bytes: u64) -> f64 {
        MARGIN.2 + self.plot.1 - bytes as f64 / self.top as f64 * self.plot.1
    }

    /// `(x, y, width, height)` of the rectangle of a buffer.
    fn rect(&self, lower: u64, upper: u64, offset: u64, size: u64) -> (f64, f64, f64, f64) {
        let (x0, x1) = (self.x(lower), self.x(upper));
        let (y0, y1) = (self.y(offset.saturating_add(size)), self.y(offset));
        (x0, y0, x1 - x0, y1 - y0)
    }

    /// The document's start: header, style, title, axes with their ticks.
    fn head(&self, out: &mut String, n: usize, title: &str) {
        let (w, h) = (self.width, self.height);
        let _ = writeln!(
            out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-family=\"sans-serif\" font-size=\"11\">"
        );
        out.push_str(
            "<style>rect.b{stroke:#0005;stroke-width:.5}rect.b:hover{stroke:#000;stroke-width:2}\
             .small{fill:#33507a}.axis{stroke:#444;fill:none}.tick{stroke:#ccc}\
             .profile{stroke:#222;stroke-width:1;fill:none}\
             .lb{stroke:#1a7f37;stroke-width:1.5;stroke-dasharray:6 3}\
             .arena{stroke:#c0392b;stroke-width:1.5}\
             .peak{stroke:#8e44ad;stroke-width:1.5;stroke-dasharray:2 3}\
             .label{font-weight:bold}</style>\n",
        );
        let ratio = if self.lower_bound == 0 {
            1.0
        } else {
            self.arena as f64 / self.lower_bound as f64
        };
        let sep = if title.is_empty() { "" } else { " · " };
        let _ = writeln!(
            out,
            "<text x=\"{:.0}\" y=\"20\" font-size=\"14\">{title}{sep}{n} buffers · arena {} · lower bound {} · ratio {ratio:.4}</text>",
            MARGIN.0,
            bytes(self.arena),
            bytes(self.lower_bound)
        );
        let (px, py, pw, ph) = (MARGIN.0, MARGIN.2, self.plot.0, self.plot.1);
        let (first, end) = self.steps;
        out.push_str("<g class=\"axes\">\n");
        for t in ticks(first, end, false) {
            let x = self.x(t);
            let _ = writeln!(
                out,
                "<line class=\"tick\" x1=\"{x:.2}\" y1=\"{py}\" x2=\"{x:.2}\" y2=\"{:.2}\"/><text x=\"{x:.2}\" y=\"{:.2}\" text-anchor=\"middle\">{t}</text>",
                py + ph,
                py + ph + 14.0
            );
        }
        for b in ticks(0, self.top, true) {
            let y = self.y(b);
            let _ = writeln!(
                out,
                "<line class=\"tick\" x1=\"{px}\" y1=\"{y:.2}\" x2=\"{:.2}\" y2=\"{y:.2}\"/><text x=\"{:.2}\" y=\"{:.2}\" text-anchor=\"end\">{}</text>",
                px + pw,
                px - 4.0,
                y + 4.0,
                bytes(b)
            );
        }
        let _ = writeln!(
            out,
            "<rect class=\"axis\" x=\"{px}\" y=\"{py}\" width=\"{pw}\" height=\"{ph}\"/>\n<text x=\"{:.2}\" y=\"{:.2}\" text-anchor=\"middle\">step</text>\n<text transform=\"translate(14 {:.2}) rotate(-90)\" text-anchor=\"middle\">offset</text>\n</g>",
            px + pw / 2.0,
            self.height - 6.0,
            py + ph / 2.0
        );
    }

    /// The profile, the lower bound and arena lines and the peak mark.
    fn lines(&self, out: &mut String) {
        let (x0, x1) = (MARGIN.0, MARGIN.0 + self.plot.0);
        let mut points = format!("{x0:.2},{:.2}", self.y(0));
        let mut live = 0;
        for &(t, b) in &self.profile {
            let x = self.x(t);
            let _ = write!(
                points,
                " {x:.2},{:.2} {x:.2},{:.2}",
                self.y(live),
                self.y(b)
            );
            live = b;
        }
        let _ = writeln!(
            out,
            "<g class=\"marks\">\n<polyline class=\"profile\" points=\"{points}\"><title>live bytes at each step</title></polyline>"
        );
        let (ya, yl) = (self.y(self.arena), self.y(self.lower_bound));
        let _ = writeln!(
            out,
            "<line class=\"arena\" x1=\"{x0}\" y1=\"{ya:.2}\" x2=\"{x1:.2}\" y2=\"{ya:.2}\"><title>arena: {} bytes</title></line>",
            self.arena
        );
        let _ = writeln!(
            out,
            "<line class=\"lb\" x1=\"{x0}\" y1=\"{yl:.2}\" x2=\"{x1:.2}\" y2=\"{yl:.2}\"><title>lower bound: {} bytes</title></line>",
            self.lower_bound
        );
        // Labels at the right end: the arena's above its line (the top of the plot, so
        // in the margin), the bound's below its own, one label when they are equal.
        let label = |out: &mut String, x: f64, y: f64, anchor: &str, colour: &str, text: String| {
            let _ = writeln!(
                out,
                "<text class=\"label\" x=\"{x:.2}\" y=\"{y:.2}\" text-anchor=\"{anchor}\" fill=\"{colour}\">{text}</text>"
            );
        };
        if self.arena == self.lower_bound {
            let text = format!("arena = lower bound {}", bytes(self.arena));
            label(out, x1 - 4.0, ya - 4.0, "end", "#c0392b", text);
        } else {
            label(
                out,
                x1 - 4.0,
                ya - 4.0,
                "end",
                "#c0392b",
                format!("arena {}", bytes(self.arena)),
            );
            let text = format!("lower bound {}", bytes(self.lower_bound));
            label(out, x1 - 4.0, yl + 13.0, "end", "#1a7f37", text);
        }
        // The peak: a dotted line across, a dot on the bound, its label by the x axis.
        let xp = self.x(self.peak);
        let bottom = MARGIN.2 + self.plot.1;
        let _ = writeln!(
            out,
            "<line class=\"peak\" x1=\"{xp:.2}\" y1=\"{:.2}\" x2=\"{xp:.2}\" y2=\"{bottom:.2}\"><title>peak: {} bytes live at step {}</title></line>\n<circle cx=\"{xp:.2}\" cy=\"{yl:.2}\" r=\"4\" fill=\"#8e44ad\"><title>peak: {} bytes live at step {}</title></circle>",
            MARGIN.2,
            self.lower_bound,
            self.peak,
            self.lower_bound,
            self.peak,
        );
        let (x, anchor) = if xp > x0 + 0.8 * self.plot.0 {
            (xp - 5.0, "end")
        } else {
            (xp + 5.0, "start")
        };
        label(
            out,
            x,
            bottom - 6.0,
            anchor,
            "#8e44ad",
            format!("peak at step {}", self.peak),
        );
        out.push_str("</g>\n");
    }
}

/// The coverage of the aggregate cells by buffers below a pixel.
struct Cells {
    cols: usize,
    rows: usize,
    /// Covered square pixels per cell, row by row.
    cover: Vec<f64>,
    /// Buffers that touch each cell.
    count: Vec<u32>,
    plot: (f64, f64),
}

impl Cells {
    fn new(w: f64, h: f64) -> Cells {
        let (cols, rows) = ((w / CELL).ceil() as usize, (h / CELL).ceil() as usize);
        Cells {
            cols,
            rows,
            cover: vec![0.0; cols * rows],
            count: vec![0; cols * rows],
            plot: (w, h),
        }
    }

    /// Adds the rectangle `(x, y, w, h)` (plot coordinates) to the cells it covers.
    fn add(&mut self, x: f64, y: f64, w: f64, h: f64) {
        // A buffer thinner than a hair still counts as a hair: it must show.
        let (w, h) = (w.max(0.05), h.max(0.05));
        // (min then max: never a panic when rounding makes a rectangle a hair too wide.)
        let (x, y) = (
            x.min(self.plot.0 - w).max(0.0),
            y.min(self.plot.1 - h).max(0.0),
        );
        let c0 = ((x / CELL) as usize).min(self.cols - 1);
        let c1 = (((x + w) / CELL) as usize).min(self.cols - 1);
        let r0 = ((y / CELL) as usize).min(self.rows - 1);
        let r1 = (((y + h) / CELL) as usize).min(self.rows - 1);
        for r in r0..=r1 {
            let top = (r as f64 * CELL).max(y);
            let bottom = ((r + 1) as f64 * CELL).min(y + h);
            for c in c0..=c1 {
                let left = (c as f64 * CELL).max(x);
                let right = ((c + 1) as f64 * CELL).min(x + w);
                let k = r * self.cols + c;
                self.cover[k] += (right - left).max(0.0) * (bottom - top).max(0.0);
                self.count[k] += 1;
            }
        }
    }

    /// One rectangle per run of cells of equal shade in a row.
    fn write(&self, out: &mut String) {
        out.push_str("<g class=\"small\">\n");
        let shade = |k: usize| -> u32 {
            if self.count[k] == 0 {
                0
            } else {
                ((self.cover[k] / (CELL * CELL) * SHADES).ceil() as u32).clamp(1, SHADES as u32)
            }
        };
        for r in 0..self.rows {
            let mut c = 0;
            while c < self.cols {
                let s = shade(r * self.cols + c);
                let start = c;
                let mut touches = 0u64;
                while c < self.cols && shade(r * self.cols + c) == s {
                    touches += u64::from(self.count[r * self.cols + c]);
                    c += 1;
                }
                if s == 0 {
                    continue;
                }
                let x = MARGIN.0 + start as f64 * CELL;
                let w = ((c - start) as f64 * CELL).min(MARGIN.0 + self.plot.0 - x);
                let y = MARGIN.2 + r as f64 * CELL;
                let h = CELL.min(MARGIN.2 + self.plot.1 - y);
                let _ = writeln!(
                    out,
                    "<rect x=\"{x:.2}\" y=\"{y:.2}\" width=\"{w:.2}\" height=\"{h:.2}\" fill-opacity=\"{:.3}\"><title>buffers below a pixel ({touches} cell touches): about {:.0}% of this strip</title></rect>",
                    f64::from(s) / SHADES,
                    f64::from(s) / SHADES * 100.0
                );
            }
        }
        out.push_str("</g>\n");
    }
}

/// Tick positions between `first` and `end`: round numbers (powers of two for bytes),
/// four to ten of them.
fn ticks(first: u64, end: u64, binary: bool) -> Vec<u64> {
    let span = end.saturating_sub(first).max(1);
    let raw = span.div_ceil(8).max(1);
    let step = if binary {
        raw.next_power_of_two()
    } else {
        let mag = 10u64.pow(raw.ilog10());
        [1, 2, 5, 10]
            .iter()
            .map(|m| m * mag)
            .find(|&s| s >= raw)
            .unwrap_or(10 * mag)
    };
    let mut t = first.div_ceil(step).checked_mul(step);
    let mut out = Vec::new();
    while let Some(v) = t.filter(|&v| v <= end && out.len() < 16) {
        out.push(v);
        t = v.checked_add(step);
    }
    out
}

/// `bytes` in B, KiB, MiB or GiB.
fn bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else if v.fract() == 0.0 {
        format!("{v:.0} {}", UNITS[u])
    } else {
        format!("{v:.2} {}", UNITS[u])
    }
}

/// `s` with the characters XML gives a meaning to replaced by entities.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && c != '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::super::problem::Buffer;
    use super::*;

    #[test]
    fn a_small_plan_draws_every_buffer_with_its_title() {
        let p = Problem::new(vec![
            Buffer::new(0, 0, 2, 64),
            Buffer::new(1, 1, 4, 32),
            Buffer::new(2, 2, 4, 64),
        ]);
        let options = SvgOptions {
            title: "a <small> & \"odd\" plan".into(),
            names: vec!["x".into(), "y".into(), "z&".into()],
            ..SvgOptions::default()
        };
        let s = svg(&p, &[0, 64, 0], &options).unwrap();
        assert_eq!(s.matches("<rect class=\"b\"").count(), 3);
        assert!(s.contains("<title>y: offset 64, 32 bytes, steps [1, 4)</title>"));
        assert!(s.contains("z&amp;: offset 0"));
        assert!(s.contains("a &lt;small&gt; &amp; &quot;odd&quot; plan"));
        assert!(s.contains("arena = lower bound 96 B"));
        assert!(s.contains("peak at step 1"));
        assert!(s.contains("\n2,z&amp;,2,4,64,0,1\n"), "metadata row");
    }

    #[test]
    fn sub_pixel_buffers_are_aggregated() {
        // 2,000 buffers of 8 bytes in an arena of 16,000 (drawn, not a valid plan): none
        // is a pixel tall.
        let bufs: Vec<Buffer> = (0..2000)
            .map(|i| Buffer::new(i, i as u64 % 1000, (i as u64 % 1000) + 3, 8))
            .collect();
        let offsets: Vec<u64> = (0..2000).map(|i| i * 8).collect();
        let p = Problem::new(bufs);
        let s = svg(&p, &offsets, &SvgOptions::default()).unwrap();
        assert_eq!(s.matches("<rect class=\"b\"").count(), 0);
        assert!(s.contains("buffers below a pixel"));
        assert_eq!(s.matches(",0\n").count(), 2000, "all listed as not drawn");
    }

    #[test]
    fn bad_input_is_an_error() {
        let p = Problem::new(vec![Buffer::new(0, 0, 2, 64)]);
        assert!(matches!(
            svg(&p, &[], &SvgOptions::default()),
            Err(PlanError::InvalidPlan { .. })
        ));
        let o = SvgOptions {
            names: vec!["a".into(), "b".into()],
            ..SvgOptions::default()
        };
        assert!(svg(&p, &[0], &o).is_err());
        let bad = Problem::new(vec![Buffer::new(0, 2, 2, 64)]);
        assert!(matches!(
            svg(&bad, &[0], &SvgOptions::default()),
            Err(PlanError::EmptyLifetime { .. })
        ));
        let empty = svg(&Problem::default(), &[], &SvgOptions::default()).unwrap();
        assert!(empty.contains("0 buffers"));
    }

    #[test]
    fn ticks_and_bytes() {
        assert_eq!(ticks(0, 10, false), vec![0, 2, 4, 6, 8, 10]);
        assert_eq!(ticks(0, 4096, true).len(), 9);
        assert_eq!(bytes(1536), "1.50 KiB");
        assert_eq!(bytes(1 << 20), "1 MiB");
        let top = ticks(u64::MAX - 10, u64::MAX, false);
        assert!(!top.is_empty() && top.iter().all(|&t| t >= u64::MAX - 10));
    }
}
