/// The tensor element encodings this project can read. Others are refused by name at load time
/// rather than misread.
/// Variants carry ggml's names (`Q4_K`, not `Q4K`), as files and tools spell them.
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgmlType {
    F32,
    F16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q4_K,
    Q5_K,
    Q6_K,
    BF16,
}

/// Every type ggml defines, by id, so that a refused tensor is named in words.
const GGML_TYPE_NAMES: &[(u32, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (6, "Q5_0"),
    (7, "Q5_1"),
    (8, "Q8_0"),
    (9, "Q8_1"),
    (10, "Q2_K"),
    (11, "Q3_K"),
    (12, "Q4_K"),
    (13, "Q5_K"),
    (14, "Q6_K"),
    (15, "Q8_K"),
    (16, "IQ2_XXS"),
    (17, "IQ2_XS"),
    (18, "IQ3_XXS"),
    (19, "IQ1_S"),
    (20, "IQ4_NL"),
    (21, "IQ3_S"),
    (22, "IQ2_S"),
    (23, "IQ4_XS"),
    (24, "I8"),
    (25, "I16"),
    (26, "I32"),
    (27, "I64"),
    (28, "F64"),
    (29, "IQ1_M"),
    (30, "BF16"),
    (34, "TQ1_0"),
    (35, "TQ2_0"),
    (39, "MXFP4"),
];

/// The name ggml gives type `id`, or "unknown" for an id it does not define.
pub fn ggml_type_name(id: u32) -> &'static str {
    GGML_TYPE_NAMES.iter().find(|(i, _)| *i == id).map_or("unknown", |(_, n)| n)
}

impl GgmlType {
    /// Every supported type: the float types, then the quantized ones in ggml id order (the order
    /// messages list them in).
    pub const ALL: [GgmlType; 11] = [
        Self::F32,
        Self::F16,
        Self::BF16,
        Self::Q4_0,
        Self::Q4_1,
        Self::Q5_0,
        Self::Q5_1,
        Self::Q8_0,
        Self::Q4_K,
        Self::Q5_K,
        Self::Q6_K,
    ];

    pub fn from_id(id: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.id() == id)
    }

    pub fn id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q5_0 => 6,
            Self::Q5_1 => 7,
            Self::Q8_0 => 8,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::BF16 => 30,
        }
    }

    /// Elements per block and bytes per block.
    pub fn block(self) -> (usize, usize) {
        match self {
            Self::F32 => (1, 4),
            Self::F16 | Self::BF16 => (1, 2),
            Self::Q4_0 => (32, 18),
            Self::Q4_1 => (32, 20),
            Self::Q5_0 => (32, 22),
            Self::Q5_1 => (32, 24),
            Self::Q8_0 => (32, 34),
            Self::Q4_K => (256, 144),
            Self::Q5_K => (256, 176),
            Self::Q6_K => (256, 210),
        }
    }

    /// Bytes for `n` elements, or None when `n` is not a whole number of blocks or overflows.
    pub fn bytes_for(self, n: u64) -> Option<u64> {
        let (be, bb) = self.block();
        if !n.is_multiple_of(be as u64) {
            return None;
        }
        (n / be as u64).checked_mul(bb as u64)
    }

    pub fn name(self) -> &'static str {
        ggml_type_name(self.id())
    }

    /// The supported type names, comma separated (for messages).
    pub fn supported_names() -> String {
        Self::ALL.map(Self::name).join(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_names_and_block_sizes_follow_ggml() {
        let want = [
            (GgmlType::Q5_0, 6, "Q5_0", (32, 22)),
            (GgmlType::Q5_1, 7, "Q5_1", (32, 24)),
            (GgmlType::Q4_K, 12, "Q4_K", (256, 144)),
            (GgmlType::Q5_K, 13, "Q5_K", (256, 176)),
            (GgmlType::Q6_K, 14, "Q6_K", (256, 210)),
            (GgmlType::BF16, 30, "BF16", (1, 2)),
        ];
        for (t, id, name, block) in want {
            assert_eq!((t.id(), t.name(), t.block()), (id, name, block));
        }
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(10), None);
        assert_eq!(ggml_type_name(10), "Q2_K");
        assert_eq!(ggml_type_name(39), "MXFP4");
        assert_eq!(ggml_type_name(4), "unknown");
    }
}
