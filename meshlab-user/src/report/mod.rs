//! Placeholder: being built (see the issue for `meshlab report`).

pub mod cli;
