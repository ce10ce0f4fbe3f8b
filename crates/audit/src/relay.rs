//! The plumbing every relay on a node link shares (the audit's fault proxy, and the tests'
//! recording and fault-injecting relays): a loopback listener that hands each connection to
//! its own thread, and the reader of one length-prefixed unit. Every unit on a node link is
//! length-prefixed (handshake messages, control records, KV frames), so a relay that forwards
//! whole units can count, record, hold, drop or alter them without any key.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};

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

/// Connects `from` (a dialer's connection) to `upstream`: the upstream's bytes flow back as they
/// are on a thread of their own, and the dialer's handshake (the Noise hello, then its pairing
/// record) is relayed whole. Returns the upstream connection, for the caller to forward (and
/// alter) the units that follow; `None` if either side went away.
pub fn splice(from: &mut TcpStream, upstream: &str) -> Option<TcpStream> {
    let mut to = TcpStream::connect(upstream).ok()?;
    let _ = to.set_nodelay(true);
    let (mut back_from, mut back_to) = (to.try_clone().ok()?, from.try_clone().ok()?);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut back_from, &mut back_to);
        let _ = back_to.shutdown(Shutdown::Write);
    });
    for _ in 0..2 {
        let u = read_unit(from)?;
        to.write_all(&u).ok()?;
    }
    Some(to)
}
