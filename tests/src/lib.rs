//! `exk8s-tests` holds the tests that need more than one crate at once: the real `exk8s-api`
//! binary, the real `exk8s-agent` binary and real etcd processes, with their shared fixtures.
