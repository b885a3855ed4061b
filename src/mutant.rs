//! Mutants: deliberately broken variants of one protocol step each, built
//! only with `--cfg percpu_ref_mutant="NAME"` (`scripts/loom-mutants`, the
//! VM runner's mutant cell), so that every loom model and stress test is
//! shown to fail on the bug it is there to catch. Every mutant has an entry
//! in `scripts/mutants.toml`, the one list of them, which says what catches
//! it (`scripts/loom-mutants --check` fails on a name here without one).
//!
//! A mutant is written where the step is, with a comment that starts
//! `// mutant NAME:` and says what the mutant breaks, through one of two
//! macros so that the function reads as its logic:
//!
//! - `mutant!("NAME", real, mutated)`: the expression `real`, or `mutated`
//!   in that mutant's build;
//! - `mutated!("NAME")`: whether this is that mutant's build (for a step
//!   that the mutant moves or drops).
//!
//! Both arms are compiled in every build (only one runs), so a mutant
//! cannot rot unnoticed. An ordering in a mutated arm is `Relaxed` (the
//! ordering audit, which weakens every other one, has nothing to weaken
//! there) or is kept out with `#[cfg(percpu_ref_mutant = "NAME")]`.

/// `real`, or `mutated` in the build of the mutant `$name`.
macro_rules! mutant {
    ($name:literal, $real:expr, $mutated:expr $(,)?) => {
        if cfg!(percpu_ref_mutant = $name) {
            $mutated
        } else {
            $real
        }
    };
}

/// Whether this is the build of the mutant `$name`.
macro_rules! mutated {
    ($name:literal) => {
        cfg!(percpu_ref_mutant = $name)
    };
}
