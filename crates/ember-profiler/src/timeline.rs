//! The memory timeline: [`Profile::memory_timeline`] (allocated bytes per device over time,
//! by category) and [`Profile::export_memory_timeline`] (one self-contained HTML page with an
//! SVG chart per device; no scripts, no network).
//!
//! Note [Memory categories]:
//!
//! The allocator's points say how many bytes were allocated or freed, where, and inside which
//! op. The category of an allocation comes from where it was made and where it was freed, as
//! PyTorch's memory timeline infers it from the op graph, in a simpler form:
//!
//! | made inside | freed | category |
//! | --- | --- | --- |
//! | an optimizer step (`Optimizer.step#...`) | inside an optimizer step | temporaries |
//! | an optimizer step | later, or never in the trace | optimizer state |
//! | an autograd node (backward) | inside a node | temporaries |
//! | an autograd node | later, or never (the `.grad` it became) | gradients |
//! | anything else (the forward) | inside a node | activations (saved for backward) |
//! | anything else | outside a node | temporaries |
//! | anything else | never in the trace | activations (outputs still held) |
//!
//! Bytes allocated before the trace began form the bottom band, "before the trace" (the
//! parameters and, after the first step, the optimizer state, which were there already).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;

use crate::chrome::write_atomically;
use crate::error::Result;
use crate::event::{Event, EventType, Profile};

/// What an allocation was for (Note [Memory categories]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MemoryCategory {
    /// Allocated before the trace began.
    BeforeTrace,
    /// Parameter gradients made by the backward pass.
    Gradients,
    /// State an optimizer step keeps.
    OptimizerState,
    /// Forward results kept for the backward pass.
    Activations,
    /// Freed within the op family that made them.
    Temporaries,
}

impl MemoryCategory {
    /// Bottom to top of the stack.
    pub const ALL: [MemoryCategory; 5] = [
        MemoryCategory::BeforeTrace,
        MemoryCategory::OptimizerState,
        MemoryCategory::Gradients,
        MemoryCategory::Activations,
        MemoryCategory::Temporaries,
    ];

    /// The legend's name.
    pub fn name(self) -> &'static str {
        match self {
            MemoryCategory::BeforeTrace => "before the trace",
            MemoryCategory::Gradients => "gradients",
            MemoryCategory::OptimizerState => "optimizer state",
            MemoryCategory::Activations => "activations",
            MemoryCategory::Temporaries => "temporaries",
        }
    }

    /// Its fill colour in the chart.
    pub fn color(self) -> &'static str {
        match self {
            MemoryCategory::BeforeTrace => "#9c9c9c",
            MemoryCategory::OptimizerState => "#59a14f",
            MemoryCategory::Gradients => "#4e79a7",
            MemoryCategory::Activations => "#f28e2b",
            MemoryCategory::Temporaries => "#e15759",
        }
    }
}

/// One device's memory over the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct DeviceTimeline {
    /// `cpu` or `cuda:N`.
    pub device: String,
    /// The instants (ns since the trace began) at which the values below hold, from then on.
    pub times_ns: Vec<u64>,
    /// Live bytes per category at each instant; only categories with bytes at some instant.
    pub series: Vec<(MemoryCategory, Vec<i64>)>,
    /// The allocator's allocated bytes at each instant.
    pub allocated: Vec<i64>,
    /// The allocator's reserved bytes at each instant.
    pub reserved: Vec<i64>,
    /// The highest allocated bytes, and when.
    pub peak: (u64, i64),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    Forward,
    Backward,
    Optimizer,
}

fn context(events: &[Event], mut i: Option<usize>) -> Context {
    while let Some(p) = i {
        let e = &events[p];
        if e.kind == EventType::Backward {
            return Context::Backward;
        }
        if e.name.starts_with("Optimizer.step#") {
            return Context::Optimizer;
        }
        i = e.parent;
    }
    Context::Forward
}

impl Profile {
    /// Allocated bytes per device over time, by category (Note [Memory categories]). Empty
    /// without `profile_memory`.
    pub fn memory_timeline(&self) -> Vec<DeviceTimeline> {
        let mut per_device: Vec<(String, Vec<usize>)> = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            let Some(m) = &e.memory else { continue };
            let name = m
                .cuda
                .map_or_else(|| "cpu".to_string(), |d| format!("cuda:{d}"));
            match per_device.iter_mut().find(|(n, _)| *n == name) {
                Some((_, v)) => v.push(i),
                None => per_device.push((name, vec![i])),
            }
        }
        per_device.sort_by(|a, b| a.0.cmp(&b.0));
        per_device
            .into_iter()
            .map(|(device, idx)| self.device_timeline(device, &idx))
            .collect()
    }

    fn device_timeline(&self, device: String, idx: &[usize]) -> DeviceTimeline {
        let ev = &self.events;
        let rec = |i: usize| ev[i].memory.as_ref();
        // Each allocation's category, from where it was made and where it was freed.
        let mut live: HashMap<u64, (MemoryCategory, i64, usize)> = HashMap::new();
        let mut category_of: HashMap<usize, MemoryCategory> = HashMap::new();
        let mut pending: HashMap<u64, usize> = HashMap::new();
        for &i in idx {
            let Some(m) = rec(i) else { continue };
            if m.bytes > 0 {
                pending.insert(m.addr, i);
            } else if let Some(a) = pending.remove(&m.addr) {
                let made = context(ev, ev[a].parent);
                let freed = context(ev, ev[i].parent);
                category_of.insert(a, categorize(made, Some(freed)));
            }
        }
        for (_, a) in pending {
            category_of.insert(a, categorize(context(ev, ev[a].parent), None));
        }
        let first = idx.first().and_then(|&i| rec(i));
        let before = first.map_or(0, |m| {
            m.total_allocated - m.bytes.max(0) + (-m.bytes).max(0)
        });
        let mut bytes: HashMap<MemoryCategory, i64> = HashMap::new();
        bytes.insert(MemoryCategory::BeforeTrace, before);
        let (mut times, mut allocated, mut reserved) = (vec![0], vec![before], vec![before]);
        let mut rows: Vec<HashMap<MemoryCategory, i64>> = vec![bytes.clone()];
        if let Some(m) = first {
            reserved[0] = m.total_reserved;
        }
        let mut peak = (0, before);
        for &i in idx {
            let Some(m) = rec(i) else { continue };
            if m.bytes > 0 {
                let c = category_of
                    .get(&i)
                    .copied()
                    .unwrap_or(MemoryCategory::Temporaries);
                live.insert(m.addr, (c, m.bytes, i));
                *bytes.entry(c).or_default() += m.bytes;
            } else {
                let c = match live.remove(&m.addr) {
                    Some((c, _, _)) => c,
                    None => MemoryCategory::BeforeTrace,
                };
                *bytes.entry(c).or_default() += m.bytes;
            }
            times.push(ev[i].start_ns);
            allocated.push(m.total_allocated);
            reserved.push(m.total_reserved);
            rows.push(bytes.clone());
            if m.total_allocated > peak.1 {
                peak = (ev[i].start_ns, m.total_allocated);
            }
        }
        let series = MemoryCategory::ALL
            .iter()
            .filter_map(|&c| {
                let v: Vec<i64> = rows
                    .iter()
                    .map(|r| r.get(&c).copied().unwrap_or(0).max(0))
                    .collect();
                v.iter().any(|&b| b > 0).then_some((c, v))
            })
            .collect();
        DeviceTimeline {
            device,
            times_ns: times,
            series,
            allocated,
            reserved,
            peak,
        }
    }

    /// `export_memory_timeline(path)`: one self-contained HTML page (inline SVG, no scripts,
    /// no network) with, per device, the bytes allocated stacked by category, the reserved
    /// bytes as a dashed line, and the peak marked. Written atomically.
    pub fn export_memory_timeline(&self, path: impl AsRef<Path>) -> Result<()> {
        let html = memory_timeline_html(&self.memory_timeline(), self.emulated);
        write_atomically("export_memory_timeline", path.as_ref(), html.as_bytes())
    }
}

fn categorize(made: Context, freed: Option<Context>) -> MemoryCategory {
    match (made, freed) {
        (Context::Optimizer, Some(Context::Optimizer)) => MemoryCategory::Temporaries,
        (Context::Optimizer, _) => MemoryCategory::OptimizerState,
        (Context::Backward, Some(Context::Backward)) => MemoryCategory::Temporaries,
        (Context::Backward, _) => MemoryCategory::Gradients,
        (Context::Forward, Some(Context::Backward)) => MemoryCategory::Activations,
        (Context::Forward, Some(_)) => MemoryCategory::Temporaries,
        (Context::Forward, None) => MemoryCategory::Activations,
    }
}

/// The corners of a step function: each value holds from its instant to the next.
fn steps(times: &[u64], values: &[i64]) -> Vec<(u64, i64)> {
    let mut pts = Vec::with_capacity(times.len() * 2);
    for (i, (&t, &v)) in times.iter().zip(values).enumerate() {
        pts.push((t, v));
        pts.push((times.get(i + 1).copied().unwrap_or(t), v));
    }
    pts
}

/// The page: a title, a legend, and one SVG per device. Each stacked band is a
/// `<path class="series" data-series="...">`, the reserved line `class="reserved"`, the peak
/// `class="peak"`.
pub(crate) fn memory_timeline_html(timelines: &[DeviceTimeline], emulated: bool) -> String {
    const W: f64 = 960.0;
    const H: f64 = 320.0;
    const LEFT: f64 = 80.0;
    const BOTTOM: f64 = 40.0;
    const TOP: f64 = 20.0;
    let mut out = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>Ember memory timeline</title><style>\
         body{font-family:sans-serif;margin:24px;background:#fff;color:#222}\
         .legend span{display:inline-block;margin-right:16px}\
         .legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:middle}\
         svg{display:block;margin:8px 0 24px 0}text{font-size:11px;fill:#444}\
         </style></head><body>\n<h1>Memory timeline</h1>\n",
    );
    if emulated {
        out.push_str("<p>Device memory of the CUDA emulator.</p>\n");
    }
    if timelines.is_empty() {
        out.push_str(
            "<p>No allocations were recorded: profile with <code>profile_memory</code> on.</p>\n",
        );
    }
    out.push_str("<p class=\"legend\">");
    for c in MemoryCategory::ALL {
        let _ = write!(
            out,
            "<span><i style=\"background:{}\"></i>{}</span>",
            c.color(),
            c.name()
        );
    }
    out.push_str(
        "<span><i style=\"background:#222;height:2px\"></i>reserved (dashed)</span></p>\n",
    );
    for t in timelines {
        let t_end = t.times_ns.last().copied().unwrap_or(0).max(1) as f64;
        // Scaled to the allocated peak, so the bands stay readable when the allocator
        // reserves far more than it hands out; the reserved line is clipped at the top.
        let y_max = (t.peak.1.max(1) as f64 * 1.15).ceil();
        let reserved_max = t.reserved.iter().copied().max().unwrap_or(0);
        let x = |ns: u64| LEFT + (ns as f64 / t_end) * (W - LEFT - 10.0);
        let y = |b: i64| TOP + (1.0 - b as f64 / y_max) * (H - TOP - BOTTOM);
        let _ = write!(
            out,
            "<h2>{}</h2>\n<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" \
             viewBox=\"0 0 {W} {H}\" data-device=\"{}\">\n",
            t.device, t.device
        );
        // Axes and labels.
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{b}\" x2=\"{r}\" y2=\"{b}\" stroke=\"#888\"/>\
             <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{b}\" stroke=\"#888\"/>\
             <text x=\"4\" y=\"{ty}\">{top}</text><text x=\"4\" y=\"{b}\">0 B</text>\
             <text x=\"{LEFT}\" y=\"{tl}\">0 ms</text>\
             <text x=\"{r2}\" y=\"{tl}\" text-anchor=\"end\">{end:.3} ms</text>",
            b = H - BOTTOM,
            r = W - 10.0,
            ty = TOP + 4.0,
            top = crate::table::memory(y_max as i64),
            tl = H - BOTTOM + 16.0,
            r2 = W - 10.0,
            end = t_end / 1e6,
        );
        // Stacked bands, step functions: each value holds until the next instant.
        let path = |pts: &mut dyn Iterator<Item = (u64, i64)>| -> String {
            let mut d = String::new();
            for (k, (ns, b)) in pts.enumerate() {
                let cmd = if k == 0 { 'M' } else { 'L' };
                let _ = write!(d, "{cmd}{:.2},{:.2}", x(ns), y(b));
            }
            d
        };
        let mut lower = vec![0i64; t.times_ns.len()];
        for (c, values) in &t.series {
            let upper: Vec<i64> = lower.iter().zip(values).map(|(l, v)| l + v).collect();
            let top = steps(&t.times_ns, &upper);
            let bottom = steps(&t.times_ns, &lower);
            let d = path(&mut top.into_iter().chain(bottom.into_iter().rev()));
            let _ = writeln!(
                out,
                "<path class=\"series\" data-series=\"{}\" fill=\"{}\" stroke=\"none\" d=\"{d}Z\"/>",
                c.name(),
                c.color()
            );
            lower = upper;
        }
        let clipped: Vec<i64> = t.reserved.iter().map(|&r| r.min(y_max as i64)).collect();
        let d = path(&mut steps(&t.times_ns, &clipped).into_iter());
        let _ = writeln!(
            out,
            "<path class=\"reserved\" fill=\"none\" stroke=\"#222\" stroke-dasharray=\"6 4\" d=\"{d}\"/>"
        );
        let (px, py) = (x(t.peak.0), y(t.peak.1));
        let _ = writeln!(
            out,
            "<circle class=\"peak\" cx=\"{px:.2}\" cy=\"{py:.2}\" r=\"5\" fill=\"none\" \
             stroke=\"#000\" stroke-width=\"2\"/><text x=\"{tx:.2}\" y=\"{ty:.2}\">peak {} at \
             {:.3} ms</text>",
            crate::table::memory(t.peak.1),
            t.peak.0 as f64 / 1e6,
            tx = (px + 8.0).min(W - 160.0),
            ty = (py - 8.0).max(TOP + 10.0),
        );
        if reserved_max as f64 > y_max {
            let _ = writeln!(
                out,
                "<text x=\"{:.2}\" y=\"{:.2}\" text-anchor=\"end\">reserved up to {} (above \
                 the chart)</text>",
                W - 12.0,
                TOP + 10.0,
                crate::table::memory(reserved_max)
            );
        }
        out.push_str("</svg>\n");
    }
    out.push_str("</body></html>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories_follow_the_note() {
        use Context::{Backward as B, Forward as F, Optimizer as O};
        assert_eq!(categorize(O, Some(O)), MemoryCategory::Temporaries);
        assert_eq!(categorize(O, None), MemoryCategory::OptimizerState);
        assert_eq!(categorize(B, Some(B)), MemoryCategory::Temporaries);
        assert_eq!(categorize(B, Some(F)), MemoryCategory::Gradients);
        assert_eq!(categorize(F, Some(B)), MemoryCategory::Activations);
        assert_eq!(categorize(F, Some(F)), MemoryCategory::Temporaries);
        assert_eq!(categorize(F, None), MemoryCategory::Activations);
    }

    #[test]
    fn an_empty_page_says_why() {
        let html = memory_timeline_html(&[], false);
        assert!(html.contains("No allocations were recorded"));
        assert!(!html.contains("<script"));
    }
}
