//! Tombstones and cluster reset: a removed or broken member backs its data up and rejoins; a lost quorum is
//! recovered from the member's data or a snapshot. Data is moved, never deleted.

pub mod datadir;
pub mod reset;
