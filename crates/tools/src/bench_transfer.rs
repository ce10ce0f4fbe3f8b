//! `pagewarden bench transfer`: KV transfer throughput between two processes over loopback TCP,
//! raw bytes against pagewarden frames: unprotected, MAC'd only (wire version 1), and
//! encrypted (version 2, what nodes run), side by side in one run.
//!
//! This process is the sender. It spawns its own executable as the receiver (the hidden
//! `--sink ADDR`), which connects back, so both ends are real processes on a real socket. Each
//! run: a 13-byte header (mode, frame count, run id), the data, then the receiver's one-line
//! JSON reply once it has processed the last byte. A run is timed from the sender's first write
//! to that reply, so the work of both ends counts. Modes, all moving the same payload bytes:
//!
//! * `raw`: the payload bytes only, one write per page; the receiver reads them into a buffer.
//! * `framed`: frames of the encrypted format's size (head, payload, tag), nothing computed:
//!   the receiver reads each length prefix and frame.
//! * `mac`: version 1's protection: a keyed BLAKE3 MAC over each frame (header in clear), checked
//!   in constant time by the receiver, then the transfer checks (`Transfer::receive_ref`).
//! * `encrypted`: version 2 as the workers run it: a Noise handshake per run (a fresh link),
//!   then each page encrypted out of its source into a send buffer in one pass
//!   (`KvSealer::seal_kv_into`) and written vectored by a second thread while the next page
//!   is sealed; the receiver opens each frame in place (`KvOpener::open`) and checks it against
//!   its reservation (`Transfer::receive_ref`), up to the close and `Received::Complete`.
//!
//! Neither end writes payloads into KV pages: that copy is the same whatever the framing.
//! Modes alternate within each round so that noise hits them alike; medians are reported. Each
//! end also reports the CPU time of its threads (Linux), to show which end is the bottleneck.

use std::io::{BufRead, BufReader, ErrorKind, IoSlice, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use audit::stats::median_or_nan;
use clap::Args;
use kv::{KvDtype, KvLayout, RequestId, TenantId};
use serde::{Deserialize, Serialize};
use wire::{
    CloseFrame, ClusterSecret, FrameBodyRef, FrameRef, Geometry, HandshakeMsg, Initiator, KvFrameMut, KvFrameRef,
    KvOpener, KvSealer, PromptDigest, Received, Responder, Role, SealedParts, SessionKeys, Ticket, TicketId,
    TicketNonce, Transfer, DEFAULT_MAX_FRAME, HEADER_LEN, MAX_HANDSHAKE_MSG,
};

#[derive(Args)]
pub struct TransferArgs {
    /// Payload MiB per run (rounded up to whole KV pages).
    #[arg(long, default_value_t = 1024)]
    mib: usize,
    /// Runs of each mode (the median is reported).
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Modes to run, comma-separated (default: all, so they are measured side by side).
    #[arg(long, value_delimiter = ',', default_values_t = ["raw".to_string(), "framed".to_string(), "mac".to_string(), "encrypted".to_string()])]
    modes: Vec<String>,
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

/// The `mac` mode's key, known to both ends (a bench need not keep it secret).
const BENCH_MAC_KEY: [u8; 32] = [0x5a; 32];
/// The `encrypted` mode's cluster secret; each run's link keys come from a real handshake.
const BENCH_SECRET: [u8; 32] = [0xa5; 32];

/// `mac` mode frames: len u32, kind u32, seq u32, page u32, token start u32, token end u32,
/// the body, then a 32-byte keyed BLAKE3 over everything before it (version 1's layout, in
/// short: the cost is the MAC's pass over the payload).
const MAC_HEAD: usize = 24;
const MAC_TAG: usize = 32;
const CLOSE_BODY: usize = 40;

/// Bound on every wait on the peer: a dead or stuck process ends the bench, never hangs it.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Mode {
    Raw,
    Framed,
    Mac,
    Encrypted,
}

const MODES: [Mode; 4] = [Mode::Raw, Mode::Framed, Mode::Mac, Mode::Encrypted];

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
            Mode::Framed => "framed, unprotected",
            Mode::Mac => "MAC only (wire v1)",
            Mode::Encrypted => "encrypted (wire v2)",
        }
    }

    fn parse(s: &str) -> Result<Self> {
        MODES
            .into_iter()
            .find(|m| m.name() == s)
            .with_context(|| format!("unknown mode {s:?} (raw, framed, mac, encrypted)"))
    }

    fn name(self) -> &'static str {
        match self {
            Mode::Raw => "raw",
            Mode::Framed => "framed",
            Mode::Mac => "mac",
            Mode::Encrypted => "encrypted",
        }
    }

    fn verifies(self) -> bool {
        matches!(self, Mode::Mac | Mode::Encrypted)
    }
}

/// The receiver's answer to one run.
#[derive(Debug, Serialize, Deserialize)]
struct Reply {
    ok: bool,
    /// Frames read (framed), or opened and accepted by the transfer, close included.
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
    /// Busy share of one core over the timed runs (1.0 = one core saturated), per end; the
    /// encrypted sender's sealing and writing threads are added up.
    sender_cpu: Option<f64>,
    receiver_cpu: Option<f64>,
    /// KV frames and the close (none in raw mode).
    frames_sent: Option<u64>,
    /// Frames the receiver counted in its last run (KV frames and the close).
    frames_received: u64,
    /// Frames that passed authentication and the transfer checks (mac and encrypted).
    frames_verified: Option<u64>,
}

#[derive(Serialize)]
struct Ratios {
    framed_over_raw: f64,
    mac_over_raw: f64,
    encrypted_over_raw: f64,
    /// 1 - encrypted / framed: what encryption, authentication and the checks cost.
    encryption_cost: f64,
}

#[derive(Serialize)]
struct InProcess {
    /// Whole KV frames through the codec (AEGIS-128X2 bodies, AES-256-GCM headers), one core.
    seal_gib_per_s: f64,
    open_gib_per_s: f64,
    /// The record layer's AES-256-GCM (control messages, frame headers) on page-sized records.
    aes_gcm_gib_per_s: f64,
    /// Version 1's keyed BLAKE3, one core, for comparison.
    blake3_mac_gib_per_s: f64,
    /// One Noise handshake, both ends' work, median.
    handshake_us: f64,
}

#[derive(Serialize)]
struct Report {
    cpu: Option<String>,
    frames_per_run: u64,
    payload_bytes_per_frame: u64,
    payload_bytes_per_run: u64,
    reps: usize,
    modes: Vec<ModeReport>,
    ratios: Ratios,
    target_encrypted_over_raw: f64,
    target_met: bool,
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
/// issues), one reserved page per frame, and the admitted prompt filling them.
struct Plan {
    ticket: Ticket,
    prompt: Vec<u32>,
}

fn plan(frames: u32, run: u64, g: &Geometry) -> Result<Plan> {
    let tokens = frames.checked_mul(g.page_size).context("prompt too long for one ticket")?;
    let mut nonce = [0u8; 16];
    nonce[..8].copy_from_slice(&run.to_le_bytes());
    nonce[8..].copy_from_slice(b"benchxfr");
    let ticket =
        Ticket { request: RequestId(run), tenant: TenantId(1), nonce: TicketNonce(nonce), pages: frames, tokens };
    let prompt = (0..tokens).map(|i| i.wrapping_mul(7919) % 49_152).collect();
    Ok(Plan { ticket, prompt })
}

fn close_of(p: &Plan) -> CloseFrame {
    CloseFrame { tokens: p.ticket.tokens, prompt_digest: PromptDigest::of(&p.prompt), first_token: 1 }
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
    let chosen = args.modes.iter().map(|m| Mode::parse(m)).collect::<Result<Vec<_>>>()?;
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
    for &mode in &chosen {
        sender.run(mode, 0, &g)?;
    }
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); chosen.len()];
    let mut cpu: Vec<Cpu> = vec![Cpu::default(); chosen.len()];
    let mut last: Vec<Option<Reply>> = chosen.iter().map(|_| None).collect();
    let mut run_id = 1;
    for rep in 0..args.reps {
        // Each round starts with another mode, so no mode always follows the same one.
        for k in 0..chosen.len() {
            let i = (rep + k) % chosen.len();
            let mode = chosen[i];
            let (secs, sender_cpu_ns, reply) = sender.run(mode, run_id, &g)?;
            run_id += 1;
            samples[i].push(reply.payload_bytes as f64 / secs / (1u64 << 30) as f64);
            cpu[i].add(secs, sender_cpu_ns, reply.cpu_ns);
            last[i] = Some(reply);
        }
    }
    drop(sender); // EOF: the receiver exits
    wait_within(&mut child.0, IO_TIMEOUT)?;

    let modes: Vec<ModeReport> = chosen
        .into_iter()
        .zip(samples)
        .zip(last)
        .zip(cpu)
        .map(|(((mode, runs), reply), cpu)| {
            let received = reply.map(|r| r.frames).unwrap_or(0);
            ModeReport {
                mode,
                gib_per_s: median_or_nan(&runs),
                runs_gib_per_s: runs,
                sender_cpu: cpu.sender.map(|ns| ns / cpu.wall_ns),
                receiver_cpu: cpu.receiver.map(|ns| ns / cpu.wall_ns),
                frames_sent: (mode != Mode::Raw).then_some(frames as u64 + 1),
                frames_received: received,
                frames_verified: mode.verifies().then_some(received),
            }
        })
        .collect();
    let speed = |m: Mode| modes.iter().find(|r| r.mode == m).map(|r| r.gib_per_s).unwrap_or(f64::NAN);
    let (raw, framed, encrypted) = (speed(Mode::Raw), speed(Mode::Framed), speed(Mode::Encrypted));
    let ratios = Ratios {
        framed_over_raw: framed / raw,
        mac_over_raw: speed(Mode::Mac) / raw,
        encrypted_over_raw: encrypted / raw,
        encryption_cost: 1.0 - encrypted / framed,
    };
    let target = 0.80;
    let report = Report {
        cpu: cpu_model(),
        frames_per_run: frames as u64,
        payload_bytes_per_frame: page as u64,
        payload_bytes_per_run: frames as u64 * page as u64,
        reps: args.reps,
        target_met: ratios.encrypted_over_raw >= target,
        ratios,
        target_encrypted_over_raw: target,
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

fn cpu_model() -> Option<String> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let line = info.lines().find(|l| l.starts_with("model name"))?;
    Some(line.split_once(':')?.1.trim().to_string())
}

fn print_report(r: &Report) {
    println!(
        "KV transfer, two processes over loopback TCP: {} frames of {} payload bytes ({:.1} MiB) per run, median of {}{}",
        r.frames_per_run,
        r.payload_bytes_per_frame,
        r.payload_bytes_per_run as f64 / (1u64 << 20) as f64,
        r.reps,
        r.cpu.as_deref().map(|c| format!(", on {c}")).unwrap_or_default(),
    );
    let raw = r.modes.iter().find(|m| m.mode == Mode::Raw).map(|m| m.gib_per_s).unwrap_or(f64::NAN);
    let busy = |c: Option<f64>| c.map(|c| format!("{:>4.0}%", 100.0 * c)).unwrap_or_else(|| "   ?".into());
    for m in &r.modes {
        let verified = match (m.frames_verified, m.frames_sent) {
            (Some(v), Some(sent)) => format!("   {v}/{sent} frames verified"),
            _ => String::new(),
        };
        println!(
            "  {:<22} {:>6.2} GiB/s  {:>6.1}% of raw   CPU busy: sender {}, receiver {}{verified}",
            m.mode.label(),
            m.gib_per_s,
            100.0 * m.gib_per_s / raw,
            busy(m.sender_cpu),
            busy(m.receiver_cpu),
        );
    }
    println!(
        "encrypted / raw {:.1}% (target >= {:.0}%: {}); encryption, authentication and checks cost {:.1}% of framed",
        100.0 * r.ratios.encrypted_over_raw,
        100.0 * r.target_encrypted_over_raw,
        if r.target_met { "met" } else { "missed" },
        100.0 * r.ratios.encryption_cost,
    );
    let p = &r.in_process;
    println!(
        "one core: KV frames sealed {:.2} GiB/s, opened {:.2} GiB/s (AEGIS-128X2 bodies); AES-256-GCM records \
         {:.2} GiB/s; keyed BLAKE3 (v1 MAC) {:.2} GiB/s; Noise handshake {:.0} us (both ends)",
        p.seal_gib_per_s, p.open_gib_per_s, p.aes_gcm_gib_per_s, p.blake3_mac_gib_per_s, p.handshake_us
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
    fn new(stream: TcpStream, frames: u32, g: &Geometry) -> Result<Self> {
        let replies = BufReader::new(stream.try_clone()?);
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
    fn run(&mut self, mode: Mode, run: u64, g: &Geometry) -> Result<(f64, Option<u64>, Reply)> {
        let p = plan(self.frames, run, g)?;
        let mut header = [0u8; 13];
        header[0] = mode.code();
        header[1..5].copy_from_slice(&self.frames.to_le_bytes());
        header[5..].copy_from_slice(&run.to_le_bytes());
        let cpu0 = thread_cpu_ns();
        let t0 = Instant::now();
        self.stream.write_all(&header)?;
        let n = self.sources.len();
        let mut helper_cpu = Some(0);
        match mode {
            Mode::Raw => {
                for i in 0..self.frames as usize {
                    self.stream.write_all(&self.sources[i % n])?;
                }
            }
            Mode::Framed => {
                for i in 0..self.frames as usize {
                    self.stream.write_all(&self.framed[i % n])?;
                }
                self.stream.write_all(&self.framed_close)?;
            }
            Mode::Mac => {
                for seq in 0..self.frames {
                    let (t0, t1) = (seq * g.page_size, (seq + 1) * g.page_size);
                    let body = &self.sources[seq as usize % n];
                    let head = mac_head(1, seq, seq, t0..t1, body.len());
                    let tag = mac_of(&head, body);
                    write_all_vectored(&mut self.stream, [&head, body, &tag])?;
                }
                let body = close_body(&close_of(&p));
                let head = mac_head(2, self.frames, 0, 0..0, body.len());
                let tag = mac_of(&head, &body);
                write_all_vectored(&mut self.stream, [&head, &body, &tag])?;
            }
            Mode::Encrypted => helper_cpu = self.send_encrypted(&p, g)?,
        }
        self.stream.flush()?;
        let mut line = String::new();
        self.replies.read_line(&mut line).context("reading the receiver's reply")?;
        let secs = t0.elapsed().as_secs_f64();
        let cpu = thread_cpu_ns().zip(cpu0).map(|(b, a)| b.saturating_sub(a)).zip(helper_cpu).map(|(a, b)| a + b);
        let reply: Reply = serde_json::from_str(&line).with_context(|| format!("receiver replied {line:?}"))?;
        if !reply.ok {
            bail!("receiver refused the {mode:?} run: {}", reply.error.as_deref().unwrap_or("?"));
        }
        Ok((secs, cpu, reply))
    }

    /// A fresh link (a real Noise handshake), then every page copied out of its source, sealed
    /// in place and handed to a writer thread, which writes it while the next one is sealed.
    /// Returns the writer thread's CPU time.
    fn send_encrypted(&mut self, p: &Plan, g: &Geometry) -> Result<Option<u64>> {
        let (init, hello) = Initiator::start(&ClusterSecret::from_bytes(BENCH_SECRET), Role::Prefill)?;
        self.stream.write_all(&hello.encode())?;
        let reply = read_handshake(&mut self.replies)?;
        let (keys, _) = init.on_reply(&reply)?;
        let mut sealer = KvSealer::new(keys, DEFAULT_MAX_FRAME)?;
        let (tx, rx) = mpsc::sync_channel::<Outgoing>(2);
        let (recycle, recycled) = mpsc::channel::<Vec<u8>>();
        let mut out = self.stream.try_clone()?;
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
        let cpu = writer.join().map_err(|_| anyhow::anyhow!("the writer thread panicked"))??;
        if let Some(why) = failed {
            bail!("{why}");
        }
        Ok(cpu)
    }
}

fn mac_head(kind: u32, seq: u32, page: u32, tokens: std::ops::Range<u32>, body: usize) -> [u8; MAC_HEAD] {
    let mut h = [0u8; MAC_HEAD];
    let len = (MAC_HEAD - 4 + body + MAC_TAG) as u32;
    for (i, v) in [len, kind, seq, page, tokens.start, tokens.end].into_iter().enumerate() {
        h[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
    }
    h
}

fn mac_of(head: &[u8], body: &[u8]) -> [u8; MAC_TAG] {
    let mut h = blake3::Hasher::new_keyed(&BENCH_MAC_KEY);
    h.update(head);
    h.update(body);
    *h.finalize().as_bytes()
}

fn close_body(c: &CloseFrame) -> [u8; CLOSE_BODY] {
    let mut b = [0u8; CLOSE_BODY];
    b[..4].copy_from_slice(&c.tokens.to_le_bytes());
    b[4..36].copy_from_slice(&c.prompt_digest.0);
    b[36..].copy_from_slice(&c.first_token.to_le_bytes());
    b
}

fn read_handshake(r: &mut impl Read) -> Result<HandshakeMsg> {
    let mut buf = [0u8; MAX_HANDSHAKE_MSG];
    r.read_exact(&mut buf[..4])?;
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    let all = buf.get_mut(..4 + len).context("handshake message too long")?;
    r.read_exact(&mut all[4..])?;
    Ok(HandshakeMsg::decode(all)?)
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

/// The receiving process: serves runs until the sender closes the connection.
fn sink(addr: &str) -> Result<()> {
    let mut stream = configure(TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?)?;
    let g = geometry()?;
    let page = payload_len(&g)?;
    // Sized for the largest frame accepted, so no frame is refused for buffer space.
    let mut buf = vec![0u8; DEFAULT_MAX_FRAME];
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
        let result = receive(&mut stream, &mut buf, mode, frames, run, &g, page);
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
fn receive(
    stream: &mut TcpStream,
    buf: &mut [u8],
    mode: Mode,
    frames: u32,
    run: u64,
    g: &Geometry,
    page: usize,
) -> Result<(u64, u64)> {
    let max = DEFAULT_MAX_FRAME;
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
            let (reply, keys, _) =
                Responder::on_hello(&[ClusterSecret::from_bytes(BENCH_SECRET)], Role::Decode, &hello)?;
            stream.write_all(&reply.encode())?;
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
    fn open<'a>(&mut self, frame: &'a mut [u8], g: &Geometry) -> Result<FrameRef<'a>> {
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
) -> Result<(u64, u64)> {
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
                ensure!(done.frames() == frames, "completed after {} of {frames} KV frames", done.frames());
                return Ok((count, bytes));
            }
        }
    }
}

/// Checks a `mac` mode frame's MAC (constant time) and parses it.
fn open_mac<'a>(frame: &'a [u8], ticket: TicketId, g: &Geometry) -> Result<FrameRef<'a>> {
    ensure!(frame.len() >= MAC_HEAD + MAC_TAG, "short frame");
    let (signed, tag) = frame.split_at(frame.len() - MAC_TAG);
    let expected = blake3::keyed_hash(&BENCH_MAC_KEY, signed);
    let tag: [u8; MAC_TAG] = tag.try_into()?;
    ensure!(expected == blake3::Hash::from_bytes(tag), "MAC check failed");
    let field = |i: usize| u32::from_le_bytes([signed[i * 4], signed[i * 4 + 1], signed[i * 4 + 2], signed[i * 4 + 3]]);
    let (kind, seq, page, t0, t1) = (field(1), field(2), field(3), field(4), field(5));
    let body = &signed[MAC_HEAD..];
    let body = match kind {
        1 => FrameBodyRef::Kv(KvFrameRef { page_index: page, layers: 0..g.n_layers, tokens: t0..t1, payload: body }),
        2 => {
            ensure!(body.len() == CLOSE_BODY, "bad close");
            let mut digest = [0u8; 32];
            digest.copy_from_slice(&body[4..36]);
            let word = |at: usize| u32::from_le_bytes([body[at], body[at + 1], body[at + 2], body[at + 3]]);
            FrameBodyRef::Close(CloseFrame {
                tokens: word(0),
                prompt_digest: PromptDigest(digest),
                first_token: word(36),
            })
        }
        _ => bail!("unknown kind {kind}"),
    };
    Ok(FrameRef { ticket, seq, body })
}

/// Reads one length-prefixed frame into `buf`; the slice holding it.
fn read_frame<'b>(stream: &mut TcpStream, buf: &'b mut [u8], max: usize) -> Result<&'b mut [u8]> {
    let prefix = buf.get_mut(..4).context("buffer")?;
    stream.read_exact(prefix)?;
    let total = (u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize).saturating_add(4);
    ensure!(total <= max, "frame of {total} bytes over the maximum {max}");
    let frame = buf.get_mut(..total).context("frame larger than the buffer")?;
    stream.read_exact(frame.get_mut(4..).context("frame shorter than its prefix")?)?;
    Ok(frame)
}

/// Single-core costs of the pieces, for reading the two-process figures.
fn in_process(sources: &[Vec<u8>], g: &Geometry) -> Result<InProcess> {
    let p = plan(sources.len() as u32, 0, g)?;
    let id = p.ticket.id();
    let bytes: usize = sources.iter().map(Vec::len).sum();
    let gib = |secs: f64| bytes as f64 / secs / (1u64 << 30) as f64;
    let (mut seal, mut open, mut mac, mut gcm) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for rep in 0..5u8 {
        let keys = SessionKeys::from_split(true, &[rep; 32], &[rep ^ 0xff; 32], b"bench");
        let mut opener = KvOpener::new(keys.peer_view(), DEFAULT_MAX_FRAME)?;
        let mut sealer = KvSealer::new(keys, DEFAULT_MAX_FRAME)?;
        let mut bufs: Vec<Vec<u8>> = sources.to_vec();
        let t0 = Instant::now();
        let parts = bufs
            .iter_mut()
            .enumerate()
            .map(|(i, b)| {
                let i = i as u32;
                let tokens = i * g.page_size..(i + 1) * g.page_size;
                sealer.seal_kv(&id, i, KvFrameMut { page_index: i, layers: 0..g.n_layers, tokens, payload: b })
            })
            .collect::<Result<Vec<_>, _>>()?;
        seal.push(gib(t0.elapsed().as_secs_f64()));
        let mut frames: Vec<Vec<u8>> = parts.iter().zip(&bufs).map(|(p, b)| p.to_vec(b)).collect();
        let held = |_: &TicketNonce| true;
        let t0 = Instant::now();
        for f in &mut frames {
            std::hint::black_box(opener.open(f, &held)?.seq);
        }
        open.push(gib(t0.elapsed().as_secs_f64()));
        let t0 = Instant::now();
        for s in sources {
            std::hint::black_box(blake3::keyed_hash(&BENCH_MAC_KEY, s));
        }
        mac.push(gib(t0.elapsed().as_secs_f64()));
        let (mut records, _, _) = SessionKeys::from_split(true, &[rep; 32], &[rep; 32], b"gcm").into_parts()?;
        let mut bufs: Vec<Vec<u8>> = sources.to_vec();
        let t0 = Instant::now();
        for b in &mut bufs {
            std::hint::black_box(records.seal(b"", b)?);
        }
        gcm.push(gib(t0.elapsed().as_secs_f64()));
    }
    let mut hs = Vec::new();
    let secret = ClusterSecret::from_bytes(BENCH_SECRET);
    for _ in 0..21 {
        let t0 = Instant::now();
        let (init, hello) = Initiator::start(&secret, Role::Prefill)?;
        let (reply, _, _) = Responder::on_hello(std::slice::from_ref(&secret), Role::Decode, &hello)?;
        std::hint::black_box(init.on_reply(&reply)?);
        hs.push(t0.elapsed().as_secs_f64() * 1e6);
    }
    Ok(InProcess {
        seal_gib_per_s: median_or_nan(&seal),
        open_gib_per_s: median_or_nan(&open),
        aes_gcm_gib_per_s: median_or_nan(&gcm),
        blake3_mac_gib_per_s: median_or_nan(&mac),
        handshake_us: median_or_nan(&hs),
    })
}
