//! A cluster's and its nodes' stored records opened into the typed values the domain works
//! with: the cache of opened cluster trust ([`issuers`]) and the loader ([`load`]) that turns
//! rows into what rendering takes. Below issuance, renewal, rotation and membership, which all
//! open trust through it; above `db/`, `trust` and `pki`, which it reads.

pub mod issuers;
pub mod load;

pub use issuers::IssuerCache;
pub use load::LoadError;
