//! Runs the README's examples as doctests.
#![doc = include_str!("../README.md")]
