use thiserror::Error;
use wire::{Role, WireError};

/// Why a link, a worker or the router failed. Request-level failures travel as
/// [`protocol::RequestError`] events instead.
#[derive(Debug, Error)]
pub enum ClusterError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error("timed out while {0}")]
    Timeout(&'static str),
    #[error("the peer did not authenticate within {0:?}")]
    PreauthTimeout(std::time::Duration),
    #[error("bad control message: {0}")]
    Message(String),
    #[error("the peer is a {} node, expected {}", got.name(), role_list(want))]
    WrongRole { got: Role, want: Vec<Role> },
    #[error("registration refused: {0}")]
    Rejected(String),
    #[error("no node is listening at {0}")]
    NoSuchAddress(String),
    #[error("the operating system's random source failed: {0}")]
    Random(String),
}

/// "prefill or decode".
fn role_list(roles: &[Role]) -> String {
    roles.iter().map(|r| r.name()).collect::<Vec<_>>().join(" or ")
}

/// Fresh random bytes (nonces, ticket keys).
pub fn random<const N: usize>() -> Result<[u8; N], ClusterError> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| ClusterError::Random(e.to_string()))?;
    Ok(b)
}
