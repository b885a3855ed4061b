//! Sets two cfgs, so that every `#[cfg]` in the crate names one condition:
//!
//! - `percpu_ref_loom`: the crate is built for loom models. A dependent
//!   sets it for this crate alone (`RUSTFLAGS="--cfg percpu_ref_loom"`);
//!   the ecosystem's bare `--cfg loom` sets it too, so that a model of code
//!   that uses this crate never runs it on std's primitives unseen by loom.
//! - `percpu_ref_rseq`: the rseq backend is built: Linux on x86_64 or
//!   little-endian aarch64 with 64-bit pointers, except under loom (which models it) and Miri (which
//!   cannot run inline assembly or the rseq/membarrier system calls).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(percpu_ref_rseq)");
    println!("cargo::rustc-check-cfg=cfg(percpu_ref_loom)");
    println!("cargo::rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let has = |name: &str| std::env::var_os(name).is_some();
    // Set by RUSTFLAGS itself, or by cargo from a bare `--cfg loom`.
    let loom = has("CARGO_CFG_LOOM") || has("CARGO_CFG_PERCPU_REF_LOOM");
    if has("CARGO_CFG_LOOM") {
        println!("cargo::rustc-cfg=percpu_ref_loom");
    }
    // x86_64 and aarch64 (little-endian: the section reads the bound as
    // the mode word's first 32 bits) with 64-bit pointers only: x32
    // (`gnux32`) and ILP32 have the same architecture names, but the mode
    // word's flags live above a 32-bit CPU bound, which needs a 64-bit
    // `usize`.
    let arch = var("CARGO_CFG_TARGET_ARCH");
    if var("CARGO_CFG_TARGET_OS") == "linux"
        && (arch == "x86_64" || arch == "aarch64")
        && var("CARGO_CFG_TARGET_ENDIAN") == "little"
        && var("CARGO_CFG_TARGET_POINTER_WIDTH") == "64"
        && !loom
        && !has("CARGO_CFG_MIRI")
    {
        println!("cargo::rustc-cfg=percpu_ref_rseq");
    }
}
