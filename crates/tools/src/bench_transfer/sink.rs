//! The receiving process (`bench transfer --sink ADDR`): opens and checks each run's frames
//! as a decode worker does, and answers with what it counted.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;

use wire::{
    CloseFrame, ClusterSecret, FrameBodyRef, FrameRef, Geometry, KvFrameRef, KvOpener, PromptDigest, Received,
    Responder, Role, TicketId, TicketNonce, Transfer, DEFAULT_MAX_FRAME,
};

use super::protocol::*;
use crate::ToolError;

/// The receiving process: serves runs until the sender closes the connection.
pub(super) fn sink(addr: &str) -> Result<(), ToolError> {
    let stream = TcpStream::connect(addr)
        .map_err(|source| ToolError::Process { what: format!("connecting to {addr}"), source })?;
    let mut stream = configure(stream)?;
    let g = geometry()?;
    let page = payload_len(&g)?;
    // Sized for the largest frame accepted, so no frame is refused for buffer space.
    let mut buf = vec![0u8; DEFAULT_MAX_FRAME];
    loop {
        let mut header = [0u8; 13];
        match stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(ToolError::Link(e)),
        }
        let mode = Mode::from_code(header[0])?;
        let frames = u32::from_le_bytes([header[1], header[2], header[3], header[4]]);
        let mut run = [0u8; 8];
        run.copy_from_slice(&header[5..]);
        let run = u64::from_le_bytes(run);
        let cpu0 = thread_cpu_ns();
        let result = receive(&mut stream, &mut buf, mode, frames, run, &g, page);
        let cpu_ns = thread_cpu_ns().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
        let reply = match result {
            Ok((frames, payload_bytes)) => Reply { ok: true, frames, payload_bytes, cpu_ns, error: None },
            Err(e) => Reply { ok: false, frames: 0, payload_bytes: 0, cpu_ns, error: Some(crate::error::chain(&e)) },
        };
        let mut line = serde_json::to_string(&reply).map_err(ToolError::json("serialising the reply"))?;
        line.push('\n');
        stream.write_all(line.as_bytes()).map_err(ToolError::Link)?;
        if !reply.ok {
            // The stream is out of step after a refused frame: end here, as a receiver would.
            fail!("{}", reply.error.unwrap_or_default());
        }
    }
}

/// Receives one run; returns (frames counted, payload bytes).
fn receive(
    stream: &mut TcpStream,
    buf: &mut [u8],
    mode: Mode,
    frames: u32,
    run: u64,
    g: &Geometry,
    page: usize,
) -> Result<(u64, u64), ToolError> {
    let max = DEFAULT_MAX_FRAME;
    match mode {
        Mode::Raw => {
            let Some(dst) = buf.get_mut(..page) else { fail!("buffer") };
            for _ in 0..frames {
                stream.read_exact(dst).map_err(ToolError::Link)?;
            }
            Ok((frames as u64, frames as u64 * page as u64))
        }
        Mode::Framed => {
            let mut bytes = 0u64;
            for _ in 0..frames {
                let frame = read_frame(stream, buf, max)?;
                bytes += frame.len().saturating_sub(wire::FRAME_OVERHEAD) as u64;
            }
            read_frame(stream, buf, max)?; // the close
            Ok((frames as u64 + 1, bytes))
        }
        Mode::Mac => {
            let p = plan(frames, run, g)?;
            receive_transfer(stream, buf, frames, &p, g, &mut Opener::Mac(p.ticket.id()))
        }
        Mode::Encrypted => {
            let hello = read_handshake(stream)?;
            let (reply, keys, _, _) = Responder::on_hello(
                &[ClusterSecret::from_bytes(BENCH_SECRET)],
                &super::protocol::bench_node_key()?,
                Role::Decode,
                &hello,
                &super::protocol::bench_trusts,
            )?;
            stream.write_all(&reply.encode()).map_err(ToolError::Link)?;
            let p = plan(frames, run, g)?;
            receive_transfer(
                stream,
                buf,
                frames,
                &p,
                g,
                &mut Opener::Encrypted(Box::new(KvOpener::new(keys, max)?), p.ticket.nonce),
            )
        }
    }
}

/// How a receiving mode authenticates its frames.
enum Opener {
    /// Version 1: the MAC, then the header in clear.
    Mac(TicketId),
    /// Version 2: the link's opener, and the one ticket this receiver issued for the run.
    Encrypted(Box<KvOpener>, TicketNonce),
}

impl Opener {
    fn open<'a>(&mut self, frame: &'a mut [u8], g: &Geometry) -> Result<FrameRef<'a>, ToolError> {
        match self {
            Opener::Mac(ticket) => open_mac(frame, *ticket, g),
            Opener::Encrypted(opener, nonce) => Ok(opener.open(frame, &|n: &TicketNonce| n == nonce)?),
        }
    }
}

/// Reads and checks frames until the transfer completes; returns (frames, payload bytes).
fn receive_transfer(
    stream: &mut TcpStream,
    buf: &mut [u8],
    frames: u32,
    p: &Plan,
    g: &Geometry,
    opener: &mut Opener,
) -> Result<(u64, u64), ToolError> {
    let mut transfer = Transfer::new(p.ticket, *g, &p.prompt)?;
    let (mut count, mut bytes) = (0u64, 0u64);
    loop {
        let frame = read_frame(stream, buf, DEFAULT_MAX_FRAME)?;
        let opened = opener.open(frame, g)?;
        count += 1;
        match transfer.receive_ref(&opened)? {
            Received::Written(next, write) => {
                bytes += write.payload.len() as u64;
                transfer = next;
            }
            Received::Complete(done) => {
                check!(done.frames() == frames, "completed after {} of {frames} KV frames", done.frames());
                return Ok((count, bytes));
            }
        }
    }
}

/// Checks a `mac` mode frame's MAC (constant time) and parses it.
fn open_mac<'a>(frame: &'a [u8], ticket: TicketId, g: &Geometry) -> Result<FrameRef<'a>, ToolError> {
    check!(frame.len() >= MAC_HEAD + MAC_TAG, "short frame");
    let (signed, tag) = frame.split_at(frame.len() - MAC_TAG);
    let expected = blake3::keyed_hash(&BENCH_MAC_KEY, signed);
    let Ok(tag) = <[u8; MAC_TAG]>::try_from(tag) else { fail!("short frame") };
    check!(expected == blake3::Hash::from_bytes(tag), "MAC check failed");
    let field = |i: usize| u32::from_le_bytes([signed[i * 4], signed[i * 4 + 1], signed[i * 4 + 2], signed[i * 4 + 3]]);
    let (kind, seq, page, t0, t1) = (field(1), field(2), field(3), field(4), field(5));
    let body = &signed[MAC_HEAD..];
    let body = match kind {
        1 => FrameBodyRef::Kv(KvFrameRef { page_index: page, layers: 0..g.n_layers, tokens: t0..t1, payload: body }),
        2 => {
            check!(body.len() == CLOSE_BODY, "bad close");
            let mut digest = [0u8; 32];
            digest.copy_from_slice(&body[4..36]);
            let word = |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
            FrameBodyRef::Close(CloseFrame {
                tokens: word(0),
                prompt_digest: PromptDigest(digest),
                first_token: word(36),
            })
        }
        _ => fail!("unknown kind {kind}"),
    };
    Ok(FrameRef { ticket, seq, body })
}

/// Reads one length-prefixed frame into `buf`; the slice holding it.
fn read_frame<'b>(stream: &mut TcpStream, buf: &'b mut [u8], max: usize) -> Result<&'b mut [u8], ToolError> {
    let Some(prefix) = buf.get_mut(..4) else { fail!("buffer") };
    stream.read_exact(prefix).map_err(ToolError::Link)?;
    let total = (u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize).saturating_add(4);
    check!(total <= max, "frame of {total} bytes over the maximum {max}");
    let Some(frame) = buf.get_mut(..total) else { fail!("frame larger than the buffer") };
    let Some(body) = frame.get_mut(4..) else { fail!("frame shorter than its prefix") };
    stream.read_exact(body).map_err(ToolError::Link)?;
    Ok(frame)
}
