//! A TCP relay on a cluster link, where an on-path observer or attacker sits: it records every
//! byte in both directions and can flip a bit in one unit. Every unit on a node link is
//! length-prefixed (handshake messages, control records, KV frames), so the relay forwards
//! whole units and counts them.

use std::io::Write;
use std::net::{Shutdown, TcpStream};

use audit::relay::read_unit;
use std::sync::{Arc, Mutex};

/// Which way a unit travels: from the dialling node to the listening one, or back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    Up,
    Down,
}

/// The bytes of one relayed connection.
#[derive(Default, Clone)]
pub struct Capture {
    pub up: Vec<u8>,
    pub down: Vec<u8>,
}

#[derive(Default)]
struct State {
    upstream: Option<String>,
    conns: Vec<Arc<Mutex<Capture>>>,
    /// Flip a bit in this unit (direction, index from the connection's start) of the next
    /// connection only.
    tamper: Option<(Dir, usize)>,
}

pub struct Relay {
    pub addr: String,
    state: Arc<Mutex<State>>,
}

fn pump(mut from: TcpStream, mut to: TcpStream, log: Arc<Mutex<Capture>>, dir: Dir, flip: Option<usize>) {
    let mut i = 0;
    while let Some(mut u) = read_unit(&mut from) {
        if flip == Some(i) {
            let n = u.len();
            u[n / 2] ^= 0x10;
        }
        {
            let mut c = log.lock().unwrap();
            match dir {
                Dir::Up => c.up.extend_from_slice(&u),
                Dir::Down => c.down.extend_from_slice(&u),
            }
        }
        if to.write_all(&u).is_err() {
            break;
        }
        i += 1;
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl Relay {
    /// A relay whose upstream is set later ([`Relay::set_upstream`]).
    pub fn start() -> Relay {
        let state = Arc::new(Mutex::new(State::default()));
        let st = state.clone();
        let addr = audit::relay::listen(move |client| {
            let (upstream, log, tamper) = {
                let mut s = st.lock().unwrap();
                let log = Arc::new(Mutex::new(Capture::default()));
                s.conns.push(log.clone());
                (s.upstream.clone(), log, s.tamper.take())
            };
            let Some(Ok(server)) = upstream.map(TcpStream::connect) else { return };
            let flip = |d| tamper.filter(|(td, _)| *td == d).map(|(_, i)| i);
            let (c2, s2) = (client.try_clone().unwrap(), server.try_clone().unwrap());
            let (log2, up_flip, down_flip) = (log.clone(), flip(Dir::Up), flip(Dir::Down));
            std::thread::spawn(move || pump(s2, c2, log2, Dir::Down, down_flip));
            pump(client, server, log, Dir::Up, up_flip);
        })
        .unwrap();
        Relay { addr, state }
    }

    pub fn set_upstream(&self, upstream: &str) {
        self.state.lock().unwrap().upstream = Some(upstream.to_string());
    }

    /// Flips a bit in unit `unit` travelling `dir` on the next connection.
    pub fn tamper_next(&self, dir: Dir, unit: usize) {
        self.state.lock().unwrap().tamper = Some((dir, unit));
    }

    /// Every connection relayed so far, in order.
    pub fn captures(&self) -> Vec<Capture> {
        self.state.lock().unwrap().conns.iter().map(|c| c.lock().unwrap().clone()).collect()
    }

    /// All bytes relayed so far, both directions.
    pub fn all_bytes(&self) -> Vec<u8> {
        self.captures().into_iter().flat_map(|c| c.up.into_iter().chain(c.down)).collect()
    }
}
