//! The seven scenarios of `stormguard simulate`.
//!
//! Each module holds a config struct (with `Default` giving the documented set-up and a
//! `validate` that names the refused flag), a report of rows that serialise to the stable
//! JSON schema, and a `run` function.

pub mod budget;
pub mod chain;
pub mod converge;
pub mod occ;
pub mod overload;
pub mod storm;
pub mod whatif;
