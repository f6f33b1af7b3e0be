//! hostlet runtime.
