//! hostlet controllers.
