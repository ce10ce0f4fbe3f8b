//! Transports: real TCP, and the in-memory pipes of the single-process `serve`, behind one
//! address syntax so every role runs the same protocol code over either.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::mpsc;

use crate::ClusterError;

/// A byte stream to a peer.
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}
pub type BoxIo = Box<dyn Io>;

const MEM_PREFIX: &str = "mem:";
/// In-memory pipe buffer: a few KV frames.
const MEM_PIPE_BYTES: usize = 4 << 20;

/// Dials and listens on `HOST:PORT` (TCP) or `mem:NAME` (in-process pipes registered on this
/// `Net`; clones share the registry).
#[derive(Clone, Default)]
pub struct Net {
    mem: Arc<Mutex<HashMap<String, mpsc::Sender<BoxIo>>>>,
}

/// Accepts connections of one address.
pub enum Listener {
    Tcp(TcpListener),
    Mem(mpsc::Receiver<BoxIo>),
}

impl Net {
    pub async fn dial(&self, addr: &str) -> Result<BoxIo, ClusterError> {
        if let Some(name) = addr.strip_prefix(MEM_PREFIX) {
            let tx = self.mem.lock().unwrap_or_else(|e| e.into_inner()).get(name).cloned();
            let tx = tx.ok_or_else(|| ClusterError::NoSuchAddress(addr.into()))?;
            let (a, b) = tokio::io::duplex(MEM_PIPE_BYTES);
            tx.send(Box::new(b)).await.map_err(|_| ClusterError::NoSuchAddress(addr.into()))?;
            return Ok(Box::new(a));
        }
        let s = tokio::net::TcpStream::connect(addr).await?;
        // Control messages are small and latency-bound.
        s.set_nodelay(true)?;
        Ok(Box::new(s))
    }

    /// Binds `addr`; returns the listener and the address peers should dial (the bound port
    /// when `addr` asked for port 0).
    pub async fn listen(&self, addr: &str) -> Result<(Listener, String), ClusterError> {
        if let Some(name) = addr.strip_prefix(MEM_PREFIX) {
            let (tx, rx) = mpsc::channel(64);
            self.mem.lock().unwrap_or_else(|e| e.into_inner()).insert(name.to_string(), tx);
            return Ok((Listener::Mem(rx), addr.to_string()));
        }
        let l = TcpListener::bind(addr).await?;
        let bound = l.local_addr()?.to_string();
        Ok((Listener::Tcp(l), bound))
    }
}

impl Listener {
    pub async fn accept(&mut self) -> Result<BoxIo, ClusterError> {
        Ok(self.accept_with_source().await?.0)
    }

    /// The next connection and the address it came from (`None` for an in-memory pipe, which
    /// only nodes of this process can dial).
    pub async fn accept_with_source(&mut self) -> Result<(BoxIo, Option<IpAddr>), ClusterError> {
        match self {
            Listener::Tcp(l) => {
                let (s, peer) = l.accept().await?;
                s.set_nodelay(true)?;
                Ok((Box::new(s), Some(peer.ip())))
            }
            Listener::Mem(rx) => {
                let io = rx.recv().await.ok_or(ClusterError::NoSuchAddress("mem listener closed".into()))?;
                Ok((io, None))
            }
        }
    }
}
