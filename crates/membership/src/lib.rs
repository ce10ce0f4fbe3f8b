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
//! Members seal their records ([`seal`]: a MAC under a key derived from the cluster secret,
//! bound to the etcd key and the time, refreshed at every renewal), and readers count only
//! entries that open: whoever can write to etcd without a member's key can delete entries but
//! not add, move or replay one that counts. Trust between nodes still comes from the
//! authenticated handshake of every link. Plain HTTP to etcd (https:// endpoints are refused:
//! TLS to etcd is not supported yet) exposes the records, which hold no secret.
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
pub mod seal;
mod transport;
mod watch;

pub use client::{EtcdClient, LeaseId};
pub use error::{Cause, MembershipError};
pub use members::{watch_members, Members};
pub use publish::{publish, publish_sealed, Publication};
pub use records::{
    gateways_prefix, tenants_prefix, workers_prefix, GatewayRecord, TenantsRecord, WorkerRecord, TENANTS_CHANGED,
};
pub use watch::{Event, Watch};
