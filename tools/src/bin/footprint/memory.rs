//! Memory rows: RSS and the crate's own accounting per ref, measured in
//! a child process per row.

use crate::affinity;
use crate::throughput::ratio;
use crate::FALLBACK_MEMORY_LIMIT;
use percpu_ref::percpu::arena_stats;
use percpu_ref::{Backend, InitFlags, PercpuRef};
use serde_json::{json, Value};
use std::hint::black_box;
use std::mem::MaybeUninit;
use std::process::{Command, Stdio};

/// One memory row, as the child measured it. RSS readings are in bytes,
/// `None` where there is no `/proc/self/statm`.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MemRow {
    pub(crate) backend: Backend,
    pub(crate) refs: usize,
    /// RSS before the first batch (the `Vec` already in it), after creating
    /// it, after dropping it, and after creating the second batch.
    pub(crate) rss_base: Option<u64>,
    pub(crate) rss_created: Option<u64>,
    pub(crate) rss_dropped: Option<u64>,
    pub(crate) rss_recreated: Option<u64>,
    /// `percpu_bytes()` summed over the first batch.
    pub(crate) percpu_bytes: usize,
    /// Growth of the arena's reserved bytes and chunks over the first batch,
    /// and of its reserved bytes over the second.
    /// Signed: an arena that returns chunks could shrink.
    pub(crate) arena_bytes: i64,
    pub(crate) arena_chunks: i64,
    pub(crate) arena_bytes_again: i64,
}

/// `<backend>:<refs>`, as the parent passes it to the child.
pub(crate) fn child_spec(spec: &str) -> Result<(Backend, usize), String> {
    let (b, n) = spec
        .split_once(':')
        .ok_or_else(|| format!("expected BACKEND:REFS, got {spec:?}"))?;
    let n = n.parse().map_err(|e| format!("refs {n:?}: {e}"))?;
    Ok((backend_named(b)?, n))
}

pub(crate) fn backend_named(name: &str) -> Result<Backend, String> {
    [Backend::Rseq, Backend::Sharded]
        .into_iter()
        .find(|b| b.name() == name)
        .ok_or_else(|| format!("unknown backend {name:?}"))
}

/// Measures one row in this process. Run it in a fresh process (see
/// `measure_in_child`); in-process it is only right for the first row.
pub(crate) fn measure_memory(backend: Backend, refs: usize) -> Result<MemRow, String> {
    // Lazy one-time setup (backend detection, the rseq registration) is not
    // a per-ref cost: done before the first reading.
    if !backend.is_available() {
        return Err(format!("backend {backend} is not available here"));
    }
    let _ = percpu_ref::possible_cpus();
    let mut v: Vec<PercpuRef> = Vec::with_capacity(refs);
    // Write the whole storage so its pages are resident before the first
    // reading: RSS growth is then what the refs allocate, not their `Vec`.
    for slot in v.spare_capacity_mut() {
        *slot = MaybeUninit::zeroed();
    }
    // The stores must happen even though the pushes overwrite them.
    black_box(v.spare_capacity_mut().as_mut_ptr());
    let new = || PercpuRef::with_backend(|_| {}, InitFlags::empty(), backend);
    // The first use from each CPU's thread has one-time costs that are not
    // per ref either (that thread's stack, its malloc arena, its rseq
    // registration; glibc caches the stacks, so the threads below reuse
    // them): pay them on one ref before the first reading.
    touch_on_every_cpu(&[new().map_err(|e| e.to_string())?]);
    let arena0 = arena_stats();
    let rss_base = rss_bytes();
    for _ in 0..refs {
        v.push(new().map_err(|e| e.to_string())?);
    }
    // A ref in use is counted on by every CPU that runs its users: do one
    // get + put on each ref from each CPU this process may run on, so that
    // the counters' memory is resident as in use, not only reserved (the
    // arena maps chunks lazily, and a never-used CPU's page stays
    // unbacked).
    touch_on_every_cpu(&v);
    let rss_created = rss_bytes();
    let arena1 = arena_stats();
    let percpu_bytes = v.iter().map(PercpuRef::percpu_bytes).sum();
    v.clear(); // drops the refs, keeps the storage
    let rss_dropped = rss_bytes();
    let arena2 = arena_stats();
    for _ in 0..refs {
        v.push(new().map_err(|e| e.to_string())?);
    }
    let rss_recreated = rss_bytes();
    let arena3 = arena_stats();
    drop(v);
    Ok(MemRow {
        backend,
        refs,
        rss_base,
        rss_created,
        rss_dropped,
        rss_recreated,
        percpu_bytes,
        arena_bytes: delta(arena0.reserved_bytes, arena1.reserved_bytes),
        arena_chunks: delta(arena0.chunks, arena1.chunks),
        arena_bytes_again: delta(arena2.reserved_bytes, arena3.reserved_bytes),
    })
}

/// One get + put on every ref from each CPU this process may run on, the
/// thread pinned to it (where pinning is supported; elsewhere from this
/// thread only).
pub(crate) fn touch_on_every_cpu(refs: &[PercpuRef]) {
    let cpus = affinity::allowed_cpus();
    std::thread::scope(|s| {
        for &cpu in &cpus {
            s.spawn(move || {
                let _ = affinity::pin_to(cpu);
                for r in refs {
                    r.get();
                    r.put();
                }
            });
        }
    });
}

pub(crate) fn delta(before: usize, after: usize) -> i64 {
    after as i64 - before as i64
}

/// The row with the median RSS growth of several processes' (rows without
/// an RSS reading sort last). One process can see a few pages of unrelated
/// growth (the allocator, a stack), which at 10^5 refs is 0.1 B per ref.
pub(crate) fn median_row(rows: &mut [MemRow]) -> MemRow {
    rows.sort_by(|a, b| {
        let key = |m: &MemRow| m.rss_per_ref().unwrap_or(f64::INFINITY);
        key(a).total_cmp(&key(b))
    });
    rows[(rows.len() - 1) / 2].clone()
}

/// Runs `measure_memory` in a new process, this program re-executed.
/// Memory that one row freed stays in the allocator's free lists (and the
/// arena never returns its chunks), so a second row measured in the
/// same process would reuse it and show too little growth; a new process
/// starts every row from the same empty heap.
pub(crate) fn measure_in_child(backend: Backend, refs: usize) -> Result<MemRow, String> {
    let spec = format!("{}:{refs}", backend.name());
    child_json(&["--child", &spec], None, Stdio::inherit(), &spec)
        .and_then(|v| MemRow::from_json(&v))
}

/// Runs this program again with `args` (and `PERCPU_REF_INDEX` or
/// `PERCPU_REF_ARENA_THP` as `env` says) and parses the one JSON document
/// it prints; `what` names the child in errors.
pub(crate) fn child_json(
    args: &[&str],
    env: Option<(&str, &str)>,
    stderr: Stdio,
    what: &str,
) -> Result<Value, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program: {e}"))?;
    let mut cmd = Command::new(&exe);
    cmd.args(args).stderr(stderr);
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if !out.status.success() {
        return Err(format!(
            "the child measuring {what} failed ({})",
            out.status
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    serde_json::from_str(text.trim()).map_err(|e| format!("the child's output {text:?}: {e}"))
}

impl MemRow {
    pub(crate) fn to_json(&self) -> Value {
        json!({
            "backend": self.backend.name(),
            "refs": self.refs,
            "rss_base": self.rss_base,
            "rss_created": self.rss_created,
            "rss_dropped": self.rss_dropped,
            "rss_recreated": self.rss_recreated,
            "percpu_bytes": self.percpu_bytes,
            "arena_bytes": self.arena_bytes,
            "arena_chunks": self.arena_chunks,
            "arena_bytes_again": self.arena_bytes_again,
        })
    }

    pub(crate) fn from_json(v: &Value) -> Result<Self, String> {
        let num = |k: &str| {
            v[k].as_u64()
                .ok_or_else(|| format!("field {k:?} missing or not a number"))
        };
        let rss = |k: &str| match &v[k] {
            Value::Null => Ok(None),
            x => x.as_u64().map(Some).ok_or_else(|| format!("field {k:?}")),
        };
        let size = |k: &str| num(k).map(|n| n as usize);
        let signed = |k: &str| {
            v[k].as_i64()
                .ok_or_else(|| format!("field {k:?} missing or not a number"))
        };
        Ok(MemRow {
            backend: backend_named(v["backend"].as_str().unwrap_or_default())?,
            refs: size("refs")?,
            rss_base: rss("rss_base")?,
            rss_created: rss("rss_created")?,
            rss_dropped: rss("rss_dropped")?,
            rss_recreated: rss("rss_recreated")?,
            percpu_bytes: size("percpu_bytes")?,
            arena_bytes: signed("arena_bytes")?,
            arena_chunks: signed("arena_chunks")?,
            arena_bytes_again: signed("arena_bytes_again")?,
        })
    }

    /// RSS growth over the first batch, in bytes (may be negative by noise).
    pub(crate) fn growth(&self) -> Option<f64> {
        Some(self.rss_created? as f64 - self.rss_base? as f64)
    }

    /// RSS growth per ref, outside the ref's object.
    pub(crate) fn rss_per_ref(&self) -> Option<f64> {
        Some(self.growth()? / self.refs as f64)
    }

    /// RSS growth per ref plus the object: what the RSS target bounds.
    pub(crate) fn total_per_ref(&self) -> Option<f64> {
        Some(self.rss_per_ref()? + OBJECT as f64)
    }

    pub(crate) fn percpu_per_ref(&self) -> f64 {
        self.percpu_bytes as f64 / self.refs as f64
    }

    /// Share of the first batch's growth still resident after its drop.
    pub(crate) fn kept_after_drop(&self) -> Option<f64> {
        ratio(
            self.rss_dropped? as f64 - self.rss_base? as f64,
            self.growth()?,
        )
    }

    /// The second batch's growth as a share of the first's, the
    /// reuse check: near 0 when freed memory is reused, near 1 when it was
    /// returned to the system (or leaked).
    pub(crate) fn reuse_growth(&self) -> Option<f64> {
        ratio(
            self.rss_recreated? as f64 - self.rss_dropped? as f64,
            self.growth()?,
        )
    }

    /// The second batch's peak above the first's, as a share of the first
    /// batch's growth: near 0 unless memory leaked, whether it was reused
    /// or returned and taken again. Tells a leak from a return.
    pub(crate) fn peak_above_first(&self) -> Option<f64> {
        ratio(
            self.rss_recreated? as f64 - self.rss_created? as f64,
            self.growth()?,
        )
    }
}

/// `size_of::<PercpuRef>()`, the object that the `Vec` holds.
pub(crate) const OBJECT: usize = std::mem::size_of::<PercpuRef>();

/// The resident-pages field of `/proc/self/statm` (the second).
pub(crate) fn parse_statm_resident(statm: &str) -> Option<u64> {
    statm.split_whitespace().nth(1)?.parse().ok()
}

/// Resident pages that no file backs: the second field of
/// `/proc/self/statm` minus the third (file-backed and shared pages).
pub(crate) fn parse_statm_anon(statm: &str) -> Option<u64> {
    let mut f = statm.split_whitespace().skip(1);
    let resident: u64 = f.next()?.parse().ok()?;
    let shared: u64 = f.next()?.parse().ok()?;
    resident.checked_sub(shared)
}

/// `MemAvailable` of `/proc/meminfo`, in bytes.
pub(crate) fn parse_meminfo_available(meminfo: &str) -> Option<u64> {
    let line = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// This process's resident memory in bytes; `None` but on Linux.
pub(crate) fn rss_bytes() -> Option<u64> {
    let pages = parse_statm_resident(&std::fs::read_to_string("/proc/self/statm").ok()?)?;
    Some(pages * page_size()?)
}

/// Anonymous resident memory, in bytes: [`rss_bytes`] without the pages of
/// the program's and libraries' code that the measured loop faults in the
/// first time it runs (tens of KiB: 13 B per ref over 5,000 refs, more
/// than the counters of one id).
pub(crate) fn anon_rss_bytes() -> Option<u64> {
    let pages = parse_statm_anon(&std::fs::read_to_string("/proc/self/statm").ok()?)?;
    Some(pages * page_size()?)
}

#[cfg(target_os = "linux")]
pub(crate) fn page_size() -> Option<u64> {
    // SAFETY: sysconf reads a configuration value; no pointer is involved.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p).ok().filter(|&p| p > 0)
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn page_size() -> Option<u64> {
    None
}

/// Memory a row may need at worst: the `Vec`, and two batches in case the
/// second reuses nothing. `per_ref` is one ref's `percpu_bytes()`; 64 bytes
/// more cover its allocation's overhead and the arena's partial chunk.
pub(crate) fn worst_case_bytes(refs: usize, per_ref: usize) -> u64 {
    refs as u64 * (OBJECT as u64 + 2 * (per_ref as u64 + 64))
}

/// Refuses a row that may not fit: more than half the available memory
/// (`limit` is that half), so the machine is not pushed into swap or the
/// OOM killer in the middle of a run.
pub(crate) fn check_fits(
    backend: Backend,
    refs: usize,
    per_ref: usize,
    limit: u64,
) -> Result<(), String> {
    let need = worst_case_bytes(refs, per_ref);
    if need > limit {
        return Err(format!(
            "--refs {refs} on the {backend} backend may need {} MiB ({} B per ref of counters, \
             {OBJECT} B object, two batches), more than the {} MiB allowed (half the available \
             memory); pass a smaller --refs",
            need >> 20,
            per_ref,
            limit >> 20
        ));
    }
    Ok(())
}

pub(crate) fn memory_limit() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| parse_meminfo_available(&m))
        .map_or(FALLBACK_MEMORY_LIMIT, |a| a / 2)
}
