//! Sets `cfg(percpu_ref_rseq)` where the rseq backend is built: Linux on
//! x86_64 with 64-bit pointers, except under loom (which models it) and
//! Miri (which cannot run inline assembly or the rseq/membarrier system
//! calls). One name for the condition keeps every `#[cfg]` on the backend
//! short and in agreement.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(percpu_ref_rseq)");
    println!("cargo::rerun-if-changed=build.rs");
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let has = |name: &str| std::env::var_os(name).is_some();
    // x86_64 with 64-bit pointers only: x32 (`gnux32`) has the same
    // architecture name, but the mode word's flags live above a 32-bit CPU
    // bound, which needs a 64-bit `usize`.
    if var("CARGO_CFG_TARGET_OS") == "linux"
        && var("CARGO_CFG_TARGET_ARCH") == "x86_64"
        && var("CARGO_CFG_TARGET_POINTER_WIDTH") == "64"
        && !has("CARGO_CFG_LOOM")
        && !has("CARGO_CFG_MIRI")
    {
        println!("cargo::rustc-cfg=percpu_ref_rseq");
    }
}
