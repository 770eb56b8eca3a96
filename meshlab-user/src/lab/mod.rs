//! Placeholder: being built (see the issue for `meshlab lab`).

pub mod cli;
