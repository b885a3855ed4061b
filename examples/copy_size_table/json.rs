//! JSON output for tools (hand-written: no serde dependency for one object).
//!
//! ```json
//! {"machine": "...", "cpu_model": "...", "kernel": "...", "cpus": [0, 1],
//!  "default_backend": "sharded", "duration_ms": 800, "reps": 3,
//!  "unit": "loops per second, summed over threads",
//!  "threads": [1, 2], "sizes": [0, 32], "kinds": ["atomic", "percpu/sharded"],
//!  "cells": [{"kind": "atomic", "threads": 1, "size": 0, "median": 1.0,
//!             "min": 1.0, "max": 1.0, "spread_pct": 0.0, "min_cpu_share": 0.998,
//!             "samples": [1.0]}]}
//! ```

use crate::results::Results;
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
    if x.is_finite() {
        format!("{x:.1}")
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
            format!(
                "    {{\"kind\": {}, \"threads\": {}, \"size\": {}, \"median\": {}, \
                 \"min\": {}, \"max\": {}, \"spread_pct\": {}, \"min_cpu_share\": {:.3}, \
                 \"samples\": {}}}",
                string(&c.kind.name()),
                c.threads,
                c.size,
                number(c.median()),
                number(c.min()),
                number(c.max()),
                number(c.spread_pct()),
                c.min_cpu_share(),
                list(&c.samples, |&x| number(x)),
            )
        })
        .collect();
    out += &cells.join(",\n");
    out += "\n  ]\n}\n";
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
            j.contains("\"kinds\": [\"atomic\", \"percpu/sharded\"]"),
            "{j}"
        );
        assert!(
            j.contains(
                "{\"kind\": \"atomic\", \"threads\": 1, \"size\": 0, \"median\": 100000000.0, \
             \"min\": 99000000.0, \"max\": 102000000.0, \"spread_pct\": 3.0, \"min_cpu_share\": 0.990, \"samples\": \
             [99000000.0, 100000000.0, 102000000.0]}"
            ),
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
