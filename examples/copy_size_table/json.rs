//! JSON output for tools (hand-written: no serde dependency for one object).
//!
//! ```json
//! {"machine": "...", "cpu_model": "...", "kernel": "...", "cpus": [0, 1],
//!  "default_backend": "sharded", "duration_ms": 800, "reps": 3,
//!  "unit": "loops per second, summed over threads",
//!  "threads": [1, 2], "sizes": [0, 32],
//!  "kinds": ["atomic", "percpu/sharded", "floor"],
//!  "cells": [{"kind": "atomic", "threads": 1, "size": 0, "median": 1.0,
//!             "min": 1.0, "max": 1.0, "spread_pct": 0.0, "min_cpu_share": 0.998,
//!             "samples": [1.0], "ns_per_loop": 1.000,
//!             "overhead_ns": 0.500, "overhead_ns_lo": 0.400, "overhead_ns_hi": 0.600}],
//!  "explanation": "On 1 CPU the copy itself ..."}
//! ```
//!
//! `ns_per_loop` is `1e9 x threads / median`; `overhead_ns` is that minus
//! the floor's in the same cell, as measured (it can be negative), with the
//! range the runs give in `_lo` / `_hi`; all three are null for the floor.

use crate::results::{Overhead, Results};
use std::fmt::Write;

/// `s` as a JSON string literal.
pub fn string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            '\n' => out += "\\n",
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out + "\""
}

/// A finite number (JSON has no NaN or infinity: those become null).
fn number(x: f64) -> String {
    decimals(x, 1)
}

/// `number` with `d` decimals: ns values need more than loop counts.
fn decimals(x: f64, d: usize) -> String {
    if x.is_finite() {
        format!("{x:.d$}")
    } else {
        "null".to_string()
    }
}

fn list<T>(items: &[T], f: impl Fn(&T) -> String) -> String {
    format!("[{}]", items.iter().map(f).collect::<Vec<_>>().join(", "))
}

/// The whole matrix as one JSON object.
pub fn render(r: &Results) -> String {
    let m = &r.meta;
    let mut out = String::from("{\n");
    let _ = writeln!(out, "  \"machine\": {},", string(&m.machine()));
    let _ = writeln!(out, "  \"cpu_model\": {},", string(&m.cpu_model));
    let _ = writeln!(out, "  \"kernel\": {},", string(&m.kernel));
    let _ = writeln!(
        out,
        "  \"cpus\": {},",
        list(&m.allowed_cpus, usize::to_string)
    );
    let _ = writeln!(
        out,
        "  \"default_backend\": {},",
        string(&m.default_backend)
    );
    let _ = writeln!(out, "  \"duration_ms\": {},", m.duration.as_millis());
    let _ = writeln!(out, "  \"reps\": {},", m.reps);
    let _ = writeln!(
        out,
        "  \"unit\": \"loops per second, summed over threads\","
    );
    let _ = writeln!(
        out,
        "  \"threads\": {},",
        list(&r.threads, usize::to_string)
    );
    let _ = writeln!(out, "  \"sizes\": {},", list(&r.sizes, usize::to_string));
    let _ = writeln!(
        out,
        "  \"kinds\": {},",
        list(&r.kinds, |k| string(&k.name()))
    );
    out += "  \"cells\": [\n";
    let cells: Vec<String> = r
        .cells
        .iter()
        .map(|c| {
            let o = r.overhead(c.kind, c.threads, c.size);
            let ons = |f: fn(&Overhead) -> f64| decimals(o.as_ref().map_or(f64::NAN, f), 3);
            format!(
                "    {{\"kind\": {}, \"threads\": {}, \"size\": {}, \"median\": {}, \
                 \"min\": {}, \"max\": {}, \"spread_pct\": {}, \"min_cpu_share\": {:.3}, \
                 \"samples\": {}, \"ns_per_loop\": {}, \"overhead_ns\": {}, \
                 \"overhead_ns_lo\": {}, \"overhead_ns_hi\": {}}}",
                string(&c.kind.name()),
                c.threads,
                c.size,
                number(c.median()),
                number(c.min()),
                number(c.max()),
                number(c.spread_pct()),
                c.min_cpu_share(),
                list(&c.samples, |&x| number(x)),
                decimals(c.ns_per_loop(), 3),
                ons(|o| o.ns),
                ons(|o| o.lo),
                ons(|o| o.hi),
            )
        })
        .collect();
    out += &cells.join(",\n");
    out += "\n  ]";
    if let Some(p) = crate::explain::paragraph(r) {
        let _ = write!(out, ",\n  \"explanation\": {}", string(&p));
    }
    out += "\n}\n";
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::tests::sample_results;

    #[test]
    fn escapes_strings() {
        assert_eq!(string("a\"b\\c\nd\u{1}"), "\"a\\\"b\\\\c\\nd\\u0001\"");
    }

    #[test]
    fn renders_every_cell_with_balanced_brackets() {
        let r = sample_results();
        let j = render(&r);
        assert_eq!(j.matches("\"kind\": ").count(), r.cells.len());
        assert!(j.contains("\"cpu_model\": \"Test \\\"CPU\\\"\""), "{j}");
        assert!(
            j.contains("\"kinds\": [\"atomic\", \"percpu/sharded\", \"floor\"]"),
            "{j}"
        );
        assert!(
            j.contains(
                "{\"kind\": \"atomic\", \"threads\": 1, \"size\": 0, \"median\": 100000000.0, \
             \"min\": 99000000.0, \"max\": 102000000.0, \"spread_pct\": 3.0, \"min_cpu_share\": 0.990, \"samples\": \
             [99000000.0, 100000000.0, 102000000.0], \"ns_per_loop\": 10.000, \
             \"overhead_ns\": 9.000, \"overhead_ns_lo\": 8.794, \"overhead_ns_hi\": 9.121}"
            ),
            "{j}"
        );
        // The floor has a cost but no overhead.
        assert!(
            j.contains(
                "\"samples\": [1980000000.0, 2000000000.0, 2040000000.0], \
                 \"ns_per_loop\": 1.000, \"overhead_ns\": null, \"overhead_ns_lo\": null, \
                 \"overhead_ns_hi\": null}"
            ),
            "{j}"
        );
        assert!(
            j.contains("\"explanation\": \"On 1 CPU the copy itself"),
            "{j}"
        );
        // Outside string literals, brackets and braces balance.
        let (mut depth, mut in_str, mut esc) = (0i32, false, false);
        for ch in j.chars() {
            match (in_str, esc, ch) {
                (true, true, _) => esc = false,
                (true, false, '\\') => esc = true,
                (_, _, '"') => in_str = !in_str,
                (false, _, '{' | '[') => depth += 1,
                (false, _, '}' | ']') => {
                    depth -= 1;
                    assert!(depth >= 0);
                }
                _ => {}
            }
        }
        assert_eq!((depth, in_str), (0, false));
        assert_eq!(number(f64::NAN), "null");
    }
}
