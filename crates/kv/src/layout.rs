//! Shape of the KV cache: element type, page geometry and pool configuration.

use crate::KvError;

/// Element type stored in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvDtype {
    /// IEEE half precision, stored as `half::f16`.
    #[default]
    F16,
    /// IEEE single precision.
    F32,
}

impl KvDtype {
    /// Size of one element in bytes.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }
}

/// Geometry of the KV cache. Two nodes may exchange KV only when their layouts are equal.
///
/// Inside a page, for each layer: a K block `[page_size][row_len]` then a V block
/// `[page_size][row_len]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    pub n_layers: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Token slots per page.
    pub page_size: usize,
    pub dtype: KvDtype,
}

impl KvLayout {
    /// Elements of K (or of V) for one token at one layer: `n_kv_heads * head_dim`.
    pub fn row_len(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Elements in one page (all layers, K and V).
    pub fn page_elems(&self) -> usize {
        self.n_layers * 2 * self.page_size * self.row_len()
    }

    /// Bytes in one page (all layers, K and V).
    pub fn page_bytes(&self) -> usize {
        self.page_elems() * self.dtype.bytes()
    }

    /// Bytes of K and V for one token across all layers.
    pub fn bytes_per_token(&self) -> usize {
        self.n_layers * 2 * self.row_len() * self.dtype.bytes()
    }

    /// Whole pages needed to hold `tokens` slots. A layout with `page_size == 0` is invalid
    /// (see [`KvLayout::validate`]); for it this returns `tokens` rather than dividing by zero.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size.max(1))
    }

    /// Checks that every dimension is non-zero and that page sizes do not overflow.
    pub fn validate(&self) -> Result<(), KvError> {
        let nonzero = [
            ("n_layers", self.n_layers),
            ("n_kv_heads", self.n_kv_heads),
            ("head_dim", self.head_dim),
            ("page_size", self.page_size),
        ];
        for (field, value) in nonzero {
            if value == 0 {
                return Err(KvError::InvalidConfig { field, detail: "must be at least 1, got 0".into() });
            }
        }
        let bytes = self
            .n_kv_heads
            .checked_mul(self.head_dim)
            .and_then(|r| r.checked_mul(self.page_size))
            .and_then(|r| r.checked_mul(self.n_layers))
            .and_then(|r| r.checked_mul(2 * self.dtype.bytes()));
        if bytes.is_none() {
            return Err(KvError::InvalidConfig {
                field: "layout",
                detail: format!(
                    "page size overflows: {} layers x {} kv heads x {} head dim x {} slots",
                    self.n_layers, self.n_kv_heads, self.head_dim, self.page_size
                ),
            });
        }
        Ok(())
    }
}

/// How big the pool is. Both forms round *down* to whole pages, so the pool never exceeds
/// the configured budget; [`crate::KvPool::capacity_tokens`] reports the real capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capacity {
    Tokens(usize),
    Bytes(usize),
}

/// When freed pages are zeroed. Either way, no reservation ever sees a previous owner's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ScrubPolicy {
    /// Zero a page when its lease is dropped (free pages are always zero).
    #[default]
    OnFree,
    /// Zero a page when it is reserved, before the lease is handed out.
    OnAlloc,
}

/// Everything needed to build a [`crate::KvPool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolConfig {
    pub layout: KvLayout,
    pub capacity: Capacity,
    pub scrub: ScrubPolicy,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout() -> KvLayout {
        KvLayout { n_layers: 30, n_kv_heads: 3, head_dim: 64, page_size: 16, dtype: KvDtype::F16 }
    }

    #[test]
    fn layout_sizes_follow_the_page_format() {
        let l = layout();
        assert_eq!(l.row_len(), 192);
        assert_eq!(l.page_elems(), 30 * 2 * 16 * 192);
        assert_eq!(l.page_bytes(), 30 * 2 * 16 * 192 * 2);
        assert_eq!(l.bytes_per_token(), 30 * 2 * 192 * 2);
        assert_eq!(l.bytes_per_token() * l.page_size, l.page_bytes());
        assert_eq!(l.pages_for(0), 0);
        assert_eq!(l.pages_for(1), 1);
        assert_eq!(l.pages_for(16), 1);
        assert_eq!(l.pages_for(17), 2);
    }

    #[test]
    fn dtype_defaults_to_f16_and_knows_its_size() {
        assert_eq!(KvDtype::default(), KvDtype::F16);
        assert_eq!(KvDtype::F16.bytes(), 2);
        assert_eq!(KvDtype::F32.bytes(), 4);
        assert_eq!(ScrubPolicy::default(), ScrubPolicy::OnFree);
    }

    #[test]
    fn zero_dimensions_are_rejected_by_name() {
        for field in ["n_layers", "n_kv_heads", "head_dim", "page_size"] {
            let mut l = layout();
            match field {
                "n_layers" => l.n_layers = 0,
                "n_kv_heads" => l.n_kv_heads = 0,
                "head_dim" => l.head_dim = 0,
                _ => l.page_size = 0,
            }
            match l.validate() {
                Err(KvError::InvalidConfig { field: f, .. }) => assert_eq!(f, field),
                other => panic!("{field}: expected InvalidConfig, got {other:?}"),
            }
        }
        assert_eq!(layout().validate(), Ok(()));
    }

    #[test]
    fn overflowing_layout_is_rejected() {
        let mut l = layout();
        l.head_dim = usize::MAX / 2;
        assert!(matches!(l.validate(), Err(KvError::InvalidConfig { field: "layout", .. })));
    }
}
