//! JSON output for tools.
//!
//! ```json
//! {"machine": "...", "cpu_model": "...", "kernel": "...", "cpus": [0, 1],
//!  "default_backend": "sharded", "duration_ms": 800, "reps": 3,
//!  "unit": "loops per second, summed over threads",
//!  "threads": [1, 2], "sizes": [0, 32],
//!  "kinds": ["atomic", "percpu/sharded", "floor"],
//!  "cells": [{"kind": "atomic", "threads": 1, "size": 0, "median": 1.0,
//!             "min": 1.0, "max": 1.0, "spread_pct": 0.0, "min_cpu_share": 0.998,
//!             "samples": [1.0], "ns_per_loop": 1.0,
//!             "overhead_ns": 0.5, "overhead_ns_lo": 0.4, "overhead_ns_hi": 0.6}],
//!  "explanation": "On 1 CPU the copy itself ..."}
//! ```
//!
//! `ns_per_loop` is `1e9 x threads / median`; `overhead_ns` is that minus
//! the floor's in the same cell, as measured (it can be negative), with the
//! range the runs give in `_lo` / `_hi`; all three are null for the floor.
//! `explanation` is absent when there is no paragraph to give. Keys come out
//! in alphabetical order (serde_json's map without `preserve_order`).

use crate::results::{Overhead, Results};
use serde_json::{json, Value};

/// `x` rounded to `d` decimals, or null where it is not finite (JSON has no
/// NaN or infinity). Loop counts carry one decimal and ns values three: the
/// runs do not support more, and full doubles would only add noise digits.
fn rounded(x: f64, d: i32) -> Value {
    let scale = 10f64.powi(d);
    // Dividing the rounded integer gives the double nearest the d-decimal
    // value, which serde_json prints with at most d decimals.
    json!((x * scale).round() / scale)
}

/// The whole matrix as one JSON object.
pub fn value(r: &Results) -> Value {
    let m = &r.meta;
    let cells: Vec<Value> = r
        .cells
        .iter()
        .map(|c| {
            let o = r.overhead(c.kind, c.threads, c.size);
            let ons = |f: fn(&Overhead) -> f64| rounded(o.as_ref().map_or(f64::NAN, f), 3);
            json!({
                "kind": c.kind.name(),
                "threads": c.threads,
                "size": c.size,
                "median": rounded(c.median(), 1),
                "min": rounded(c.min(), 1),
                "max": rounded(c.max(), 1),
                "spread_pct": rounded(c.spread_pct(), 1),
                "min_cpu_share": rounded(c.min_cpu_share(), 3),
                "samples": c.samples.iter().map(|&x| rounded(x, 1)).collect::<Vec<_>>(),
                "ns_per_loop": rounded(c.ns_per_loop(), 3),
                "overhead_ns": ons(|o| o.ns),
                "overhead_ns_lo": ons(|o| o.lo),
                "overhead_ns_hi": ons(|o| o.hi),
            })
        })
        .collect();
    let mut out = json!({
        "machine": m.machine(),
        "cpu_model": m.cpu_model,
        "kernel": m.kernel,
        "cpus": m.allowed_cpus,
        "default_backend": m.default_backend,
        // u64, not u128: serde_json refuses u128 without arbitrary_precision.
        "duration_ms": u64::try_from(m.duration.as_millis()).unwrap_or(u64::MAX),
        "reps": m.reps,
        "unit": "loops per second, summed over threads",
        "threads": r.threads,
        "sizes": r.sizes,
        "kinds": r.kinds.iter().map(|k| k.name()).collect::<Vec<_>>(),
        "cells": cells,
    });
    if let Some(p) = crate::explain::paragraph(r) {
        out["explanation"] = p.into();
    }
    out
}

/// `value` as pretty-printed text, ending in a newline.
pub fn render(r: &Results) -> String {
    let mut s = serde_json::to_string_pretty(&value(r)).expect("a Value always serializes");
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::harness::Kind;
    use crate::results::tests::sample_results;

    fn keys(v: &Value) -> Vec<&str> {
        let mut k: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        k.sort_unstable();
        k
    }

    #[test]
    fn the_object_has_every_key_with_its_type() {
        let r = sample_results();
        let v: Value = serde_json::from_str(&render(&r)).expect("valid JSON");
        assert_eq!(v, value(&r), "the text is the value");
        let mut want = vec![
            "machine",
            "cpu_model",
            "kernel",
            "cpus",
            "default_backend",
            "duration_ms",
            "reps",
            "unit",
            "threads",
            "sizes",
            "kinds",
            "cells",
            "explanation",
        ];
        want.sort_unstable();
        assert_eq!(keys(&v), want);
        assert_eq!(v["cpu_model"], "Test \"CPU\"");
        assert_eq!(v["machine"], "Test \"CPU\", 2 CPUs, Linux 6.0");
        assert_eq!(v["cpus"], json!([0, 1]));
        assert_eq!(v["duration_ms"], 50);
        assert!(v["duration_ms"].is_u64() && v["reps"].is_u64());
        assert_eq!(v["threads"], json!([1, 2]));
        assert_eq!(v["sizes"], json!([0, 512]));
        assert_eq!(v["kinds"], json!(["atomic", "percpu/sharded", "floor"]));
        assert!(v["explanation"]
            .as_str()
            .unwrap()
            .starts_with("On 1 CPU the copy itself"));
        assert_eq!(v["cells"].as_array().unwrap().len(), r.cells.len());
    }

    #[test]
    fn cells_round_and_give_null_where_there_is_no_number() {
        let r = sample_results();
        let v = value(&r);
        let cells = v["cells"].as_array().unwrap();
        assert_eq!(
            cells[0],
            json!({"kind": "atomic", "threads": 1, "size": 0, "median": 100000000.0,
                   "min": 99000000.0, "max": 102000000.0, "spread_pct": 3.0,
                   "min_cpu_share": 0.99, "samples": [99000000.0, 100000000.0, 102000000.0],
                   "ns_per_loop": 10.0, "overhead_ns": 9.0, "overhead_ns_lo": 8.794,
                   "overhead_ns_hi": 9.121})
        );
        // Integers stay integers, measurements stay floats even when whole.
        assert!(cells[0]["threads"].is_u64() && cells[0]["median"].is_f64());
        // The floor has a cost but no overhead.
        let floor = cells.iter().find(|c| c["kind"] == "floor").unwrap();
        assert_eq!(floor["ns_per_loop"], 1.0);
        for k in ["overhead_ns", "overhead_ns_lo", "overhead_ns_hi"] {
            assert!(floor[k].is_null(), "{k}: {floor}");
        }
        // Rounded in the text too, not only in the value.
        let text = render(&r);
        assert!(text.contains("\"overhead_ns_lo\": 8.794,"), "{text}");
        assert!(text.contains("\"min_cpu_share\": 0.99,"), "{text}");
        assert_eq!(rounded(f64::NAN, 1), Value::Null);
        assert_eq!(rounded(f64::INFINITY, 3), Value::Null);
        assert_eq!(rounded(-1.23456, 3), json!(-1.235));
    }

    #[test]
    fn an_unmeasured_cell_is_null_not_free() {
        let mut r = sample_results();
        r.cell_mut(Kind::Atomic, 1, 0).unwrap().samples.clear();
        let v = value(&r);
        let c = &v["cells"][0];
        assert_eq!(c["samples"], json!([]));
        assert!(
            c["ns_per_loop"].is_null() && c["overhead_ns"].is_null(),
            "{c}"
        );
        assert!(serde_json::from_str::<Value>(&render(&r)).is_ok());
    }
}
