//! The sending end: each run's frames in the chosen mode, the encrypted one sealed page by
//! page while a second thread writes the previous frame.

use std::io::{BufRead, BufReader, ErrorKind, IoSlice, Write};
use std::net::TcpStream;
use std::sync::mpsc;
use std::time::Instant;

use wire::{
    ClusterSecret, Geometry, Initiator, KvFrameRef, KvSealer, Role, SealedParts, DEFAULT_MAX_FRAME, HEADER_LEN,
};

use super::protocol::*;
use crate::ToolError;

/// Page payloads with varied bytes (never all-zero pages, which the kernel may share).
pub(super) fn sender_sources(g: &Geometry) -> Result<Vec<Vec<u8>>, ToolError> {
    let n = payload_len(g)?;
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    Ok((0..SOURCES)
        .map(|_| {
            (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        })
        .collect())
}

pub(super) struct Sender {
    stream: TcpStream,
    replies: BufReader<TcpStream>,
    frames: u32,
    sources: Vec<Vec<u8>>,
    /// `framed` mode's bytes: frames of the encrypted format's size, built once, and a close.
    framed: Vec<Vec<u8>>,
    framed_close: Vec<u8>,
}

/// What the encrypted sender's writer thread sends.
enum Outgoing {
    Kv(SealedParts, Vec<u8>),
    Whole(Vec<u8>),
}

impl Sender {
    pub(super) fn new(stream: TcpStream, frames: u32, g: &Geometry) -> Result<Self, ToolError> {
        let replies = BufReader::new(stream.try_clone().map_err(ToolError::Link)?);
        let sources = sender_sources(g)?;
        let unit = |body: &[u8]| {
            let mut v = ((HEADER_LEN - 4 + body.len() + wire::AEAD_TAG_LEN) as u32).to_le_bytes().to_vec();
            v.resize(HEADER_LEN, 0);
            v.extend_from_slice(body);
            v.resize(v.len() + wire::AEAD_TAG_LEN, 0);
            v
        };
        let framed = sources.iter().map(|s| unit(s)).collect();
        let framed_close = unit(&[0; CLOSE_BODY]);
        Ok(Sender { stream, replies, frames, sources, framed, framed_close })
    }

    /// One run of `mode`: (seconds from the first write to the receiver's reply, CPU ns of
    /// the sending threads meanwhile, the reply).
    pub(super) fn run(&mut self, mode: Mode, run: u64, g: &Geometry) -> Result<(f64, Option<u64>, Reply), ToolError> {
        let p = plan(self.frames, run, g)?;
        let mut header = [0u8; 13];
        header[0] = mode.code();
        header[1..5].copy_from_slice(&self.frames.to_le_bytes());
        header[5..].copy_from_slice(&run.to_le_bytes());
        let cpu0 = thread_cpu_ns();
        let t0 = Instant::now();
        self.stream.write_all(&header).map_err(ToolError::Link)?;
        let n = self.sources.len();
        let mut helper_cpu = Some(0);
        match mode {
            Mode::Raw => {
                for i in 0..self.frames as usize {
                    self.stream.write_all(&self.sources[i % n]).map_err(ToolError::Link)?;
                }
            }
            Mode::Framed => {
                for i in 0..self.frames as usize {
                    self.stream.write_all(&self.framed[i % n]).map_err(ToolError::Link)?;
                }
                self.stream.write_all(&self.framed_close).map_err(ToolError::Link)?;
            }
            Mode::Mac => {
                for seq in 0..self.frames {
                    let (t0, t1) = (seq * g.page_size, (seq + 1) * g.page_size);
                    let body = &self.sources[seq as usize % n];
                    let head = mac_head(1, seq, seq, t0..t1, body.len());
                    let tag = mac_of(&head, body);
                    write_all_vectored(&mut self.stream, [&head, body, &tag]).map_err(ToolError::Link)?;
                }
                let body = close_body(&close_of(&p));
                let head = mac_head(2, self.frames, 0, 0..0, body.len());
                let tag = mac_of(&head, &body);
                write_all_vectored(&mut self.stream, [&head, &body, &tag]).map_err(ToolError::Link)?;
            }
            Mode::Encrypted => helper_cpu = self.send_encrypted(&p, g)?,
        }
        self.stream.flush().map_err(ToolError::Link)?;
        let mut line = String::new();
        self.replies.read_line(&mut line).map_err(ToolError::Link)?;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = thread_cpu_ns().zip(cpu0).map(|(b, a)| b.saturating_sub(a)).zip(helper_cpu).map(|(a, b)| a + b);
        let reply: Reply =
            serde_json::from_str(&line).map_err(ToolError::json(format!("receiver replied {line:?}")))?;
        if !reply.ok {
            fail!("receiver refused the {mode:?} run: {}", reply.error.as_deref().unwrap_or("?"));
        }
        Ok((secs, cpu, reply))
    }

    /// A fresh link (a real Noise handshake), then every page copied out of its source, sealed
    /// in place and handed to a writer thread, which writes it while the next one is sealed.
    /// Returns the writer thread's CPU time.
    fn send_encrypted(&mut self, p: &Plan, g: &Geometry) -> Result<Option<u64>, ToolError> {
        let (init, hello) = Initiator::start(
            &ClusterSecret::from_bytes(BENCH_SECRET),
            &super::protocol::bench_node_key()?,
            Role::Prefill,
        )?;
        self.stream.write_all(&hello.encode()).map_err(ToolError::Link)?;
        let reply = read_handshake(&mut self.replies)?;
        let (keys, _, _) = init.on_reply(&reply, &super::protocol::bench_trusts)?;
        let mut sealer = KvSealer::new(keys, DEFAULT_MAX_FRAME)?;
        let (tx, rx) = mpsc::sync_channel::<Outgoing>(2);
        let (recycle, recycled) = mpsc::channel::<Vec<u8>>();
        let mut out = self.stream.try_clone().map_err(ToolError::Link)?;
        let writer = std::thread::spawn(move || -> std::io::Result<Option<u64>> {
            let cpu0 = thread_cpu_ns();
            for frame in rx {
                match frame {
                    Outgoing::Kv(parts, payload) => {
                        write_all_vectored(&mut out, [&parts.head, &payload, &parts.tag])?;
                        let _ = recycle.send(payload);
                    }
                    Outgoing::Whole(bytes) => out.write_all(&bytes)?,
                }
            }
            out.flush()?;
            Ok(thread_cpu_ns().zip(cpu0).map(|(b, a)| b.saturating_sub(a)))
        });
        let id = p.ticket.id();
        let n = self.sources.len();
        let mut failed = None;
        for seq in 0..self.frames {
            let mut buf = recycled.try_recv().unwrap_or_default();
            let kv = KvFrameRef {
                page_index: seq,
                layers: 0..g.n_layers,
                tokens: seq * g.page_size..(seq + 1) * g.page_size,
                payload: &self.sources[seq as usize % n],
            };
            let parts = sealer.seal_kv_into(&id, seq, kv, &mut buf)?;
            if tx.send(Outgoing::Kv(parts, buf)).is_err() {
                failed = Some("the writer thread stopped");
                break;
            }
        }
        if failed.is_none() {
            let close = sealer.seal_close(&id, self.frames, &close_of(p))?;
            let _ = tx.send(Outgoing::Whole(close));
        }
        drop(tx);
        let cpu = writer
            .join()
            .map_err(|_| ToolError::Transfer("the writer thread panicked".into()))?
            .map_err(ToolError::Link)?;
        if let Some(why) = failed {
            fail!("{why}");
        }
        Ok(cpu)
    }
}
fn write_all_vectored(stream: &mut TcpStream, parts: [&[u8]; 3]) -> std::io::Result<()> {
    let mut slices = parts.map(IoSlice::new);
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match stream.write_vectored(rest) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
