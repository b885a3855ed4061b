//! What the loom suites share: the bounded model runner and one test per
//! backend for a model.
#![allow(dead_code, unused_macros, unused_imports)] // each suite uses a subset

use percpu_ref::Backend;

/// Runs `f` in every interleaving within the preemption bound (default
/// `preemptions`, or `LOOM_MAX_PREEMPTIONS` when set), and prints how many
/// executions that was (seen with `--nocapture`: a model that explores
/// one execution checks one interleaving only; see docs/reliability.md,
/// "How it is checked").
pub fn check(preemptions: usize, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(preemptions);
    }
    let runs = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = runs.clone();
    builder.check(move || {
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        f()
    });
    eprintln!(
        "{} executions",
        runs.load(std::sync::atomic::Ordering::Relaxed)
    );
}

/// The backend a generated test is named after.
pub fn backend_named(name: &str) -> Backend {
    match name {
        "sharded" => Backend::Sharded,
        "rseq_model" => Backend::Rseq,
        _ => unreachable!("{name}"),
    }
}

/// One test per backend for a model `fn MODEL(Backend)` of the invoking
/// suite: `MODEL::sharded` and `MODEL::rseq_model`.
macro_rules! models {
    ($($model:ident: preemptions $bound:literal, backends [$($b:ident),+];)*) => {$(
        mod $model {
            $(
                #[test]
                #[allow(non_snake_case)]
                fn $b() {
                    $crate::common::check($bound, || {
                        super::$model($crate::common::backend_named(stringify!($b)))
                    });
                }
            )+
        }
    )*};
}
pub(crate) use models;
