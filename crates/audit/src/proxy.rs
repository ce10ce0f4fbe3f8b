//! A fault-injecting proxy for the KV path (prefill → decode), used by `audit --spawn`. It has
//! no secret: it relays each connection's handshake untouched, then corrupts, drops,
//! duplicates, reorders, delays or stalls KV frames. Whatever it does may fail requests; the
//! audit checks that it never makes one tenant's data reach another.

use std::io::Write;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::relay::{listen, read_unit};

/// What the proxy does to one transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    Corrupt,
    Drop,
    Duplicate,
    Reorder,
    Delay,
    Stall,
}

impl Fault {
    pub fn parse(s: &str) -> Option<Fault> {
        Some(match s {
            "corrupt" => Fault::Corrupt,
            "drop" => Fault::Drop,
            "duplicate" => Fault::Duplicate,
            "reorder" => Fault::Reorder,
            "delay" => Fault::Delay,
            "stall" => Fault::Stall,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Fault::Pass => "pass",
            Fault::Corrupt => "corrupt",
            Fault::Drop => "drop",
            Fault::Duplicate => "duplicate",
            Fault::Reorder => "reorder",
            Fault::Delay => "delay",
            Fault::Stall => "stall",
        }
    }
}

/// Picks the fault of each transfer.
pub type Chooser = Box<dyn FnMut() -> Fault + Send>;

struct State {
    upstream: String,
    choose: Chooser,
    log: Vec<String>,
}

#[derive(Clone)]
pub struct Proxy {
    pub addr: String,
    state: Arc<Mutex<State>>,
}

/// How long a stalled transfer holds its connection (the decode worker's transfer timeout ends
/// the route first).
const STALL: Duration = Duration::from_secs(20);

impl Proxy {
    pub fn start(upstream: String, choose: Chooser) -> std::io::Result<Proxy> {
        let state = Arc::new(Mutex::new(State { upstream, choose, log: Vec::new() }));
        let st = state.clone();
        let addr = listen(move |from| relay(from, &st))?;
        Ok(Proxy { addr, state })
    }

    /// Points the proxy at a restarted decode worker.
    pub fn set_upstream(&self, upstream: String) {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).upstream = upstream;
    }

    /// The faults applied so far, one line each.
    pub fn log(&self) -> Vec<String> {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).log.clone()
    }
}

fn relay(mut from: TcpStream, st: &Mutex<State>) {
    let (upstream, fault) = {
        let mut s = st.lock().unwrap_or_else(|e| e.into_inner());
        let f = (s.choose)();
        (s.upstream.clone(), f)
    };
    let Some(mut to) = crate::relay::splice(&mut from, &upstream) else { return };
    if fault != Fault::Pass {
        st.lock().unwrap_or_else(|e| e.into_inner()).log.push(format!("kv transfer to {upstream}: {}", fault.name()));
    }
    // Frames are forwarded as they come, except around the one the fault touches (the second).
    let mut held: Option<Vec<u8>> = None;
    let mut i = 0usize;
    while let Some(mut u) = read_unit(&mut from) {
        let out: Vec<Vec<u8>> = match (fault, i) {
            (Fault::Corrupt, 1) => {
                let n = u.len();
                u[n / 2] ^= 0x40;
                vec![u]
            }
            (Fault::Drop, 1) => vec![],
            (Fault::Duplicate, 1) => vec![u.clone(), u],
            (Fault::Reorder, 1) => {
                held = Some(u);
                vec![]
            }
            (Fault::Reorder, 2) => vec![u, held.take().unwrap_or_default()],
            (Fault::Delay, 1) => {
                std::thread::sleep(Duration::from_millis(300));
                vec![u]
            }
            (Fault::Stall, n) if n >= 1 => vec![],
            _ => vec![u],
        };
        for o in out.iter().filter(|o| !o.is_empty()) {
            if to.write_all(o).is_err() {
                // The receiver gave up; drain the sender so it sees a completed send.
                while read_unit(&mut from).is_some() {}
                return;
            }
        }
        i += 1;
    }
    if let Some(h) = held {
        let _ = to.write_all(&h);
    }
    if fault == Fault::Stall {
        std::thread::sleep(STALL);
    }
    let _ = to.shutdown(Shutdown::Write);
}
