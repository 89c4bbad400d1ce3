//! Kubernetes upgrades. So far: what this API can install ([`versions`]) and the skew policy
//! every upgrade is checked against before it starts ([`skew`]).

pub mod skew;
pub mod versions;
