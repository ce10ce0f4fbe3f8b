//! Arbitrary bytes as the plaintext of a control record, as a peer holding the cluster secret
//! could send them (the record layer authenticates the sender, not what it says). Decoding
//! returns a message or a typed error; a decoded message goes through what a worker and the
//! gateway do with it first (the worker's own request and deadline, its output format decoded
//! and compiled as a worker does, failures as request errors; token events decode as themselves;
//! the route read out of bytes that decode as no message);
//! nothing panics, and every message re-encodes to bytes
//! that decode to the same message.
#![no_main]
use std::sync::OnceLock;

use cluster::proto::{ToGateway, ToWorker};
use grammar::Grammars;
use libfuzzer_sys::fuzz_target;

#[path = "shared/vocab.rs"]
mod vocab;

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| Grammars::new(&vocab::tokenizer().0).expect("the fuzz vocabulary indexes"))
}

/// A route's deadline travels as the milliseconds left when it is sent, so a message re-sent
/// later names less time: only whether it has one must survive a round trip.
fn mask_deadline(v: &mut serde_json::Value) {
    for path in ["/Reserve/request/deadline_ms", "/Prefill/spec/request/deadline_ms"] {
        if let Some(d) = v.pointer_mut(path) {
            *d = serde_json::Value::Bool(!d.is_null());
        }
    }
}

fn round_trips<T: serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug>(m: &T) {
    let once = serde_json::to_vec(m).expect("a decoded message encodes");
    let back: T = match serde_json::from_slice(&once) {
        Ok(back) => back,
        // A number past f32's range decodes as infinity, which JSON cannot carry back (serde
        // writes null): such a message cannot be re-sent, which is all right; anything else is not.
        Err(_) if format!("{m:?}").contains("inf") => return,
        Err(e) => panic!("what we encode does not decode: {e}"),
    };
    // Both sides read back from text: `to_value` would widen an f32 to its exact f64, which the
    // text's shortest form does not equal.
    let again = serde_json::to_vec(&back).expect("encodes");
    let mut once: serde_json::Value = serde_json::from_slice(&once).expect("what we encode is JSON");
    let mut again: serde_json::Value = serde_json::from_slice(&again).expect("what we encode is JSON");
    mask_deadline(&mut once);
    mask_deadline(&mut again);
    assert_eq!(again, once, "a message changed on a round trip");
}

fuzz_target!(|data: &[u8]| {
    // What a node reads of a message that does not decode: the route it names, or nothing.
    let _ = cluster::proto::route_of(data);
    if let Ok(m) = serde_json::from_slice::<ToWorker>(data) {
        match &m {
            ToWorker::Reserve(spec) | ToWorker::Prefill { spec, .. } => {
                let req = spec.to_request();
                assert_eq!(req.prompt, spec.request.prompt);
                // The output format as a worker takes it: decoded within its bounds, then compiled.
                if let Some(f) = &spec.request.output {
                    let _ = f.decode().and_then(|f| grammars().compile(&f));
                }
                let _ = spec.deadline();
            }
            ToWorker::Cancel { .. } | ToWorker::Tenants(_) => {}
        }
        round_trips(&m);
    }
    if let Ok(m) = serde_json::from_slice::<ToGateway>(data) {
        let _ = m.route();
        match &m {
            ToGateway::Failed { failure, .. } => {
                let _ = failure.to_string();
            }
            _ => {}
        }
        round_trips(&m);
    }
});
