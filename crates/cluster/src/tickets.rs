//! A decode worker's live tickets and where their frames go: the route that reserved a ticket
//! waits on a channel; the first KV connection presenting an authentic frame of it takes the
//! sender. A ticket leaves the table when its route ends, however it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use wire::{Frame, TicketNonce, WireError};

/// What a KV connection passes to the route that owns the ticket.
pub(crate) enum Inbound {
    Frame(Frame),
    /// The connection carrying this ticket's frames broke the protocol or ended early.
    Broken(WireError),
    /// The sender's node key was revoked, or the secret its link was made with withdrawn: the
    /// link was cut (not a protocol fault; the route fails over).
    Cut(&'static str),
}

struct Slot {
    /// Taken by the first connection that presents an authentic frame of the ticket.
    tx: Option<mpsc::Sender<Inbound>>,
}

/// Live tickets, and where their frames go. A ticket leaves the table when its
/// route ends (complete, failed or cancelled); frames naming it are then dropped as unknown.
#[derive(Default, Clone)]
pub(crate) struct TicketTable(Arc<Mutex<HashMap<TicketNonce, Slot>>>);

impl TicketTable {
    /// Enters a ticket whose frames go to `tx`; it leaves the table when the guard drops.
    pub(crate) fn insert(&self, nonce: TicketNonce, tx: mpsc::Sender<Inbound>) -> TicketGuard {
        self.lock().insert(nonce, Slot { tx: Some(tx) });
        TicketGuard(self.clone(), nonce)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TicketNonce, Slot>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn holds(&self, n: &TicketNonce) -> bool {
        self.lock().contains_key(n)
    }

    pub(crate) fn claim(&self, n: &TicketNonce) -> Option<mpsc::Sender<Inbound>> {
        self.lock().get_mut(n).and_then(|s| s.tx.take())
    }
}

/// Removes a ticket from the table when its route ends, however it ends.
pub(crate) struct TicketGuard(TicketTable, TicketNonce);

impl Drop for TicketGuard {
    fn drop(&mut self) {
        self.0.lock().remove(&self.1);
    }
}

/// The first bytes of a ticket nonce, for logs.
pub(crate) fn nonce_hex(n: &TicketNonce) -> String {
    n.0[..4].iter().map(|b| format!("{b:02x}")).collect()
}
