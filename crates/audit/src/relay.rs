//! The plumbing every relay on a node link shares (the audit's fault proxy, and the tests'
//! recording and fault-injecting relays): a loopback listener that hands each connection to
//! its own thread, and the reader of one length-prefixed unit. Every unit on a node link is
//! length-prefixed (handshake messages, control records, KV frames), so a relay that forwards
//! whole units can count, record, hold, drop or alter them without any key.

use std::io::Read;
use std::net::{TcpListener, TcpStream};

/// The largest unit a relay reads (a KV frame is 16 MiB by default); anything longer ends the
/// connection as if it closed.
pub const MAX_UNIT: usize = 64 << 20;

/// One length-prefixed unit, prefix included; `None` at the end of the stream or past
/// [`MAX_UNIT`].
pub fn read_unit(s: &mut TcpStream) -> Option<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_UNIT {
        return None;
    }
    let mut buf = len.to_vec();
    buf.resize(4 + n, 0);
    s.read_exact(&mut buf[4..]).ok()?;
    Some(buf)
}

/// Listens on a free loopback port and runs `handle` on a thread of its own for every
/// connection; returns the address (`127.0.0.1:PORT`).
pub fn listen<F>(handle: F) -> std::io::Result<String>
where
    F: Fn(TcpStream) + Send + Sync + Clone + 'static,
{
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?.to_string();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(c) = conn else { continue };
            let handle = handle.clone();
            std::thread::spawn(move || handle(c));
        }
    });
    Ok(addr)
}
