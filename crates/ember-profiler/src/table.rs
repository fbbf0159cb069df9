//! `key_averages()` and `table(sort_by, row_limit)`: events grouped by name (and input
//! shapes), with PyTorch's columns, formats and footer.

use std::collections::HashMap;
use std::fmt::Write as _;

use crate::error::{ProfilerError, Result};
use crate::event::{EventType, Profile};

/// One row of [`KeyAverages`]: every event of one name (and input shapes). Times in ns.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FunctionEventAvg {
    /// The events' name.
    pub key: String,
    /// Their input shapes, when grouped by them.
    pub input_shapes: Option<String>,
    /// The first frames of their call stack, when grouped by them (`group_by_stack_n`).
    pub stack: Vec<String>,
    /// How many events.
    pub count: u64,
    /// Host time inside the events, children included.
    pub cpu_time_total: u64,
    /// Host time inside the events, children excluded.
    pub self_cpu_time_total: u64,
    /// Device time of the work they (and their children) launched.
    pub device_time_total: u64,
    /// Device time of the work they launched themselves.
    pub self_device_time_total: u64,
    /// Host bytes allocated minus freed inside them, children included.
    pub cpu_memory_usage: i64,
    /// Host bytes allocated minus freed directly inside them.
    pub self_cpu_memory_usage: i64,
    /// Device bytes allocated minus freed inside them, children included.
    pub device_memory_usage: i64,
    /// Device bytes allocated minus freed directly inside them.
    pub self_device_memory_usage: i64,
}

impl FunctionEventAvg {
    fn metric(&self, key: SortKey) -> f64 {
        let per_call = |v: u64| v as f64 / self.count.max(1) as f64;
        match key {
            SortKey::CpuTime => per_call(self.cpu_time_total),
            SortKey::DeviceTime => per_call(self.device_time_total),
            SortKey::CpuTimeTotal => self.cpu_time_total as f64,
            SortKey::DeviceTimeTotal => self.device_time_total as f64,
            SortKey::SelfCpuTimeTotal => self.self_cpu_time_total as f64,
            SortKey::SelfDeviceTimeTotal => self.self_device_time_total as f64,
            SortKey::CpuMemory => self.cpu_memory_usage as f64,
            SortKey::DeviceMemory => self.device_memory_usage as f64,
            SortKey::SelfCpuMemory => self.self_cpu_memory_usage as f64,
            SortKey::SelfDeviceMemory => self.self_device_memory_usage as f64,
            SortKey::Count => self.count as f64,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SortKey {
    CpuTime,
    DeviceTime,
    CpuTimeTotal,
    DeviceTimeTotal,
    SelfCpuTimeTotal,
    SelfDeviceTimeTotal,
    CpuMemory,
    DeviceMemory,
    SelfCpuMemory,
    SelfDeviceMemory,
    Count,
}

/// The `sort_by` keys PyTorch's `table` accepts, with `cuda_*` and `device_*` alike.
const SORT_KEYS: &[(&str, SortKey)] = &[
    ("cpu_time", SortKey::CpuTime),
    ("cuda_time", SortKey::DeviceTime),
    ("device_time", SortKey::DeviceTime),
    ("cpu_time_total", SortKey::CpuTimeTotal),
    ("cuda_time_total", SortKey::DeviceTimeTotal),
    ("device_time_total", SortKey::DeviceTimeTotal),
    ("self_cpu_time_total", SortKey::SelfCpuTimeTotal),
    ("self_cuda_time_total", SortKey::SelfDeviceTimeTotal),
    ("self_device_time_total", SortKey::SelfDeviceTimeTotal),
    ("cpu_memory_usage", SortKey::CpuMemory),
    ("cuda_memory_usage", SortKey::DeviceMemory),
    ("device_memory_usage", SortKey::DeviceMemory),
    ("self_cpu_memory_usage", SortKey::SelfCpuMemory),
    ("self_cuda_memory_usage", SortKey::SelfDeviceMemory),
    ("self_device_memory_usage", SortKey::SelfDeviceMemory),
    ("count", SortKey::Count),
];

/// The valid `sort_by` keys.
pub fn sort_keys() -> Vec<&'static str> {
    SORT_KEYS.iter().map(|(k, _)| *k).collect()
}

/// Events grouped by name, as `prof.key_averages()`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KeyAverages {
    /// The rows, in order of first occurrence.
    pub rows: Vec<FunctionEventAvg>,
    /// Host self time of all events (the footer's "Self CPU time total"), ns.
    pub self_cpu_time_total: u64,
    /// Device time of all device work, ns.
    pub self_device_time_total: u64,
    has_device: bool,
    has_memory: bool,
    by_shape: bool,
    stack_n: usize,
}

impl KeyAverages {
    /// The row named `key` (the first, when grouped by shapes).
    pub fn get(&self, key: &str) -> Option<&FunctionEventAvg> {
        self.rows.iter().find(|r| r.key == key)
    }

    /// `table(sort_by=..., row_limit=...)`: PyTorch's table, rows sorted by `sort_by`
    /// (descending), at most `row_limit` rows (0: all). An unknown key is an error listing
    /// the valid ones.
    pub fn table(&self, sort_by: &str, row_limit: usize) -> Result<String> {
        let key = SORT_KEYS
            .iter()
            .find(|(k, _)| *k == sort_by)
            .map(|(_, v)| *v)
            .ok_or_else(|| ProfilerError::UnknownSortKey {
                key: sort_by.to_string(),
                valid: sort_keys(),
            })?;
        let mut rows: Vec<&FunctionEventAvg> = self.rows.iter().collect();
        rows.sort_by(|a, b| b.metric(key).total_cmp(&a.metric(key)));
        if row_limit > 0 {
            rows.truncate(row_limit);
        }
        Ok(self.render(&rows))
    }

    fn render(&self, rows: &[&FunctionEventAvg]) -> String {
        const COLUMN: usize = 12;
        const MAX_NAME: usize = 55;
        const MAX_SHAPES: usize = 80;
        const MAX_STACK: usize = 100;
        let name_width = rows
            .iter()
            .map(|r| r.key.chars().count() + 4)
            .max()
            .unwrap_or(8)
            .clamp(8, MAX_NAME);
        let shapes_width = rows
            .iter()
            .map(|r| r.input_shapes.as_deref().map_or(0, str::len) + 4)
            .max()
            .unwrap_or(16)
            .clamp(16, MAX_SHAPES);
        let mut headers: Vec<(&str, usize)> = vec![
            ("Name", name_width),
            ("Self CPU %", COLUMN),
            ("Self CPU", COLUMN),
            ("CPU total %", COLUMN),
            ("CPU total", COLUMN),
            ("CPU time avg", COLUMN),
        ];
        if self.has_device {
            headers.extend([
                ("Self CUDA", COLUMN),
                ("Self CUDA %", COLUMN),
                ("CUDA total", COLUMN),
                ("CUDA time avg", COLUMN),
            ]);
        }
        if self.has_memory {
            headers.extend([("CPU Mem", COLUMN), ("Self CPU Mem", COLUMN)]);
            if self.has_device {
                headers.extend([("CUDA Mem", COLUMN), ("Self CUDA Mem", COLUMN)]);
            }
        }
        headers.push(("# of Calls", COLUMN));
        if self.by_shape {
            headers.push(("Input Shapes", shapes_width));
        }
        let stack_width = rows
            .iter()
            .flat_map(|r| &r.stack)
            .map(|f| f.chars().count() + 4)
            .max()
            .unwrap_or(16)
            .clamp(16, MAX_STACK);
        if self.stack_n > 0 {
            headers.push(("Source Location", stack_width));
        }
        let sep: String = headers.iter().map(|(_, w)| "-".repeat(*w) + "  ").collect();
        let line = |cells: Vec<String>| -> String {
            let mut out = String::new();
            for (cell, (_, w)) in cells.iter().zip(&headers) {
                let _ = write!(out, "{:>w$}  ", truncate(cell, *w), w = *w);
            }
            out
        };
        let mut out = String::new();
        out.push_str(&sep);
        out.push('\n');
        out.push_str(&line(headers.iter().map(|(h, _)| h.to_string()).collect()));
        out.push('\n');
        out.push_str(&sep);
        out.push('\n');
        let (cpu_all, dev_all) = (self.self_cpu_time_total, self.self_device_time_total);
        for r in rows {
            let calls = r.count.max(1);
            let mut cells = vec![
                r.key.clone(),
                share(r.self_cpu_time_total, cpu_all),
                time(r.self_cpu_time_total),
                share(r.cpu_time_total, cpu_all),
                time(r.cpu_time_total),
                time(r.cpu_time_total / calls),
            ];
            if self.has_device {
                cells.extend([
                    time(r.self_device_time_total),
                    share(r.self_device_time_total, dev_all),
                    time(r.device_time_total),
                    time(r.device_time_total / calls),
                ]);
            }
            if self.has_memory {
                cells.extend([memory(r.cpu_memory_usage), memory(r.self_cpu_memory_usage)]);
                if self.has_device {
                    cells.extend([
                        memory(r.device_memory_usage),
                        memory(r.self_device_memory_usage),
                    ]);
                }
            }
            cells.push(r.count.to_string());
            if self.by_shape {
                cells.push(r.input_shapes.clone().unwrap_or_default());
            }
            if self.stack_n > 0 {
                cells.push(r.stack.first().cloned().unwrap_or_default());
            }
            out.push_str(&line(cells));
            out.push('\n');
            // PyTorch writes the further frames on lines of their own, the other cells empty.
            if self.stack_n > 0 {
                for frame in r.stack.iter().skip(1) {
                    let mut cells = vec![String::new(); headers.len() - 1];
                    cells.push(frame.clone());
                    out.push_str(&line(cells));
                    out.push('\n');
                }
            }
        }
        out.push_str(&sep);
        out.push('\n');
        let _ = writeln!(out, "Self CPU time total: {}", time(cpu_all));
        if self.has_device {
            let _ = writeln!(out, "Self CUDA time total: {}", time(dev_all));
        }
        out
    }
}

fn truncate(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        return s.to_string();
    }
    let kept: String = s.chars().take(width.saturating_sub(3)).collect();
    kept + "..."
}

/// PyTorch's `_format_time` (from ns).
fn time(ns: u64) -> String {
    let us = ns as f64 / 1e3;
    if us >= 1e6 {
        format!("{:.3}s", us / 1e6)
    } else if us >= 1e3 {
        format!("{:.3}ms", us / 1e3)
    } else {
        format!("{us:.3}us")
    }
}

/// PyTorch's `_format_time_share`.
fn share(part: u64, total: u64) -> String {
    if total == 0 {
        return "NaN".into();
    }
    format!("{:.2}%", part as f64 * 100.0 / total as f64)
}

/// PyTorch's `_format_memory`.
pub(crate) fn memory(bytes: i64) -> String {
    const KB: f64 = 1024.0;
    let b = bytes as f64;
    if b.abs() >= KB * KB * KB {
        format!("{:.2} GB", b / (KB * KB * KB))
    } else if b.abs() >= KB * KB {
        format!("{:.2} MB", b / (KB * KB))
    } else if b.abs() >= KB {
        format!("{:.2} KB", b / KB)
    } else {
        format!("{bytes} B")
    }
}

impl Profile {
    /// `key_averages(group_by_input_shape=...)` over this trace.
    pub fn key_averages(&self, group_by_input_shape: bool) -> KeyAverages {
        self.key_averages_grouped(group_by_input_shape, 0)
    }

    /// `key_averages(group_by_input_shape=..., group_by_stack_n=...)`: with
    /// `group_by_stack_n > 0`, events are told apart by the first that many frames of their
    /// call stack too (events recorded without one group as an empty stack).
    pub fn key_averages_grouped(
        &self,
        group_by_input_shape: bool,
        group_by_stack_n: usize,
    ) -> KeyAverages {
        let ev = &self.events;
        let n = ev.len();
        let mut child_cpu = vec![0u64; n];
        let mut self_dev = vec![0u64; n];
        let mut total_dev = vec![0u64; n];
        let mut self_mem = vec![(0i64, 0i64); n];
        let mut total_mem = vec![(0i64, 0i64); n];
        let ancestors = |mut i: Option<usize>, f: &mut dyn FnMut(usize)| {
            while let Some(a) = i {
                f(a);
                i = ev[a].parent;
            }
        };
        let mut dev_all = 0;
        for (i, e) in ev.iter().enumerate() {
            match e.kind {
                k if k.is_device() => {
                    dev_all += e.dur_ns;
                    self_dev[i] += e.dur_ns;
                    total_dev[i] += e.dur_ns;
                    // The kernel's op: the parent of the runtime call that launched it.
                    if let Some(op) = e.parent.and_then(|r| ev[r].parent) {
                        self_dev[op] += e.dur_ns;
                        ancestors(Some(op), &mut |a| total_dev[a] += e.dur_ns);
                    }
                }
                EventType::Memory => {
                    let Some(m) = &e.memory else { continue };
                    let add = |slot: &mut (i64, i64)| match m.cuda {
                        None => slot.0 += m.bytes,
                        Some(_) => slot.1 += m.bytes,
                    };
                    if let Some(p) = e.parent {
                        add(&mut self_mem[p]);
                    }
                    ancestors(e.parent, &mut |a| add(&mut total_mem[a]));
                }
                _ => {
                    if let Some(p) = e.parent {
                        child_cpu[p] += e.dur_ns;
                    }
                }
            }
        }
        let mut rows: Vec<FunctionEventAvg> = Vec::new();
        let mut index: HashMap<(String, Option<String>, Vec<String>), usize> = HashMap::new();
        let mut cpu_all = 0;
        for (i, e) in ev.iter().enumerate() {
            if e.kind == EventType::Memory {
                continue;
            }
            let shapes = if group_by_input_shape {
                Some(e.input_shapes.clone().unwrap_or_else(|| "[]".into()))
            } else {
                None
            };
            let stack: Vec<String> = e.stack.iter().take(group_by_stack_n).cloned().collect();
            let slot = *index
                .entry((e.name.clone(), shapes.clone(), stack.clone()))
                .or_insert_with(|| {
                    rows.push(FunctionEventAvg {
                        key: e.name.clone(),
                        input_shapes: shapes,
                        stack,
                        ..FunctionEventAvg::default()
                    });
                    rows.len() - 1
                });
            let r = &mut rows[slot];
            r.count += 1;
            if !e.kind.is_device() {
                let self_cpu = e.dur_ns.saturating_sub(child_cpu[i]);
                r.cpu_time_total += e.dur_ns;
                r.self_cpu_time_total += self_cpu;
                cpu_all += self_cpu;
            }
            r.device_time_total += total_dev[i];
            r.self_device_time_total += self_dev[i];
            r.cpu_memory_usage += total_mem[i].0;
            r.self_cpu_memory_usage += self_mem[i].0;
            r.device_memory_usage += total_mem[i].1;
            r.self_device_memory_usage += self_mem[i].1;
        }
        KeyAverages {
            rows,
            self_cpu_time_total: cpu_all,
            self_device_time_total: dev_all,
            has_device: ev.iter().any(|e| e.kind.is_device()),
            has_memory: self.profile_memory,
            by_shape: group_by_input_shape,
            stack_n: group_by_stack_n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_as_pytorch() {
        assert_eq!(time(74_873), "74.873us");
        assert_eq!(time(3_481_000), "3.481ms");
        assert_eq!(time(2_500_000_000), "2.500s");
        assert_eq!(share(1, 4), "25.00%");
        assert_eq!(share(0, 0), "NaN");
        assert_eq!(memory(408), "408 B");
        assert_eq!(memory(-1700), "-1.66 KB");
        assert_eq!(memory(3 << 20), "3.00 MB");
        assert_eq!(memory(5 << 30), "5.00 GB");
        assert_eq!(truncate("abcdefgh", 6), "abc...");
    }

    #[test]
    fn unknown_sort_key_lists_the_valid_ones() {
        let e = KeyAverages::default()
            .table("cuda_time_totl", 10)
            .expect_err("unknown key");
        let msg = e.to_string();
        assert!(msg.contains("\"cuda_time_totl\""), "{msg}");
        for k in sort_keys() {
            assert!(msg.contains(k), "{msg} lacks {k}");
        }
    }

    #[test]
    fn empty_table_has_header_and_footer() {
        let t = KeyAverages::default()
            .table("cpu_time_total", 0)
            .expect("valid key");
        assert!(t.contains("Name") && t.contains("# of Calls"), "{t}");
        assert!(t.ends_with("Self CPU time total: 0.000us\n"), "{t}");
    }
}
