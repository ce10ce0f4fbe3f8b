//! How a failed forward pass ends its request: the kinds themselves are the request contract's
//! ([`protocol::RequestError`]), shared with the gateway and the wire.

use protocol::RequestError;

use crate::ViolationKind;

/// Classifies a failed forward pass: KV ownership and written-slot checks are isolation
/// violations, anything else is internal.
pub(crate) fn model_failure(e: &model::ModelError) -> RequestError {
    use kv::KvError;
    match e {
        model::ModelError::Kv(KvError::StaleGeneration { .. }) => {
            RequestError::IsolationViolation { kind: ViolationKind::GenerationMismatch }
        }
        model::ModelError::Kv(KvError::WrongOwner { .. }) => {
            RequestError::IsolationViolation { kind: ViolationKind::OwnerMismatch }
        }
        model::ModelError::Kv(KvError::Unwritten { .. }) => {
            RequestError::IsolationViolation { kind: ViolationKind::UnwrittenRead }
        }
        other => RequestError::Internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kv::{KvError, Owner, RequestId, TenantId};
    use model::ModelError;

    #[test]
    fn ownership_and_written_slot_failures_are_isolation_violations() {
        let o = |t| Owner { tenant: TenantId(t), request: RequestId(t) };
        let cases = [
            (KvError::StaleGeneration { page: 3, expected: 1, found: 2 }, ViolationKind::GenerationMismatch),
            (KvError::WrongOwner { page: 3, expected: o(1), found: o(2) }, ViolationKind::OwnerMismatch),
            (KvError::Unwritten { layer: 0, pos: 5 }, ViolationKind::UnwrittenRead),
        ];
        for (e, kind) in cases {
            assert_eq!(model_failure(&ModelError::Kv(e)), RequestError::IsolationViolation { kind });
        }
        let other = ModelError::Input("x".into());
        assert!(matches!(model_failure(&other), RequestError::Internal(_)));
    }
}
