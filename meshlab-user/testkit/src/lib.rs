//! What meshlab's tests and benchmarks share and the product must not carry: synthetic
//! two-node traffic ([`synth`]) and the rule for tests that need root ([`privileged`]).
//! A dev-dependency of meshlab-user only; `publish = false`.

pub mod privileged;
pub mod synth;
