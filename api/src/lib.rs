//! hostlet's typed objects: everything an operator can write or read.
//!
//! Pure: no I/O and no async runtime. The pod manifest and its parsing ([`manifest`], [`parse`]), its
//! validation and the merge of a node's pods ([`validation`]), Docker naming and labels ([`naming`]), image
//! references ([`image`]), the Kubernetes v1 Pod form ([`v1`]), the etcd key layout ([`keys`]) and the JSON objects kept in etcd ([`objects`]).

pub mod authz;
pub mod configs;
pub mod dns;
pub mod expansion;
pub mod field;
pub mod image;
pub mod keys;
pub mod labels;
pub mod manifest;
pub mod naming;
pub mod objects;
pub mod parse;
pub mod podset;
pub mod routes;
pub mod security;
pub mod v1;
pub mod validation;

pub use keys::{Key, KeyLayout};
pub use manifest::PodManifest;
pub use parse::{parse_manifest, parse_manifest_list, ParseError};
pub use validation::{validate, FieldError};
