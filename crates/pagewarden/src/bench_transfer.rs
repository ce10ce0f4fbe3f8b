//! `pagewarden bench transfer`: KV transfer throughput between two processes over loopback TCP,
//! raw bytes against pagewarden frames, without and with the protocol's checks, side by side.
//!
//! This process is the sender. It spawns its own executable as the receiver (the hidden
//! `--sink ADDR`), which connects back, so both ends are real processes on a real socket. Each
//! run: a 13-byte header (mode, frame count, run id), the data, then the receiver's one-line
//! JSON reply once it has processed the last byte. A run is timed from the sender's first write
//! to that reply, so the work of both ends counts. Modes, all moving the same payload bytes:
//!
//! * `raw`: the payload bytes only, one write per page; the receiver reads them into a buffer.
//! * `framed`: the real frames (pre-encoded: one per KV page of the default model, then the
//!   close); the receiver reads each length prefix (`Codec::frame_len`) and frame, verifies
//!   nothing.
//! * `full`: the sender encodes every frame around its payload (`Codec::encode_parts`: MAC
//!   under the ticket key) and writes it vectored; the receiver decodes it in place
//!   (`Codec::decode_borrowed`: MAC checked in constant time) and checks it against its
//!   reservation (`Transfer::receive_ref`), up to the close and `Received::Complete`.
//! * `full_owned`: the same protocol through the owned API (`Codec::encode`, `Codec::decode`,
//!   `Transfer::receive`), which copies each payload once more on each side.
//!
//! Neither end writes payloads into KV pages: that copy is the same whatever the framing.
//! Modes alternate within each round so that noise hits them alike; medians are reported. Each
//! end also reports the CPU time of its thread (Linux), to show which end is the bottleneck.

use std::io::{BufRead, BufReader, ErrorKind, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use kv::{KvDtype, KvLayout, RequestId, TenantId};
use serde::{Deserialize, Serialize};
use wire::{
    CloseFrame, Codec, Frame, FrameBody, Geometry, KvFrame, PromptDigest, Received, Ticket, TicketId, TicketKey,
    TicketNonce, Transfer,
};

#[derive(Args)]
pub struct TransferArgs {
    /// Payload MiB per run (rounded up to whole KV pages).
    #[arg(long, default_value_t = 1024)]
    mib: usize,
    /// Runs of each mode (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    #[arg(long)]
    json: bool,
    /// Internal: run as the receiving process, connecting to the sender at this address.
    #[arg(long, hide = true)]
    sink: Option<String>,
}

/// The default model's KV geometry (SmolLM2-135M: 30 layers, 3 KV heads of 64, f16), 16-token
/// pages: one frame per page carries 30 x 16 x 2 x 3 x 64 x 2 = 368,640 payload bytes.
const LAYOUT: KvLayout = KvLayout { n_layers: 30, n_kv_heads: 3, head_dim: 64, page_size: 16, dtype: KvDtype::F16 };

/// Distinct source payloads the sender cycles through (about 23 MiB), so it does not send
/// one page that sits in its cache the whole time.
const SOURCES: usize = 64;

/// Bytes of a KV frame besides its payload: header, KV body fields, MAC (docs/wire.md).
const KV_OVERHEAD: usize = wire::HEADER_LEN + 24 + wire::TAG_LEN;

/// Both ends derive each run's ticket key from this. In a deployment the key is random per
/// ticket and travels on the authenticated control channel; here it need not be secret.
const BENCH_MASTER: [u8; 32] = [0x5a; 32];

/// Bound on every wait on the peer: a dead or stuck process ends the bench, never hangs it.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Mode {
    Raw,
    Framed,
    Full,
    FullOwned,
}

const MODES: [Mode; 4] = [Mode::Raw, Mode::Framed, Mode::Full, Mode::FullOwned];

impl Mode {
    fn code(self) -> u8 {
        self as u8
    }

    fn from_code(c: u8) -> Result<Self> {
        MODES.into_iter().find(|m| m.code() == c).with_context(|| format!("unknown mode {c}"))
    }

    fn label(self) -> &'static str {
        match self {
            Mode::Raw => "raw TCP",
            Mode::Framed => "framed, no MAC",
            Mode::Full => "full protocol",
            Mode::FullOwned => "full, owned API",
        }
    }
}

/// The receiver's answer to one run.
#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    /// Frames read (framed), or decoded and accepted by the transfer, close included (full).
    frames: u64,
    payload_bytes: u64,
    /// CPU time of the receiving thread during the run, where the OS tells it.
    cpu_ns: Option<u64>,
    error: Option<String>,
}

#[derive(Serialize)]
struct ModeReport {
    mode: Mode,
    gib_per_s: f64,
    runs_gib_per_s: Vec<f64>,
    /// Busy share of one core over the timed runs (1.0 = one core saturated), per end.
    sender_cpu: Option<f64>,
    receiver_cpu: Option<f64>,
    /// KV frames and the close (none in raw mode).
    frames_sent: Option<u64>,
    /// Frames the receiver counted in its last run (KV frames and the close).
    frames_received: u64,
    /// Frames that passed the MAC and the transfer checks (full modes only).
    frames_verified: Option<u64>,
}

#[derive(Serialize)]
struct Ratios {
    framed_over_raw: f64,
    full_over_raw: f64,
    /// 1 - full / framed: what the MACs (both ends) and the transfer checks cost.
    mac_and_checks_cost: f64,
    full_owned_over_raw: f64,
}

#[derive(Serialize)]
struct InProcess {
    encode_gib_per_s: f64,
    decode_borrowed_gib_per_s: f64,
    decode_owned_gib_per_s: f64,
}

#[derive(Serialize)]
struct Report {
    frames_per_run: u64,
    payload_bytes_per_frame: u64,
    payload_bytes_per_run: u64,
    reps: usize,
    modes: Vec<ModeReport>,
    ratios: Ratios,
    target_full_over_raw: f64,
    target_mac_and_checks_cost: f64,
    targets_met: bool,
    in_process: InProcess,
}

pub fn run(args: &TransferArgs) -> Result<()> {
    match &args.sink {
        Some(addr) => sink(addr),
        None => bench(args),
    }
}

fn geometry() -> Result<Geometry> {
    Ok(Geometry::from_layout(&LAYOUT)?)
}

fn payload_len(g: &Geometry) -> Result<usize> {
    let n = g.payload_len(g.n_layers, g.page_size).context("page payload size")?;
    Ok(usize::try_from(n)?)
}

/// What both ends know of run `run`: one ticket per run (a fresh nonce, as a decode worker
/// issues), one reserved page per frame, the admitted prompt filling them, and the key.
struct Plan {
    ticket: Ticket,
    prompt: Vec<u32>,
    key: TicketKey,
}

fn plan(frames: u32, run: u64, g: &Geometry) -> Result<Plan> {
    let tokens = frames.checked_mul(g.page_size).context("prompt too long for one ticket")?;
    let mut nonce = [0u8; 16];
    nonce[..8].copy_from_slice(&run.to_le_bytes());
    nonce[8..].copy_from_slice(b"benchxfr");
    let ticket =
        Ticket { request: RequestId(run), tenant: TenantId(1), nonce: TicketNonce(nonce), pages: frames, tokens };
    let prompt = (0..tokens).map(|i| i.wrapping_mul(7919) % 49_152).collect();
    let key = TicketKey::derive(&BENCH_MASTER, &ticket);
    Ok(Plan { ticket, prompt, key })
}

/// Kills the receiver if the bench ends early, so no process outlives it.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bench(args: &TransferArgs) -> Result<()> {
    ensure!(args.mib >= 1 && args.reps >= 1, "--mib and --reps must be at least 1");
    let g = geometry()?;
    let page = payload_len(&g)?;
    let frames = u32::try_from((args.mib << 20).div_ceil(page)).context("--mib too large")?;

    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let exe = std::env::current_exe().context("locating the pagewarden executable")?;
    let child = Command::new(exe)
        .args(["bench", "transfer", "--sink", &addr.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .context("starting the receiving process")?;
    let mut child = Reaped(child);
    let stream = accept_within(&listener, &mut child.0, IO_TIMEOUT)?;
    let mut sender = Sender::new(stream, frames, &g)?;

    // One untimed round, so connection buffers have grown and pages are faulted in before any
    // mode is measured.
    for mode in MODES {
        sender.run(mode, 0, &g)?;
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); MODES.len()];
    let mut cpu: Vec<Cpu> = vec![Cpu::default(); MODES.len()];
    let mut last: Vec<Option<Reply>> = MODES.iter().map(|_| None).collect();
    let mut run_id = 1;
    for _ in 0..args.reps {
        for (i, mode) in MODES.into_iter().enumerate() {
            let (secs, sender_cpu_ns, reply) = sender.run(mode, run_id, &g)?;
            run_id += 1;
            samples[i].push(reply.payload_bytes as f64 / secs / (1u64 << 30) as f64);
            cpu[i].add(secs, sender_cpu_ns, reply.cpu_ns);
            last[i] = Some(reply);
        }
    }
    drop(sender); // EOF: the receiver exits
    wait_within(&mut child.0, IO_TIMEOUT)?;

    let modes: Vec<ModeReport> = MODES
        .into_iter()
        .zip(samples)
        .zip(last)
        .zip(cpu)
        .map(|(((mode, runs), reply), cpu)| {
            let received = reply.map(|r| r.frames).unwrap_or(0);
            ModeReport {
                mode,
                gib_per_s: median(&runs),
                runs_gib_per_s: runs,
                sender_cpu: cpu.sender.map(|ns| ns / cpu.wall_ns),
                receiver_cpu: cpu.receiver.map(|ns| ns / cpu.wall_ns),
                frames_sent: (mode != Mode::Raw).then_some(frames as u64 + 1),
                frames_received: received,
                frames_verified: matches!(mode, Mode::Full | Mode::FullOwned).then_some(received),
            }
        })
        .collect();
    let speed = |m: Mode| modes.iter().find(|r| r.mode == m).map(|r| r.gib_per_s).unwrap_or(f64::NAN);
    let (raw, framed, full) = (speed(Mode::Raw), speed(Mode::Framed), speed(Mode::Full));
    let ratios = Ratios {
        framed_over_raw: framed / raw,
        full_over_raw: full / raw,
        mac_and_checks_cost: 1.0 - full / framed,
        full_owned_over_raw: speed(Mode::FullOwned) / raw,
    };
    let (target_full, target_cost) = (0.90, 0.05);
    let report = Report {
        frames_per_run: frames as u64,
        payload_bytes_per_frame: page as u64,
        payload_bytes_per_run: frames as u64 * page as u64,
        reps: args.reps,
        targets_met: ratios.full_over_raw >= target_full && ratios.mac_and_checks_cost <= target_cost,
        ratios,
        target_full_over_raw: target_full,
        target_mac_and_checks_cost: target_cost,
        in_process: in_process(&sender_sources(&g)?, &g)?,
        modes,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_report(&report);
    }
    Ok(())
}

fn print_report(r: &Report) {
    println!(
        "KV transfer, two processes over loopback TCP: {} frames of {} payload bytes ({:.1} MiB) per run, median of {}",
        r.frames_per_run,
        r.payload_bytes_per_frame,
        r.payload_bytes_per_run as f64 / (1u64 << 20) as f64,
        r.reps
    );
    let raw = r.modes.iter().find(|m| m.mode == Mode::Raw).map(|m| m.gib_per_s).unwrap_or(f64::NAN);
    let busy = |c: Option<f64>| c.map(|c| format!("{:>4.0}%", 100.0 * c)).unwrap_or_else(|| "   ?".into());
    for m in &r.modes {
        let verified = match (m.frames_verified, m.frames_sent) {
            (Some(v), Some(sent)) => format!("   {v}/{sent} frames verified"),
            _ => String::new(),
        };
        println!(
            "  {:<20} {:>6.2} GiB/s  {:>6.1}% of raw   CPU busy: sender {}, receiver {}{verified}",
            m.mode.label(),
            m.gib_per_s,
            100.0 * m.gib_per_s / raw,
            busy(m.sender_cpu),
            busy(m.receiver_cpu),
        );
    }
    println!(
        "full / raw {:.1}% (target >= {:.0}%), MAC + checks cost {:.1}% of framed (target <= {:.0}%): {}",
        100.0 * r.ratios.full_over_raw,
        100.0 * r.target_full_over_raw,
        100.0 * r.ratios.mac_and_checks_cost,
        100.0 * r.target_mac_and_checks_cost,
        if r.targets_met { "met" } else { "missed" }
    );
    let p = &r.in_process;
    println!(
        "in one thread: encode {:.2} GiB/s, decode borrowed {:.2} GiB/s, decode owned {:.2} GiB/s",
        p.encode_gib_per_s, p.decode_borrowed_gib_per_s, p.decode_owned_gib_per_s
    );
}

/// CPU and wall time of a mode's timed runs.
#[derive(Debug, Clone, Default)]
struct Cpu {
    wall_ns: f64,
    sender: Option<f64>,
    receiver: Option<f64>,
}

impl Cpu {
    fn add(&mut self, secs: f64, sender: Option<u64>, receiver: Option<u64>) {
        self.wall_ns += secs * 1e9;
        self.sender = sender.map(|ns| self.sender.unwrap_or(0.0) + ns as f64);
        self.receiver = receiver.map(|ns| self.receiver.unwrap_or(0.0) + ns as f64);
    }
}

/// CPU time of the calling thread so far, in ns, where Linux's schedstat is available.
fn thread_cpu_ns() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    s.split_whitespace().next()?.parse().ok()
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn accept_within(listener: &TcpListener, child: &mut Child, limit: Duration) -> Result<TcpStream> {
    listener.set_nonblocking(true)?;
    let deadline = Instant::now() + limit;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false)?;
                return configure(stream);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait()? {
                    bail!("the receiving process exited before connecting ({status})");
                }
                ensure!(Instant::now() < deadline, "the receiving process did not connect within {limit:?}");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn wait_within(child: &mut Child, limit: Duration) -> Result<()> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait()? {
            ensure!(status.success(), "the receiving process failed ({status})");
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "the receiving process did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn configure(stream: TcpStream) -> Result<TcpStream> {
    // The header and the reply are small messages each waited on: send them at once.
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(stream)
}

/// Page payloads with varied bytes (never all-zero pages, which the kernel may share).
fn sender_sources(g: &Geometry) -> Result<Vec<Vec<u8>>> {
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

struct Sender {
    stream: TcpStream,
    replies: BufReader<TcpStream>,
    frames: u32,
    /// One KV frame per source payload; each send relabels one (ticket, seq, page, tokens).
    kv: Vec<Frame>,
    /// `framed` mode's bytes: the frames encoded once, and a close.
    encoded: Vec<Vec<u8>>,
    encoded_close: Vec<u8>,
}

impl Sender {
    fn new(stream: TcpStream, frames: u32, g: &Geometry) -> Result<Self> {
        let replies = BufReader::new(stream.try_clone()?);
        let p = plan(frames, 0, g)?;
        let kv: Vec<Frame> = sender_sources(g)?
            .into_iter()
            .map(|payload| {
                let body = KvFrame { page_index: 0, layers: 0..g.n_layers, tokens: 0..g.page_size, payload };
                Frame::kv(p.ticket.id(), 0, body)
            })
            .collect();
        let codec = Codec::default();
        let encoded = kv.iter().map(|f| codec.encode(f, &p.key)).collect::<Result<_, _>>()?;
        let encoded_close = codec.encode(&close_frame(&p, frames), &p.key)?;
        Ok(Sender { stream, replies, frames, kv, encoded, encoded_close })
    }

    /// One run of `mode`: (seconds from the first write to the receiver's reply, CPU ns of
    /// this thread meanwhile, the reply).
    fn run(&mut self, mode: Mode, run: u64, g: &Geometry) -> Result<(f64, Option<u64>, Reply)> {
        let p = plan(self.frames, run, g)?;
        let close = close_frame(&p, self.frames);
        let mut header = [0u8; 13];
        header[0] = mode.code();
        header[1..5].copy_from_slice(&self.frames.to_le_bytes());
        header[5..].copy_from_slice(&run.to_le_bytes());
        let codec = Codec::default();
        let cpu0 = thread_cpu_ns();
        let t0 = Instant::now();
        self.stream.write_all(&header)?;
        let n = self.kv.len();
        match mode {
            Mode::Raw => {
                for i in 0..self.frames as usize {
                    if let FrameBody::Kv(kv) = &self.kv[i % n].body {
                        self.stream.write_all(&kv.payload)?;
                    }
                }
            }
            Mode::Framed => {
                for i in 0..self.frames as usize {
                    self.stream.write_all(&self.encoded[i % n])?;
                }
                self.stream.write_all(&self.encoded_close)?;
            }
            Mode::Full => {
                for seq in 0..self.frames {
                    let f = relabel(&mut self.kv[seq as usize % n], p.ticket.id(), seq, g);
                    write_all_vectored(&mut self.stream, codec.encode_parts(&f.borrowed(), &p.key)?.parts())?;
                }
                write_all_vectored(&mut self.stream, codec.encode_parts(&close.borrowed(), &p.key)?.parts())?;
            }
            Mode::FullOwned => {
                for seq in 0..self.frames {
                    let f = relabel(&mut self.kv[seq as usize % n], p.ticket.id(), seq, g);
                    self.stream.write_all(&codec.encode(f, &p.key)?)?;
                }
                self.stream.write_all(&codec.encode(&close, &p.key)?)?;
            }
        }
        self.stream.flush()?;
        let mut line = String::new();
        self.replies.read_line(&mut line).context("reading the receiver's reply")?;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = thread_cpu_ns().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
        let reply: Reply = serde_json::from_str(&line).with_context(|| format!("receiver replied {line:?}"))?;
        if !reply.ok {
            bail!("receiver refused the {mode:?} run: {}", reply.error.as_deref().unwrap_or("?"));
        }
        Ok((secs, cpu, reply))
    }
}

/// Makes a source frame page `seq` of the run's ticket (the payload stays where it is).
fn relabel<'f>(f: &'f mut Frame, ticket: TicketId, seq: u32, g: &Geometry) -> &'f Frame {
    f.ticket = ticket;
    f.seq = seq;
    if let FrameBody::Kv(kv) = &mut f.body {
        kv.page_index = seq;
        kv.tokens = seq * g.page_size..(seq + 1) * g.page_size;
    }
    f
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

fn close_frame(p: &Plan, frames: u32) -> Frame {
    let close = CloseFrame { tokens: p.ticket.tokens, prompt_digest: PromptDigest::of(&p.prompt), first_token: 1 };
    Frame::close(p.ticket.id(), frames, close)
}

/// The receiving process: serves runs until the sender closes the connection.
fn sink(addr: &str) -> Result<()> {
    let mut stream = configure(TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?)?;
    let g = geometry()?;
    let page = payload_len(&g)?;
    let codec = Codec::default();
    // Sized for the largest frame the codec accepts, so no frame is refused for buffer space.
    let mut buf = vec![0u8; codec.max_frame()];
    loop {
        let mut header = [0u8; 13];
        match stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let mode = Mode::from_code(header[0])?;
        let frames = u32::from_le_bytes([header[1], header[2], header[3], header[4]]);
        let mut run = [0u8; 8];
        run.copy_from_slice(&header[5..]);
        let run = u64::from_le_bytes(run);
        let cpu0 = thread_cpu_ns();
        let result = receive(&mut stream, &mut buf, mode, frames, run, &g, page, &codec);
        let cpu_ns = thread_cpu_ns().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
        let reply = match result {
            Ok((frames, payload_bytes)) => Reply { ok: true, frames, payload_bytes, cpu_ns, error: None },
            Err(e) => Reply { ok: false, frames: 0, payload_bytes: 0, cpu_ns, error: Some(format!("{e:#}")) },
        };
        let mut line = serde_json::to_string(&reply)?;
        line.push('\n');
        stream.write_all(line.as_bytes())?;
        if !reply.ok {
            // The stream is out of step after a refused frame: end here, as a receiver would.
            bail!("{}", reply.error.unwrap_or_default());
        }
    }
}

/// Receives one run; returns (frames counted, payload bytes).
#[allow(clippy::too_many_arguments)]
fn receive(
    stream: &mut TcpStream,
    buf: &mut [u8],
    mode: Mode,
    frames: u32,
    run: u64,
    g: &Geometry,
    page: usize,
    codec: &Codec,
) -> Result<(u64, u64)> {
    match mode {
        Mode::Raw => {
            let dst = buf.get_mut(..page).context("buffer")?;
            for _ in 0..frames {
                stream.read_exact(dst)?;
            }
            Ok((frames as u64, frames as u64 * page as u64))
        }
        Mode::Framed => {
            let mut bytes = 0u64;
            for _ in 0..frames {
                let frame = read_frame(stream, buf, codec)?;
                bytes += frame.len().saturating_sub(KV_OVERHEAD) as u64;
            }
            read_frame(stream, buf, codec)?; // the close
            Ok((frames as u64 + 1, bytes))
        }
        Mode::Full | Mode::FullOwned => {
            let p = plan(frames, run, g)?;
            let (key, nonce) = (p.key.clone(), p.ticket.nonce);
            // This receiver's key table: the one ticket it issued for the run.
            let keys = move |n: &TicketNonce| (*n == nonce).then(|| key.clone());
            let mut transfer = Transfer::new(p.ticket, *g, &p.prompt)?;
            let (mut count, mut bytes) = (0u64, 0u64);
            loop {
                let frame = read_frame(stream, buf, codec)?;
                let owned;
                let received = if mode == Mode::Full {
                    transfer.receive_ref(&codec.decode_borrowed(frame, &keys)?)?
                } else {
                    owned = codec.decode(frame, &keys)?;
                    transfer.receive(&owned)?
                };
                count += 1;
                match received {
                    Received::Written(next, write) => {
                        bytes += write.payload.len() as u64;
                        transfer = next;
                    }
                    Received::Complete(done) => {
                        ensure!(done.frames() == frames, "completed after {} of {frames} KV frames", done.frames());
                        return Ok((count, bytes));
                    }
                }
            }
        }
    }
}

/// Reads one length-prefixed frame into `buf`; the slice holding it.
fn read_frame<'b>(stream: &mut TcpStream, buf: &'b mut [u8], codec: &Codec) -> Result<&'b [u8]> {
    let prefix = buf.get_mut(..4).context("buffer")?;
    stream.read_exact(prefix)?;
    let total = codec.frame_len(prefix)?;
    let frame = buf.get_mut(..total).context("frame larger than the buffer")?;
    stream.read_exact(frame.get_mut(4..).context("frame shorter than its prefix")?)?;
    Ok(frame)
}

/// Single-thread costs of the pieces, for reading the two-process figures.
fn in_process(sources: &[Vec<u8>], g: &Geometry) -> Result<InProcess> {
    let p = plan(1, 0, g)?;
    let key = p.key.clone();
    let nonce = p.ticket.nonce;
    let keys = move |n: &TicketNonce| (*n == nonce).then(|| key.clone());
    let codec = Codec::default();
    let frames: Vec<Frame> = sources
        .iter()
        .map(|s| {
            let body = KvFrame { page_index: 0, layers: 0..g.n_layers, tokens: 0..g.page_size, payload: s.clone() };
            Frame::kv(p.ticket.id(), 0, body)
        })
        .collect();
    let encoded = frames.iter().map(|f| codec.encode(f, &p.key)).collect::<Result<Vec<_>, _>>()?;
    let bytes: usize = sources.iter().map(Vec::len).sum();
    let rate = |f: &mut dyn FnMut() -> Result<()>| -> Result<f64> {
        f()?; // warm
        let reps = 4;
        let t0 = Instant::now();
        for _ in 0..reps {
            f()?;
        }
        Ok((reps * bytes) as f64 / t0.elapsed().as_secs_f64() / (1u64 << 30) as f64)
    };
    Ok(InProcess {
        encode_gib_per_s: rate(&mut || {
            for f in &frames {
                std::hint::black_box(codec.encode(f, &p.key)?);
            }
            Ok(())
        })?,
        decode_borrowed_gib_per_s: rate(&mut || {
            for e in &encoded {
                std::hint::black_box(codec.decode_borrowed(e, &keys)?);
            }
            Ok(())
        })?,
        decode_owned_gib_per_s: rate(&mut || {
            for e in &encoded {
                std::hint::black_box(codec.decode(e, &keys)?);
            }
            Ok(())
        })?,
    })
}
