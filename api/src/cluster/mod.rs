//! A cluster's own durable facts, typed: its stored [`Spec`].

pub mod spec;

pub use spec::{Spec, SpecError};
