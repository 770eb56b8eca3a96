//! Placeholder: being built (see the issue for `meshlab merge`).

pub mod cli;
