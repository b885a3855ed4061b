//! `PERCPU_REF_BACKEND` and `PERCPU_REF_INDEX`: a value that is not
//! honoured says so, once, on stderr (a typo such as `rsqe` is not
//! silently ignored).
//!
//! The backend is chosen once per process, so each case re-runs this test
//! binary as a subprocess with the variable set (as `tests/rseq_stress.rs`
//! does for `GLIBC_TUNABLES`); the child asks for the backend from several
//! threads at once and prints it, and the parent checks the child's stdout
//! and stderr.

use percpu_ref::{backend, Backend};
use std::process::Command;

/// Set in the subprocesses.
const CHILD: &str = "PERCPU_REF_BACKEND_ENV_CHILD";

/// Child only: asks for the backend from 8 threads at once (the first
/// detection races), then prints it.
#[test]
fn child_reports_backend() {
    if std::env::var_os(CHILD).is_none() {
        return; // only meaningful in the subprocesses of the tests below
    }
    let barrier = std::sync::Barrier::new(8);
    let seen: Vec<Backend> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    backend()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(seen.iter().all(|&b| b == seen[0]), "one backend: {seen:?}");
    println!("chosen backend: {}", backend());
    println!(
        "chosen index: {}",
        percpu_ref::percpu::index().map_or("none", |i| i.name())
    );
}

struct Child {
    backend: String,
    /// The lines of stderr that mention the variable.
    warnings: Vec<String>,
    /// The rseq backend's index, and the lines that mention its variable.
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    index: String,
    #[cfg_attr(not(target_os = "linux"), allow(dead_code))]
    index_warnings: Vec<String>,
}

/// Runs `child_reports_backend` with `PERCPU_REF_BACKEND` set to `value`
/// (removed if `None`) and the extra environment `env`.
fn run_child(value: Option<&str>, env: &[(&str, &str)]) -> Child {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args([
        "--exact",
        "child_reports_backend",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(CHILD, "1");
    match value {
        Some(v) => cmd.env("PERCPU_REF_BACKEND", v),
        None => cmd.env_remove("PERCPU_REF_BACKEND"),
    };
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "child with PERCPU_REF_BACKEND={value:?} {env:?} failed:\n{stdout}{stderr}"
    );
    // The word after `chosen <what>: ` on the child's stdout.
    let chosen = |what: &str| -> String {
        stdout
            .split(&format!("chosen {what}: "))
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("the child prints its {what}"))
            .to_string()
    };
    let lines = |var: &str| -> Vec<String> {
        stderr
            .lines()
            .filter(|l| l.contains(var))
            .map(str::to_string)
            .collect()
    };

    Child {
        backend: chosen("backend"),
        warnings: lines("PERCPU_REF_BACKEND"),
        index: chosen("index"),
        index_warnings: lines("PERCPU_REF_INDEX"),
    }
}

/// The backend a process gets when the variable is not set.
fn default_backend() -> &'static str {
    if Backend::Rseq.is_available() {
        "rseq"
    } else {
        "sharded"
    }
}

#[test]
fn unknown_value_warns_once_and_uses_the_default() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    for typo in ["rsqe", "RSEQ", "shared", " rseq"] {
        let child = run_child(Some(typo), &[]);
        assert_eq!(child.backend, default_backend(), "for {typo:?}");
        assert_eq!(
            child.warnings.len(),
            1,
            "one warning line for {typo:?}: {:?}",
            child.warnings
        );
        let w = &child.warnings[0];
        for part in [
            format!("{typo:?}"),
            "`rseq`".to_string(),
            "`sharded`".to_string(),
            default_backend().to_string(),
        ] {
            assert!(w.contains(&part), "warning {w:?} does not name {part:?}");
        }
        eprintln!("PERCPU_REF_BACKEND={typo:?}: {w}");
    }
}

#[test]
fn valid_or_empty_values_do_not_warn() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    let mut cases = vec![
        (None, default_backend()),
        (Some(""), default_backend()),
        (Some("sharded"), "sharded"),
    ];
    if Backend::Rseq.is_available() {
        cases.push((Some("rseq"), "rseq"));
    }
    for (value, expected) in cases {
        let child = run_child(value, &[]);
        assert_eq!(child.backend, expected, "for {value:?}");
        assert!(
            child.warnings.is_empty(),
            "no warning for {value:?}: {:?}",
            child.warnings
        );
    }
}

#[test]
fn rseq_asked_for_but_unavailable_warns_once() {
    if std::env::var_os(CHILD).is_some() {
        return;
    }
    // Where rseq is available, disable glibc's registration in the child.
    let env: &[(&str, &str)] = if Backend::Rseq.is_available() {
        &[("GLIBC_TUNABLES", "glibc.pthread.rseq=0")]
    } else {
        &[]
    };
    let child = run_child(Some("rseq"), env);
    assert_eq!(child.backend, "sharded");
    assert_eq!(
        child.warnings.len(),
        1,
        "one warning line: {:?}",
        child.warnings
    );
    let w = &child.warnings[0];
    assert!(
        w.contains("PERCPU_REF_BACKEND=rseq") && w.contains("not available"),
        "{w:?}"
    );
    eprintln!("PERCPU_REF_BACKEND=rseq, rseq unavailable: {w}");
}

/// The index of the rseq backend (`PERCPU_REF_INDEX`), in a child with the
/// variable set: its index, and its stderr lines that name the variable.
#[cfg(target_os = "linux")]
fn run_index_child(value: &str) -> (String, Vec<String>) {
    let c = run_child(None, &[("PERCPU_REF_INDEX", value)]);
    (c.index, c.index_warnings)
}

/// `cpu_id` is honoured silently; a typo warns once, naming the variable,
/// the value and the valid values, and keeps the default; `mm_cid` where
/// the kernel lacks it warns once and uses `cpu_id`.
#[cfg(target_os = "linux")]
#[test]
fn index_values_are_honoured_or_warned_about() {
    if std::env::var_os(CHILD).is_some() || !Backend::Rseq.is_available() {
        return;
    }
    let default = run_index_child("").0;
    assert!(
        default == "mm_cid" || default == "cpu_id",
        "default index {default}"
    );
    assert_eq!(run_index_child("cpu_id"), ("cpu_id".to_string(), vec![]));
    let (index, warnings) = run_index_child("mmcid");
    assert_eq!(index, default, "a typo keeps the default");
    assert_eq!(warnings.len(), 1, "one warning: {warnings:?}");
    assert!(
        warnings[0].contains("\"mmcid\"") && warnings[0].contains("`cpu_id` and `mm_cid`"),
        "the warning names the value and the valid ones: {}",
        warnings[0]
    );
    let (index, warnings) = run_index_child("mm_cid");
    if default == "mm_cid" {
        assert_eq!((index.as_str(), warnings.len()), ("mm_cid", 0));
    } else {
        assert_eq!(index, "cpu_id");
        assert!(warnings.len() == 1 && warnings[0].contains("does not provide mm_cid"));
    }
    eprintln!(
        "PERCPU_REF_INDEX: default {default}; a typo warns: {}",
        run_index_child("x").1[0]
    );
}
