use crate::memory::{
    check_fits, child_spec, measure_memory, parse_meminfo_available, parse_statm_anon,
    parse_statm_resident, MemRow, OBJECT,
};
use crate::report::{callgrind_counts, run};
use crate::throughput::{
    at_least, at_most, counter_target, median, ratio, rss_target, verdict, Stats,
};
use crate::{parse, REUSE_TARGET, SCALING_TARGET};
use percpu_ref::Backend;
use serde_json::{json, Value};
use std::time::Duration;

#[test]
fn callgrind_output_is_read_by_loop_name() {
    let text = "variant         instr/iter\nrseq                22.00\n\
                rseq-churn         136.01\narc-churn 177.00\nnot a row\n";
    assert_eq!(
        callgrind_counts(text),
        vec![
            ("rseq".to_string(), 22.0),
            ("rseq-churn".to_string(), 136.01),
            ("arc-churn".to_string(), 177.0),
        ]
    );
}

#[test]
fn statm_resident_is_the_second_field() {
    assert_eq!(
        parse_statm_resident("5043 1234 567 1 0 300 0\n"),
        Some(1234)
    );
    assert_eq!(parse_statm_resident("5043"), None);
    assert_eq!(
        parse_statm_anon("5043 1234 567 1 0 300 0\n"),
        Some(1234 - 567)
    );
    assert_eq!(parse_statm_anon("5043 1234"), None);
    assert_eq!(parse_statm_resident(""), None);
    assert_eq!(parse_statm_resident("5043 x 1"), None);
}

#[test]
fn meminfo_available_in_bytes() {
    let m = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n";
    assert_eq!(parse_meminfo_available(m), Some(2048 * 1024));
    assert_eq!(parse_meminfo_available("MemTotal: 1 kB\n"), None);
    assert_eq!(parse_meminfo_available("MemAvailable: lots\n"), None);
}

#[cfg(target_os = "linux")]
#[test]
fn rss_reads_on_linux() {
    assert!(crate::memory::rss_bytes().is_some_and(|b| b > 0));
}

#[test]
fn median_and_stats() {
    assert_eq!(median(&[]), None);
    assert_eq!(median(&[3.0]), Some(3.0));
    assert_eq!(median(&[5.0, 1.0, 3.0]), Some(3.0));
    assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
    let s = Stats::of(&[2.0, 9.0, 4.0]).unwrap();
    assert_eq!((s.median, s.min, s.max), (4.0, 2.0, 9.0));
}

#[test]
fn ratios_and_targets() {
    assert_eq!(ratio(3.0, 2.0), Some(1.5));
    assert_eq!(ratio(1.0, 0.0), None);
    assert_eq!(ratio(1.0, -1.0), None);
    assert_eq!(ratio(f64::NAN, 1.0), None);
    assert_eq!(at_most(Some(16.0), 16.0), Some(true));
    assert_eq!(at_most(Some(16.5), 16.0), Some(false));
    assert_eq!(at_least(Some(1.8), SCALING_TARGET), Some(true));
    assert_eq!(at_least(Some(1.79), SCALING_TARGET), Some(false));
    assert_eq!(at_least(None, 1.0), None);
    assert_eq!(verdict(None), "n/a");
    assert_eq!(counter_target(2), 16);
    // The counters plus the 128-byte `PercpuRef` itself.
    assert_eq!(rss_target(2), 16 + OBJECT);
    assert_eq!(rss_target(192), 1536 + OBJECT);
}

fn row(base: u64, created: u64, dropped: u64, recreated: u64) -> MemRow {
    MemRow {
        backend: Backend::Sharded,
        refs: 1000,
        rss_base: Some(base),
        rss_created: Some(created),
        rss_dropped: Some(dropped),
        rss_recreated: Some(recreated),
        percpu_bytes: 256_000,
        arena_bytes: 0,
        arena_chunks: 0,
        arena_bytes_again: 0,
    }
}

#[test]
fn memory_row_derivations() {
    let r = row(1_000_000, 1_096_000, 1_096_000, 1_100_000);
    assert_eq!(r.rss_per_ref(), Some(96.0));
    assert_eq!(r.total_per_ref(), Some(96.0 + OBJECT as f64));
    assert_eq!(r.percpu_per_ref(), 256.0);
    assert_eq!(r.kept_after_drop(), Some(1.0));
    let reuse = r.reuse_growth().unwrap();
    assert!((reuse - 4.0 / 96.0).abs() < 1e-12);
    assert_eq!(at_most(r.reuse_growth(), REUSE_TARGET), Some(true));
    // Memory given back on drop and taken again: not reused.
    let r = row(1_000_000, 1_096_000, 1_000_000, 1_096_000);
    assert_eq!(r.kept_after_drop(), Some(0.0));
    assert_eq!(at_most(r.reuse_growth(), REUSE_TARGET), Some(false));
    assert_eq!(r.peak_above_first(), Some(0.0));
    // A leak: the second batch comes on top of the first.
    let r = row(1_000_000, 1_096_000, 1_096_000, 1_192_000);
    assert_eq!(
        (r.reuse_growth(), r.peak_above_first()),
        (Some(1.0), Some(1.0))
    );
    // No growth at all (tiny N within a page): no share to compute.
    assert_eq!(row(5, 5, 5, 5).reuse_growth(), None);
    let mut r = row(1, 2, 3, 4);
    r.rss_base = None;
    assert_eq!((r.rss_per_ref(), r.reuse_growth()), (None, None));
}

#[test]
fn memory_row_json_round_trip() {
    let mut r = row(1, 2, 3, 4);
    r.backend = Backend::Rseq;
    r.arena_chunks = 7;
    assert_eq!(MemRow::from_json(&r.to_json()), Ok(r.clone()));
    r.rss_created = None; // no statm: null, still parsed
    assert_eq!(MemRow::from_json(&r.to_json()), Ok(r));
    assert!(MemRow::from_json(&json!({"backend": "rseq"})).is_err());
    assert!(MemRow::from_json(&json!({"backend": "nope"})).is_err());
}

#[test]
fn child_specs() {
    assert_eq!(child_spec("sharded:100"), Ok((Backend::Sharded, 100)));
    assert_eq!(child_spec("rseq:7"), Ok((Backend::Rseq, 7)));
    assert!(child_spec("rseq").is_err());
    assert!(child_spec("rseq:x").is_err());
    assert!(child_spec("other:1").is_err());
}

#[test]
fn options() {
    let o = parse(["footprint"]).unwrap();
    assert_eq!(o.refs, vec![100_000, 1_000_000]);
    assert_eq!(
        (o.duration, o.reps, o.json),
        (Duration::from_millis(500), 3, false)
    );
    assert!(o.threads >= 1);
    let o = parse(["footprint", "--refs", "10,20", "--threads", "3", "--json"]).unwrap();
    assert_eq!((o.refs, o.threads, o.json), (vec![10, 20], 3, true));
    assert!(parse(["footprint", "--refs", "0"]).is_err());
    assert!(parse(["footprint", "--reps", "0"]).is_err());
    assert!(parse(["footprint", "--refs", "1000000000"]).is_err());
    assert!(parse(["footprint", "--counts-only"]).unwrap().counts_only);
}

#[test]
fn counts_only_measures_memory_and_no_throughput() {
    let opts = parse([
        "footprint",
        "--refs",
        "2000",
        "--reps",
        "1",
        "--counts-only",
    ])
    .unwrap();
    let report = run(&opts, &mut measure_memory, &mut |_| {}).unwrap();
    assert!(report.throughput.is_empty());
    let out = report.counts();
    assert!(out.contains("vm-counts: possible_cpus="), "{out}");
    assert!(out.contains("| 2000 |"), "{out}");
}

#[test]
fn huge_configurations_are_refused() {
    let gib = 1u64 << 30;
    // 10^6 refs at 520 B fit in 23 GiB / 2; 10^6 at 32 KiB (192 CPUs) do not.
    assert!(check_fits(Backend::Sharded, 1_000_000, 520, 11 * gib).is_ok());
    let e = check_fits(Backend::Sharded, 1_000_000, 32 << 10, 11 * gib).unwrap_err();
    assert!(e.contains("--refs 1000000") && e.contains("sharded"), "{e}");
}

/// The whole program at tiny sizes, memory rows measured in-process
/// (the test binary cannot re-execute itself as the program).
#[test]
fn end_to_end_tiny() {
    let opts = parse([
        "footprint",
        "--refs",
        "3000",
        "--duration-ms",
        "20",
        "--reps",
        "1",
        "--threads",
        "2",
    ])
    .unwrap();
    let mut lines = Vec::new();
    let report = run(&opts, &mut measure_memory, &mut |l| lines.push(l)).unwrap();
    let backends: Vec<Backend> = [Backend::Rseq, Backend::Sharded]
        .into_iter()
        .filter(|b| b.is_available())
        .collect();
    assert_eq!(report.memory.len(), backends.len());
    for m in &report.memory {
        assert_eq!(m.refs, 3000);
        assert!(m.percpu_bytes > 0);
        // The arena's accounting is exact on both backends: 8 B per
        // possible CPU, and the second batch reuses the first's slots.
        assert_eq!(
            m.percpu_per_ref(),
            counter_target(report.possible_cpus) as f64
        );
        assert_eq!(m.arena_bytes_again, 0, "the second batch reuses the slots");
    }
    assert_eq!(report.throughput.len(), backends.len() + 1);
    for t in &report.throughput {
        assert!(t.one.median > 0.0 && t.all.is_some_and(|a| a.median > 0.0));
    }
    let md = report.markdown();
    assert!(md.contains("### Memory per ref") && md.contains("| `Arc<u64>` new + clone + drop |"));
    for b in &backends {
        assert!(md.contains(&format!("| {b} | 3000 |")), "{md}");
    }
    let j: Value = serde_json::from_str(&report.to_json().to_string()).unwrap();
    assert_eq!(j["memory"].as_array().map(Vec::len), Some(backends.len()));
    assert_eq!(j["throughput"][backends.len()]["subject"], "Arc<u64>");
    assert!(lines.iter().any(|l| l.contains("throughput")));
}
