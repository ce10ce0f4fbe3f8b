//! `pagewarden bench transfer`: KV transfer throughput between two processes over loopback TCP,
//! raw bytes against pagewarden frames: unprotected, MAC'd only (wire version 1), and
//! encrypted (version 3, what nodes run), side by side in one run.
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
//! * `encrypted`: version 3 as the workers run it: a Noise handshake per run (a fresh link),
//!   then each page encrypted out of its source into a send buffer in one pass
//!   (`KvSealer::seal_kv_into`) and written vectored by a second thread while the next page
//!   is sealed; the receiver opens each frame in place (`KvOpener::open`) and checks it against
//!   its reservation (`Transfer::receive_ref`), up to the close and `Received::Complete`.
//!
//! Neither end writes payloads into KV pages: that copy is the same whatever the framing.
//! Modes alternate within each round so that noise hits them alike; medians are reported. Each
//! end also reports the CPU time of its threads (Linux), to show which end is the bottleneck.

use std::io::ErrorKind;
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use audit::stats::median_or_nan;
use clap::Args;
use serde::Serialize;
use wire::{
    ClusterSecret, Geometry, Initiator, KvFrameMut, KvOpener, KvSealer, Responder, Role, SessionKeys, TicketNonce,
    DEFAULT_MAX_FRAME,
};

use crate::ToolError;

/// Ends the run with [`ToolError::Transfer`]: the other process, or a frame, broke the protocol.
macro_rules! fail {
    ($($why:tt)*) => {
        return Err(crate::ToolError::Transfer(format!($($why)*)))
    };
}

/// [`fail!`] unless `cond` holds.
macro_rules! check {
    ($cond:expr, $($why:tt)*) => {
        if !$cond {
            fail!($($why)*);
        }
    };
}

mod protocol;
mod sender;
mod sink;

use protocol::*;
use sender::{sender_sources, Sender};
use sink::sink;

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

pub fn run(args: &TransferArgs) -> Result<(), ToolError> {
    match &args.sink {
        Some(addr) => sink(addr),
        None => bench(args),
    }
}

/// Kills the receiver if the bench ends early, so no process outlives it.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn bench(args: &TransferArgs) -> Result<(), ToolError> {
    check!(args.mib >= 1 && args.reps >= 1, "--mib and --reps must be at least 1");
    let chosen = args.modes.iter().map(|m| Mode::parse(m)).collect::<Result<Vec<_>, _>>()?;
    let g = geometry()?;
    let page = payload_len(&g)?;
    let frames =
        u32::try_from((args.mib << 20).div_ceil(page)).map_err(|_| ToolError::Usage("--mib too large".into()))?;

    let listener = TcpListener::bind("127.0.0.1:0").map_err(ToolError::Link)?;
    let addr = listener.local_addr().map_err(ToolError::Link)?;
    let exe = std::env::current_exe().map_err(ToolError::process("locating the pagewarden executable"))?;
    let child = Command::new(exe)
        .args(["bench", "transfer", "--sink", &addr.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(ToolError::process("starting the receiving process"))?;
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
        println!("{}", serde_json::to_string_pretty(&report).map_err(ToolError::json("serialising the report"))?);
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

fn accept_within(listener: &TcpListener, child: &mut Child, limit: Duration) -> Result<TcpStream, ToolError> {
    listener.set_nonblocking(true).map_err(ToolError::Link)?;
    let deadline = Instant::now() + limit;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).map_err(ToolError::Link)?;
                return configure(stream);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().map_err(ToolError::Link)? {
                    fail!("the receiving process exited before connecting ({status})");
                }
                check!(Instant::now() < deadline, "the receiving process did not connect within {limit:?}");
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(ToolError::Link(e)),
        }
    }
}

fn wait_within(child: &mut Child, limit: Duration) -> Result<(), ToolError> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().map_err(ToolError::Link)? {
            check!(status.success(), "the receiving process failed ({status})");
            return Ok(());
        }
        check!(Instant::now() < deadline, "the receiving process did not exit within {limit:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Single-core costs of the pieces, for reading the two-process figures.
fn in_process(sources: &[Vec<u8>], g: &Geometry) -> Result<InProcess, ToolError> {
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
    let key = protocol::bench_node_key()?;
    for _ in 0..21 {
        let t0 = Instant::now();
        let (init, hello) = Initiator::start(&secret, &key, Role::Prefill)?;
        let (reply, _, _, _) =
            Responder::on_hello(std::slice::from_ref(&secret), &key, Role::Decode, &hello, &protocol::bench_trusts)?;
        std::hint::black_box(init.on_reply(&reply, &protocol::bench_trusts)?);
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
