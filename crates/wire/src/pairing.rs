//! What two nodes must agree on before any KV crosses between them (invariant 2): model
//! digest, page size, KV dtype and layout. Exchanged inside the encrypted link right after the
//! key exchange, so it can be neither read nor forged on the network.

use kv::{KvDtype, KvLayout};
pub use types::Role;

use crate::ct::ct_eq32;

/// Model shape of the KV cache, as compared at pairing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayoutShape {
    pub n_layers: u32,
    pub n_kv_heads: u32,
    pub head_dim: u32,
}

/// What two nodes must agree on before any KV crosses between them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PairingInfo {
    /// BLAKE3 (or other 32-byte digest) of the model file.
    pub model_digest: [u8; 32],
    pub page_size: u32,
    pub kv_dtype: KvDtype,
    pub layout: LayoutShape,
}

/// The first difference found between our pairing info and a peer's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PairingMismatch {
    #[error("model digests differ")]
    ModelDigest,
    #[error("page size differs: ours {ours}, theirs {theirs}")]
    PageSize { ours: u32, theirs: u32 },
    #[error("KV dtype differs: ours {ours:?}, theirs {theirs:?}")]
    KvDtype { ours: KvDtype, theirs: KvDtype },
    #[error("layout differs: ours {ours:?}, theirs {theirs:?}")]
    Layout { ours: LayoutShape, theirs: LayoutShape },
}

/// Why a node refuses a peer (sent in [`crate::HandshakeMsg::Refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefusalCode {
    /// The key exchange failed: another cluster secret (or none).
    BadProof = 1,
    Version = 2,
    ModelDigest = 3,
    PageSize = 4,
    KvDtype = 5,
    Layout = 6,
    /// The peer claimed our own role (a reflected handshake, or a misconfigured node).
    Reflection = 7,
    /// Too many handshakes in progress on this listener; try again.
    Busy = 8,
    /// The listener takes no links from the peer's role (a KV port takes only prefill
    /// workers, a gateway only workers).
    Role = 9,
    /// The peer's node key is not in our allow-list (`cluster.trusted_nodes`): it was never
    /// pinned, or it was revoked.
    Untrusted = 10,
}

impl RefusalCode {
    /// What the refusal means, for the refused side's error message.
    pub fn reason(&self) -> &'static str {
        match self {
            RefusalCode::BadProof => "it does not accept our cluster secret (BadProof)",
            RefusalCode::Version => "it speaks another wire version (Version)",
            RefusalCode::ModelDigest => "it serves another model file (ModelDigest)",
            RefusalCode::PageSize => "it uses another KV page size (PageSize)",
            RefusalCode::KvDtype => "it uses another KV dtype (KvDtype)",
            RefusalCode::Layout => "it has another KV layout (Layout)",
            RefusalCode::Reflection => "it has our own role (Reflection)",
            RefusalCode::Busy => "too many handshakes in progress, try again (Busy)",
            RefusalCode::Role => "it takes no links from our role (Role)",
            RefusalCode::Untrusted => "it does not trust our node key (Untrusted): pin it in its cluster.trusted_nodes",
        }
    }

    pub(crate) fn from_u8(v: u8) -> Option<Self> {
        use RefusalCode::*;
        [BadProof, Version, ModelDigest, PageSize, KvDtype, Layout, Reflection, Busy, Role, Untrusted]
            .into_iter()
            .find(|c| *c as u8 == v)
    }
}

impl PairingMismatch {
    /// The code to send the peer.
    pub fn code(&self) -> RefusalCode {
        match self {
            PairingMismatch::ModelDigest => RefusalCode::ModelDigest,
            PairingMismatch::PageSize { .. } => RefusalCode::PageSize,
            PairingMismatch::KvDtype { .. } => RefusalCode::KvDtype,
            PairingMismatch::Layout { .. } => RefusalCode::Layout,
        }
    }
}

impl PairingInfo {
    /// Pairing info of a model digest and a KV layout; `None` when a dimension does not fit
    /// the wire's u32.
    pub fn new(model_digest: [u8; 32], layout: &KvLayout) -> Option<Self> {
        let f = |v: usize| u32::try_from(v).ok();
        Some(PairingInfo {
            model_digest,
            page_size: f(layout.page_size)?,
            kv_dtype: layout.dtype,
            layout: LayoutShape {
                n_layers: f(layout.n_layers)?,
                n_kv_heads: f(layout.n_kv_heads)?,
                head_dim: f(layout.head_dim)?,
            },
        })
    }

    /// Ok when `theirs` equals ours; else the mismatch, in the order model, page size, dtype,
    /// layout.
    pub fn check(&self, theirs: &PairingInfo) -> Result<(), PairingMismatch> {
        if !ct_eq32(&self.model_digest, &theirs.model_digest) {
            return Err(PairingMismatch::ModelDigest);
        }
        if self.page_size != theirs.page_size {
            return Err(PairingMismatch::PageSize { ours: self.page_size, theirs: theirs.page_size });
        }
        if self.kv_dtype != theirs.kv_dtype {
            return Err(PairingMismatch::KvDtype { ours: self.kv_dtype, theirs: theirs.kv_dtype });
        }
        if self.layout != theirs.layout {
            return Err(PairingMismatch::Layout { ours: self.layout, theirs: theirs.layout });
        }
        Ok(())
    }
}

pub(crate) fn dtype_code(d: KvDtype) -> u8 {
    match d {
        KvDtype::F16 => 1,
        KvDtype::F32 => 2,
    }
}

pub(crate) fn dtype_of(code: u8) -> Option<KvDtype> {
    match code {
        1 => Some(KvDtype::F16),
        2 => Some(KvDtype::F32),
        _ => None,
    }
}

pub(crate) fn put_pairing(v: &mut Vec<u8>, info: &PairingInfo) {
    v.extend_from_slice(&info.model_digest);
    v.extend_from_slice(&info.page_size.to_le_bytes());
    v.push(dtype_code(info.kv_dtype));
    for x in [info.layout.n_layers, info.layout.n_kv_heads, info.layout.head_dim] {
        v.extend_from_slice(&x.to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn info() -> PairingInfo {
        let layout = KvLayout { n_layers: 30, n_kv_heads: 3, head_dim: 64, page_size: 16, dtype: KvDtype::F16 };
        PairingInfo::new([5; 32], &layout).unwrap_or_else(|| panic!("fits"))
    }

    #[test]
    fn pairing_refuses_naming_each_mismatch() {
        let mut cases = Vec::new();
        let mut t = info();
        t.model_digest[0] ^= 1;
        cases.push((t, PairingMismatch::ModelDigest));
        let mut t = info();
        t.page_size = 32;
        cases.push((t, PairingMismatch::PageSize { ours: 16, theirs: 32 }));
        let mut t = info();
        t.kv_dtype = KvDtype::F32;
        cases.push((t, PairingMismatch::KvDtype { ours: KvDtype::F16, theirs: KvDtype::F32 }));
        let mut t = info();
        t.layout.n_kv_heads = 4;
        cases.push((t, PairingMismatch::Layout { ours: info().layout, theirs: t.layout }));
        assert_eq!(info().check(&info()), Ok(()));
        for (theirs, want) in cases {
            assert_eq!(info().check(&theirs), Err(want));
            assert_eq!(RefusalCode::from_u8(want.code() as u8), Some(want.code()));
        }
    }
}
