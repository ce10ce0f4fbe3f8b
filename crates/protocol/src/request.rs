//! The route request: a validated request as plain data, the same from the gateway's validator
//! to the worker that builds its engine's request from it.

use std::time::{Duration, Instant};

use grammar::EncodedFormat;
use sampling::{SamplingParams, StopTokens};
use serde::{Deserialize, Serialize};
use types::{RequestId, TenantId};

/// A route's time limit when the request has no deadline of its own.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(600);

/// One request (one choice of a client's request) as the gateway's validator built it.
///
/// On the wire every field is read again as the worker's own: sampling parameters are
/// validated when they are deserialized, the deadline travels as the time left (clocks of two
/// machines are never compared), and the output format stays an opaque bounded string that
/// each worker decodes and compiles for itself, so whatever a tenant's schema holds, the
/// message stays shallow and a format that does not decode fails that route alone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RouteRequest {
    pub id: RequestId,
    pub tenant: TenantId,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Generation ends (finish reason `stop`) when one of these is sampled; it is not emitted.
    pub stop_tokens: StopTokens,
    /// The request fails with `DeadlineExceeded` (pages freed) if it is still running then.
    #[serde(with = "time_left", rename = "deadline_ms")]
    pub deadline: Option<Instant>,
    /// A client's salt narrowing prefix-cache sharing within the tenant (never widening it:
    /// every cache scope is derived from `tenant` first).
    #[serde(default)]
    pub cache_salt: Option<String>,
    /// The shape the output must have (`response_format`, tools), encoded once by the
    /// validator after it compiled it (so a bad schema is the client's 400, never a worker's).
    #[serde(default)]
    pub output: Option<EncodedFormat>,
}

impl RouteRequest {
    /// When the request must be over (a generous bound when it has no deadline of its own).
    pub fn deadline_or_default(&self) -> Instant {
        self.deadline.unwrap_or_else(|| Instant::now() + DEFAULT_DEADLINE)
    }
}

/// `ms` from now. A peer may send any `u64`; past what `Instant` can hold (centuries), the
/// deadline is a year away, which no route outlives, instead of an overflow panic.
pub fn after_ms(ms: u64) -> Instant {
    let now = Instant::now();
    now.checked_add(Duration::from_millis(ms)).unwrap_or_else(|| now + FAR_DEADLINE)
}

const FAR_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

/// A deadline on the wire: the milliseconds left when it was sent.
mod time_left {
    use super::*;
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(d: &Option<Instant>, s: S) -> Result<S::Ok, S::Error> {
        let ms = d.map(|d| u64::try_from(d.saturating_duration_since(Instant::now()).as_millis()).unwrap_or(u64::MAX));
        ms.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Instant>, D::Error> {
        Ok(Option::<u64>::deserialize(d)?.map(after_ms))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn request(deadline: Option<Instant>) -> RouteRequest {
        RouteRequest {
            id: RequestId(2),
            tenant: TenantId(3),
            prompt: vec![1, 2, 3],
            max_tokens: 4,
            sampling: SamplingParams::greedy(),
            stop_tokens: StopTokens::new([7, 5]),
            deadline,
            cache_salt: Some("s".into()),
            output: None,
        }
    }

    #[test]
    fn a_deadline_travels_as_the_time_left() {
        let r = request(Some(Instant::now() + Duration::from_millis(1500)));
        let back: RouteRequest = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        let left = back.deadline.unwrap().saturating_duration_since(Instant::now());
        assert!(left <= Duration::from_millis(1500) && left > Duration::from_millis(1000), "{left:?}");
        let none = request(None).deadline_or_default().saturating_duration_since(Instant::now());
        assert!(none > DEFAULT_DEADLINE - Duration::from_secs(5));
    }

    #[test]
    fn a_deadline_past_what_an_instant_holds_is_far_away_instead_of_a_panic() {
        let mut v = serde_json::to_value(request(None)).unwrap();
        v["deadline_ms"] = serde_json::json!(u64::MAX);
        let back: RouteRequest = serde_json::from_value(v).unwrap();
        assert!(back.deadline.unwrap() > Instant::now() + Duration::from_secs(300 * 24 * 3600));
    }

    #[test]
    fn every_field_comes_back_and_sampling_is_validated_again_on_the_way_in() {
        let mut r = request(None);
        r.sampling = SamplingParams::greedy().with_seed(Some(9));
        let back: RouteRequest = serde_json::from_slice(&serde_json::to_vec(&r).unwrap()).unwrap();
        assert_eq!((back.id, back.tenant, &back.prompt, back.max_tokens), (r.id, r.tenant, &r.prompt, r.max_tokens));
        assert_eq!((&back.sampling, &back.stop_tokens, &back.cache_salt), (&r.sampling, &r.stop_tokens, &r.cache_salt));
        let mut v = serde_json::to_value(&r).unwrap();
        v["sampling"]["temperature"] = serde_json::json!(-1.0);
        let err = serde_json::from_value::<RouteRequest>(v).unwrap_err().to_string();
        assert!(err.contains("temperature"), "{err}");
    }
}
