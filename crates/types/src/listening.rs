//! The lines a process prints on stdout once a listener is up, one constant each: the processes
//! that print them and the tools and tests that wait for them (through `launch`) share these,
//! so a reworded line cannot leave a waiter waiting for a line that never comes.

/// The OpenAI API: `listening on http://ADDR` (or `https://ADDR`).
pub const API: &str = "listening on ";

/// The OpenAI API over plain HTTP: `listening on http://ADDR`.
pub const API_HTTP: &str = "listening on http://";

/// A metrics listener: `metrics listening on http://ADDR`.
pub const METRICS: &str = "metrics listening on http://";

/// A gateway's cluster port, where workers dial: `cluster listening on ADDR`.
pub const CLUSTER: &str = "cluster listening on ";

/// A decode worker's KV port, where prefill workers send KV: `NAME: KV listening on ADDR`.
pub const KV: &str = "KV listening on ";
