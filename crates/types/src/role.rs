//! What a node is in a deployment.

/// A node's role. The discriminants are the role's byte in the handshake.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Role {
    Gateway = 1,
    Prefill = 2,
    Decode = 3,
}

impl Role {
    /// The role a handshake byte names, if any.
    pub fn from_u8(v: u8) -> Option<Self> {
        [Role::Gateway, Role::Prefill, Role::Decode].into_iter().find(|r| *r as u8 == v)
    }

    /// The role's name in logs, metrics and commands.
    pub fn name(self) -> &'static str {
        match self {
            Role::Gateway => "gateway",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_round_trips_through_its_byte_and_no_other_byte_names_one() {
        for r in [Role::Gateway, Role::Prefill, Role::Decode] {
            assert_eq!(Role::from_u8(r as u8), Some(r));
        }
        assert!((0..=255u8).filter(|b| Role::from_u8(*b).is_some()).count() == 3);
    }
}
