//! Cluster membership in etcd: gateways and workers publish a record about themselves under a
//! prefix, and each watches the prefix of the others.
//!
//! Why etcd: it is a consistent store with leases. A member's key lives under a lease the
//! member renews ([`publish`]); a process that dies or is cut off stops renewing and etcd
//! deletes its key within the TTL, so leaving needs no goodbye. Watches push each change, and a
//! range plus a watch from the next revision misses nothing ([`watch_members`]).
//!
//! Why the JSON gateway: every etcd v3 serves it on its client port, and the six calls used
//! here (lease grant / keep-alive / revoke, put, range, watch) are small JSON POSTs over
//! HTTP/1.1 with hyper, already in the tree; a gRPC client would bring protobuf code
//! generation and an HTTP/2 stack for the same six calls. int64 fields arrive as JSON
//! strings, keys and values as base64 (read leniently: see `json`).
//!
//! What is published is never a secret: addresses, role, model digest, sizes (`GatewayRecord`, `WorkerRecord`).
//! Trust between nodes comes only from the authenticated handshake of every link, so a rogue
//! or stale entry can at worst make a node dial an address that then fails that handshake.
//! That is also why plain HTTP to etcd is tolerable for now (https:// endpoints are refused:
//! TLS to etcd is not supported yet): etcd should still sit on a trusted network, since
//! whoever can write to it can make members dial elsewhere.
//!
//! Every call has a deadline; failures are [`MembershipError`]s naming the endpoints.
#![forbid(unsafe_code)]

mod backoff;
mod client;
mod error;
mod json;
mod members;
mod publish;
mod records;
mod transport;
mod watch;

pub use client::{EtcdClient, LeaseId};
pub use error::{Cause, MembershipError};
pub use members::{watch_members, Members};
pub use publish::{publish, Publication};
pub use records::{
    gateways_prefix, tenants_prefix, workers_prefix, GatewayRecord, TenantsRecord, WorkerRecord, TENANTS_CHANGED,
};
pub use watch::{Event, Watch};
