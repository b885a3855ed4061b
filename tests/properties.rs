//! Model-based property test: random sequences of every `PercpuRef`
//! operation, misuse, panicking callbacks and huge `n` included, on every
//! available backend, checked after each step against a plain model of the
//! count, the mode and the releases.
//!
//! The model tracks the count the way the ref does in one thread: in percpu
//! mode as `a` (what reached the atomic counter: the base reference and
//! `_many` calls with `n >= 2^16`) plus `s` (the per-CPU sum). That makes
//! every outcome exact, including which misuse is caught at the call (in
//! atomic mode, or a huge `n`) and which at the next switch (an underflow
//! in percpu mode). A sequence ends when the ref becomes miscounted (the
//! fold found misuse, or an atomic-mode add of `n < 2^16` saturated the
//! count): from then on it never releases, which the last step checks.

mod common;
use common::{backends, counted_with, try_panic_message};
use percpu_ref::{Backend, Error, InitFlags};
use proptest::prelude::*;
use std::borrow::Cow;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering::SeqCst;

const MAX: i128 = (1 << 62) - 1;
const LIMIT: u64 = 1 << 16;

#[derive(Clone, Debug)]
enum Op {
    Get(u64),
    Put(u64),
    TryGet(u64),
    TryGetLive,
    Kill { confirm_panics: bool },
    SwitchToAtomic { confirm_panics: bool },
    SwitchToPercpu,
    Reinit,
    Resurrect,
}

fn n() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0u64..4,
        2 => (LIMIT - 2)..=(LIMIT + 2),
        1 => (1u64 << 40)..(1u64 << 41),
        2 => (MAX as u64 - 3)..=(MAX as u64),
        2 => (MAX as u64 / 2 - 2)..=(MAX as u64 / 2 + 2),
        1 => 0..=(MAX as u64),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => n().prop_map(Op::Get),
        6 => n().prop_map(Op::Put),
        3 => n().prop_map(Op::TryGet),
        3 => Just(Op::TryGetLive),
        2 => any::<bool>().prop_map(|confirm_panics| Op::Kill { confirm_panics }),
        2 => any::<bool>().prop_map(|confirm_panics| Op::SwitchToAtomic { confirm_panics }),
        2 => Just(Op::SwitchToPercpu),
        2 => Just(Op::Reinit),
        2 => Just(Op::Resurrect),
    ]
}

fn flags() -> impl Strategy<Value = InitFlags> {
    prop_oneof![
        Just(InitFlags::empty()),
        Just(InitFlags::ALLOW_REINIT),
        Just(InitFlags::INIT_ATOMIC),
        Just(InitFlags::INIT_DEAD),
        Just(InitFlags::INIT_DEAD | InitFlags::ALLOW_REINIT),
    ]
}

/// What the model expects a call to do.
#[derive(Debug, PartialEq)]
enum Outcome {
    Done,
    Bool(bool),
    Err(Error),
    /// A panic whose message contains this (expected) or is this (got).
    Panic(Cow<'static, str>),
}

#[derive(Debug)]
struct Model {
    percpu: bool,
    dead: bool,
    forced: bool,
    allow_reinit: bool,
    /// The atomic counter's part in percpu mode; the count in atomic mode.
    a: i128,
    /// The per-CPU sum in percpu mode (0 in atomic mode).
    s: i128,
    releases: usize,
    release_panics: bool,
    /// The fold found misuse: the ref never releases any more.
    miscounted: bool,
    /// A switch's temporary reference, put after a kill's base reference.
    temp_pending: bool,
}

/// Effects a switch defers until after unlock, in the order they surface.
#[derive(Default)]
struct Deferred {
    release: bool,
    confirm_panic: bool,
    misuse: Option<&'static str>,
}

impl Model {
    fn new(flags: InitFlags, release_panics: bool) -> Model {
        let dead = flags.contains(InitFlags::INIT_DEAD);
        let atomic = dead || flags.contains(InitFlags::INIT_ATOMIC);
        Model {
            percpu: !atomic,
            dead,
            forced: flags.contains(InitFlags::INIT_ATOMIC),
            allow_reinit: atomic || flags.contains(InitFlags::ALLOW_REINIT),
            a: i128::from(!dead),
            s: 0,
            releases: 0,
            release_panics,
            miscounted: false,
            temp_pending: false,
        }
    }

    fn release(&mut self) -> Outcome {
        self.releases += 1;
        if self.release_panics {
            Outcome::Panic("release panics".into())
        } else {
            Outcome::Done
        }
    }

    /// An add that reaches the atomic counter (`tryget`: unless zero).
    fn add_atomic(&mut self, n: i128, unless_zero: bool) -> Outcome {
        if !self.percpu && self.a == 0 {
            return if unless_zero {
                Outcome::Bool(false)
            } else {
                Outcome::Panic("released".into())
            };
        }
        if self.a + n > MAX {
            // In atomic mode a small get is one unconditional add: it
            // saturates the count, which stays so (the ref is parked). A
            // large one, a tryget (a compare-and-swap), and any in percpu
            // mode, is refused unchanged.
            if !self.percpu && n < i128::from(LIMIT) && !unless_zero {
                self.miscounted = true;
                return Outcome::Panic("saturated".into());
            }
            return Outcome::Panic("left at".into());
        }
        self.a += n;
        if unless_zero {
            Outcome::Bool(true)
        } else {
            Outcome::Done
        }
    }

    fn step(&mut self, op: &Op) -> Outcome {
        match *op {
            Op::Get(n) | Op::TryGet(n) => {
                let tryget = matches!(op, Op::TryGet(_));
                let n = i128::from(n);
                if n == 0 && !tryget {
                    Outcome::Done
                } else if self.percpu && n < i128::from(LIMIT) {
                    self.s += n;
                    if tryget {
                        Outcome::Bool(true)
                    } else {
                        Outcome::Done
                    }
                } else {
                    self.add_atomic(n, tryget)
                }
            }
            Op::Put(n) => {
                let n = i128::from(n);
                if n == 0 {
                    Outcome::Done
                } else if self.percpu && n < i128::from(LIMIT) {
                    self.s -= n;
                    Outcome::Done
                } else if self.percpu {
                    // The biased counter's checked range: `a >= -2^61`.
                    if self.a - n < -(1 << 61) {
                        return Outcome::Panic("underflow".into());
                    }
                    self.a -= n;
                    Outcome::Done
                } else if self.a < n {
                    Outcome::Panic("underflow".into())
                } else {
                    self.a -= n;
                    if self.a == 0 {
                        self.release()
                    } else {
                        Outcome::Done
                    }
                }
            }
            Op::TryGetLive => {
                if self.percpu {
                    self.s += 1;
                    Outcome::Bool(true)
                } else if self.dead {
                    Outcome::Bool(false)
                } else {
                    self.add_atomic(1, true)
                }
            }
            Op::Kill { confirm_panics } => {
                if self.dead {
                    return Outcome::Err(Error::AlreadyDead {
                        op: "kill_and_confirm_sync",
                    });
                }
                self.dead = true;
                let mut d = self.switch_to_atomic_sync(confirm_panics);
                if !self.miscounted {
                    self.put_locked(&mut d);
                }
                self.finish(d)
            }
            Op::SwitchToAtomic { confirm_panics } => {
                self.forced = true;
                let d = self.switch_to_atomic_sync(confirm_panics);
                self.finish(d)
            }
            Op::SwitchToPercpu => {
                if self.percpu {
                    return Outcome::Done;
                }
                if !self.allow_reinit {
                    return Outcome::Err(Error::ReinitNotAllowed {
                        op: "switch_to_percpu",
                    });
                }
                if !self.dead {
                    if self.a == 0 {
                        return Outcome::Err(Error::Released {
                            op: "switch_to_percpu",
                        });
                    }
                    self.percpu = true;
                }
                self.forced = false;
                Outcome::Done
            }
            Op::Reinit => {
                if self.percpu {
                    return Outcome::Err(Error::NotZero {
                        op: "reinit",
                        count: None,
                    });
                }
                if self.a != 0 {
                    return Outcome::Err(Error::NotZero {
                        op: "reinit",
                        count: Some(self.a as u64),
                    });
                }
                self.revive("reinit")
            }
            Op::Resurrect => {
                if !self.dead {
                    return Outcome::Err(Error::NotDead { op: "resurrect" });
                }
                self.revive("resurrect")
            }
        }
    }

    fn switch_to_atomic_sync(&mut self, confirm_panics: bool) -> Deferred {
        let mut d = Deferred {
            confirm_panic: confirm_panics,
            ..Deferred::default()
        };
        if !self.percpu {
            return d;
        }
        self.percpu = false;
        // The fold, with the temporary reference.
        let v = self.a + self.s + 1;
        self.s = 0;
        if v <= 0 || v > 1 << 62 {
            self.miscounted = true;
            d.misuse = Some(if v <= 0 { "underflow" } else { "overflow" });
            return d;
        }
        self.a = v;
        // Confirm runs here; then a kill's base put, then the temporary's.
        self.temp_pending = true;
        d
    }

    fn put_locked(&mut self, d: &mut Deferred) {
        if self.a == 0 {
            d.misuse.get_or_insert("underflow");
        } else {
            self.a -= 1;
            if self.a == 0 {
                d.release = true;
            }
        }
    }

    fn finish(&mut self, mut d: Deferred) -> Outcome {
        if std::mem::take(&mut self.temp_pending) {
            self.put_locked(&mut d);
        }
        if d.release {
            if let p @ Outcome::Panic(_) = self.release() {
                return p;
            }
        }
        if d.confirm_panic {
            return Outcome::Panic("confirm panics".into());
        }
        match d.misuse {
            Some(m) => Outcome::Panic(m.into()),
            None => Outcome::Done,
        }
    }

    fn revive(&mut self, op: &'static str) -> Outcome {
        if !self.allow_reinit && !self.forced {
            return Outcome::Err(Error::ReinitNotAllowed { op });
        }
        if self.a + 1 > MAX {
            return Outcome::Panic("left at".into());
        }
        self.a += 1;
        self.dead = false;
        if !self.forced {
            self.percpu = true;
        }
        Outcome::Done
    }
}

fn run(backend: Backend, flags: InitFlags, release_panics: bool, ops: &[Op]) {
    let (r, releases) = counted_with(flags, backend, release_panics);
    let mut m = Model::new(flags, release_panics);
    for (i, op) in ops.iter().enumerate() {
        let expected = m.step(op);
        let mut result = None;
        let panicked = try_panic_message(|| {
            result = Some(match *op {
                Op::Get(n) => {
                    r.get_many(n as usize);
                    Outcome::Done
                }
                Op::Put(n) => {
                    r.put_many(n as usize);
                    Outcome::Done
                }
                Op::TryGet(n) => Outcome::Bool(r.tryget_many(n as usize)),
                Op::TryGetLive => Outcome::Bool(r.tryget_live()),
                Op::Kill { confirm_panics } => match r.kill_and_confirm_sync(|r| {
                    assert!(!r.tryget_live(), "tryget_live succeeded inside confirm");
                    if confirm_panics {
                        panic!("confirm panics");
                    }
                }) {
                    Ok(()) => Outcome::Done,
                    Err(e) => Outcome::Err(e),
                },
                Op::SwitchToAtomic { confirm_panics } => {
                    r.switch_to_atomic_and_confirm_sync(|_| {
                        if confirm_panics {
                            panic!("confirm panics");
                        }
                    });
                    Outcome::Done
                }
                Op::SwitchToPercpu => r
                    .switch_to_percpu()
                    .map_or_else(Outcome::Err, |()| Outcome::Done),
                Op::Reinit => r.reinit().map_or_else(Outcome::Err, |()| Outcome::Done),
                Op::Resurrect => r.resurrect().map_or_else(Outcome::Err, |()| Outcome::Done),
            })
        });
        let got = match panicked {
            Some(msg) => Outcome::Panic(msg.into()),
            None => result.expect("no panic, so a result"),
        };
        let ctx = || format!("{backend} {flags:?} step {i} {op:?}; model {m:?}");
        match (&expected, &got) {
            (Outcome::Panic(want), Outcome::Panic(msg)) => {
                assert!(
                    msg.contains(&**want),
                    "{}: panic {msg:?}, wanted {want:?}",
                    ctx()
                )
            }
            _ => assert_eq!(got, expected, "{}", ctx()),
        }
        assert_eq!(releases.load(SeqCst), m.releases, "{}: releases", ctx());
        if m.miscounted {
            // From now on nothing releases, and the ref stays atomic.
            assert!(
                matches!(
                    r.switch_to_percpu(),
                    Err(Error::Miscounted { .. }) | Err(Error::ReinitNotAllowed { .. })
                ) || m.dead
            );
            let _ = catch_unwind(AssertUnwindSafe(|| r.put_many(1 << 20)));
            assert_eq!(releases.load(SeqCst), m.releases, "{}: miscounted", ctx());
            return;
        }
        assert_eq!(r.is_percpu(), m.percpu, "{}: mode", ctx());
        assert_eq!(r.is_dying(), m.dead, "{}: dead", ctx());
        if !m.percpu {
            assert_eq!(r.atomic_count(), Some(m.a as u64), "{}: count", ctx());
            assert_eq!(r.is_zero(), m.a == 0, "{}: is_zero", ctx());
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: if cfg!(miri) { 4 } else { 2000 },
        ..ProptestConfig::default()
    })]

    #[test]
    fn every_operation_matches_the_model(
        flags in flags(),
        release_panics in prop::bool::weighted(0.2),
        ops in prop::collection::vec(op(), 1..48),
    ) {
        // Expected panics are many: keep the log readable.
        std::panic::set_hook(Box::new(|_| {}));
        for b in backends() {
            run(b, flags, release_panics, &ops);
        }
    }
}
