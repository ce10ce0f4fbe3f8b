//! Constant-time comparison of secrets and digests, so that a peer learns nothing from how long
//! a refusal took.

use subtle::ConstantTimeEq;

/// Constant-time equality of two 32-byte values.
pub fn ct_eq32(a: &[u8; 32], b: &[u8; 32]) -> bool {
    bool::from(a[..].ct_eq(&b[..]))
}
