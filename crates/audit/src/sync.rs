//! The lock the phases' client threads share their findings and rows through.

use std::sync::{Mutex, MutexGuard};

/// A poisoned lock still holds what the other threads wrote: the report wants all of it.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
