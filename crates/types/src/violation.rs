//! The kinds of isolation violation: a fixed set, so a label in the metrics can only ever be
//! one of these, whatever a peer sends (a peer names a kind by variant; an unknown one does not
//! decode).

macro_rules! kinds {
    ($($variant:ident = $label:literal,)*) => {
        /// Which integrity or ownership check failed.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        #[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
        #[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
        pub enum ViolationKind {
            $($variant,)*
        }

        impl ViolationKind {
            /// Every kind, in label order of declaration (exported as 0 until one happens).
            pub const ALL: &'static [ViolationKind] = &[$(ViolationKind::$variant,)*];

            /// The metric label.
            pub fn label(self) -> &'static str {
                match self {
                    $(ViolationKind::$variant => $label,)*
                }
            }

            /// The kind a local check's label names (`wire::WireError::kind`-style labels);
            /// `Other` for a label that is not a violation kind.
            pub fn from_label(label: &str) -> ViolationKind {
                match label {
                    $($label => ViolationKind::$variant,)*
                    _ => ViolationKind::Other,
                }
            }
        }
    };
}

kinds! {
    Truncated = "truncated",
    Oversized = "oversized",
    TrailingBytes = "trailing_bytes",
    BadMagic = "bad_magic",
    BadVersion = "bad_version",
    Malformed = "malformed",
    BadMac = "bad_mac",
    UnknownTicket = "unknown_ticket",
    BadRange = "bad_range",
    Reservation = "reservation",
    WrongTicket = "wrong_ticket",
    OutOfOrder = "out_of_order",
    PageOutOfRange = "page_out_of_range",
    LayerOutOfRange = "layer_out_of_range",
    TokenOutOfRange = "token_out_of_range",
    TokensOutsidePage = "tokens_outside_page",
    PayloadLength = "payload_length",
    Duplicate = "duplicate",
    Overlap = "overlap",
    TokenCount = "token_count",
    PromptDigest = "prompt_digest",
    Incomplete = "incomplete",
    AfterClose = "after_close",
    GenerationMismatch = "generation_mismatch",
    OwnerMismatch = "owner_mismatch",
    UnwrittenRead = "unwritten_read",
    ShortReservation = "short_reservation",
    FirstTokenMismatch = "first_token_mismatch",
    BadFirstToken = "bad_first_token",
    BadToken = "bad_token",
    TransferTimeout = "transfer_timeout",
    TicketBusy = "ticket_busy",
    Other = "other",
}

impl std::fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip_and_unknown_labels_are_other() {
        for k in ViolationKind::ALL {
            assert_eq!(ViolationKind::from_label(k.label()), *k);
        }
        assert_eq!(ViolationKind::from_label("pwned\"} 1\nx"), ViolationKind::Other);
    }

    #[test]
    fn labels_are_plain_metric_label_values() {
        for k in ViolationKind::ALL {
            assert!(k.label().bytes().all(|b| b.is_ascii_lowercase() || b == b'_'), "{k:?}");
        }
    }
}
