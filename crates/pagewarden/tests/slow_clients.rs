#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Hostile clients on the API port, from one address (127.0.0.2) while real clients use
//! another (127.0.0.1): a thousand sending their request heads a byte at a time, and a thousand
//! connecting to the HTTPS port and sending nothing. The server keeps answering the real
//! clients at once, holds at most its per-address cap of the hostile ones, and closes those
//! by its deadlines, with the shipped defaults.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

const HOSTILE: usize = 1000;
/// The shipped `[limits] max_connections_per_address` and `header_timeout_ms`.
const CAP: usize = 256;
const HEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// gateway::tls::HANDSHAKE_TIMEOUT.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const BYTE_EVERY: Duration = Duration::from_secs(2);

/// Two thousand sockets in this process (and the server's share): more than a default soft
/// limit of 1024 descriptors.
fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < 4096 {
            lim.rlim_cur = lim.rlim_max.min(4096);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    assert!(lim.rlim_cur as usize > 2 * HOSTILE + 100, "the descriptor limit {} is too low for the test", lim.rlim_cur);
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// A connection to `to` from 127.0.0.2 (Linux routes all of 127/8 to loopback).
async fn connect_from_second_address(to: SocketAddr) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
    sock.connect(to).await.unwrap()
}

/// Sends a request head that never ends, one byte every [`BYTE_EVERY`]; returns how long after
/// `t0` the server closed the connection.
async fn trickle_headers(mut s: TcpStream, t0: Instant) -> Duration {
    let head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    let endless = b"X-Slow: yes\r\n";
    let mut buf = [0u8; 512];
    for i in 0.. {
        let byte = if i < head.len() { head[i] } else { endless[(i - head.len()) % endless.len()] };
        tokio::select! {
            r = s.read(&mut buf) => match r {
                // A 408 or the like before the close: read on to the end.
                Ok(n) if n > 0 => continue,
                _ => return t0.elapsed(),
            },
            _ = tokio::time::sleep(BYTE_EVERY) => {
                if s.write_all(&[byte]).await.is_err() {
                    return t0.elapsed();
                }
            }
        }
    }
    unreachable!()
}

/// Makes one request and then keeps the connection idle; returns how long after the response
/// the server closed it.
async fn idle_after_one_request(to: SocketAddr) -> Duration {
    let mut s = TcpStream::connect(to).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await.unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{}", String::from_utf8_lossy(&buf[..n]));
    let answered = Instant::now();
    while s.read(&mut buf).await.is_ok_and(|n| n > 0) {}
    answered.elapsed()
}

/// Sends nothing; returns how long after `t0` the server closed the connection.
async fn stay_silent(mut s: TcpStream, t0: Instant) -> Duration {
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf).await {
            Ok(n) if n > 0 => continue,
            _ => return t0.elapsed(),
        }
    }
}

/// When each of the clients' connections was closed; fails for one still open after 60 s.
async fn closed_within_a_minute(clients: Vec<tokio::task::JoinHandle<Duration>>, what: &str) -> Vec<Duration> {
    let mut out = Vec::new();
    for t in clients {
        let closed = tokio::time::timeout(Duration::from_secs(60), t).await;
        out.push(closed.unwrap_or_else(|_| panic!("a {what} client still connected after 60 s")).unwrap());
    }
    out
}

fn summary(closed: &[Duration]) -> (usize, Duration) {
    let at_once = closed.iter().filter(|d| **d < Duration::from_secs(1)).count();
    (at_once, closed.iter().copied().max().unwrap_or_default())
}

#[test]
fn a_thousand_clients_trickling_headers_from_one_address_are_capped_and_closed_and_others_are_served_at_once() {
    raise_fd_limit();
    let server = common::Server::start(&[]);
    let addr: SocketAddr = server.url.trim_start_matches("http://").parse().unwrap();
    let rt = runtime();
    let kept_alive = rt.spawn(idle_after_one_request(addr));
    let t0 = Instant::now();
    let hostile: Vec<_> = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..HOSTILE {
            let s = connect_from_second_address(addr).await;
            tasks.push(tokio::spawn(trickle_headers(s, Instant::now())));
        }
        tasks
    });
    println!("{HOSTILE} slow clients connected in {:?}", t0.elapsed());
    std::thread::sleep(BYTE_EVERY * 2);

    // Real requests from 127.0.0.1 while the slow ones hold every connection their address may.
    let agent = launch::agent(Duration::from_secs(30));
    let t = Instant::now();
    let mut r = agent
        .get(format!("{}/v1/models", server.url))
        .header("Authorization", format!("Bearer {}", server.key))
        .call()
        .unwrap();
    let models_took = t.elapsed();
    assert_eq!(r.status(), 200, "{}", r.body_mut().read_to_string().unwrap_or_default());
    assert!(models_took < Duration::from_secs(1), "GET /v1/models took {models_took:?} under the flood");
    let t = Instant::now();
    let (status, body) = server.post("/v1/chat/completions", &common::chat("Say hi.", 4));
    println!("under the flood: GET /v1/models in {models_took:?}, a 4-token chat completion in {:?}", t.elapsed());
    assert_eq!(status, 200, "{body}");

    let closed = rt.block_on(closed_within_a_minute(hostile, "slow"));
    let (at_once, last) = summary(&closed);
    println!("slow clients: {at_once} closed at once (over the cap), the last of the others after {last:?}");
    assert!(at_once >= HOSTILE - CAP, "only {at_once} of {HOSTILE} were refused over the cap of {CAP}");
    assert!(
        last >= HEADER_TIMEOUT - Duration::from_secs(1) && last < HEADER_TIMEOUT + BYTE_EVERY * 3,
        "the last slow client was closed after {last:?}"
    );
    // The same deadline ends a kept-alive connection left idle after its response.
    let idle = rt.block_on(kept_alive).unwrap();
    println!("an idle kept-alive connection was closed {idle:?} after its response");
    assert!(
        idle >= HEADER_TIMEOUT - Duration::from_secs(1) && idle < HEADER_TIMEOUT + Duration::from_secs(3),
        "{idle:?}"
    );

    // Once they are gone the address may connect again.
    let t = Instant::now();
    let s = rt.block_on(connect_from_second_address(addr));
    drop(s);
    let mut r = agent.get(format!("{}/health", server.url)).call().unwrap();
    assert_eq!(r.status(), 200, "{}", r.body_mut().read_to_string().unwrap_or_default());
    assert!(t.elapsed() < Duration::from_secs(1));
}

/// A self-signed certificate for 127.0.0.1 and its key, by the `openssl` command.
fn self_signed(dir: &Path) {
    let out = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout"])
        .arg(dir.join("key.pem"))
        .arg("-out")
        .arg(dir.join("cert.pem"))
        .output()
        .expect("the openssl command");
    assert!(out.status.success(), "openssl req: {}", String::from_utf8_lossy(&out.stderr));
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.join("key.pem"), std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `GET /health` over TLS from 127.0.0.1 with `openssl s_client`: the response text.
fn health_over_tls(addr: SocketAddr) -> String {
    use std::io::Write;
    let mut child = Command::new("openssl")
        .args(["s_client", "-quiet", "-verify_quiet", "-connect", &addr.to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("openssl s_client");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_thousand_silent_connections_from_one_address_hold_no_tls_handshake_of_another() {
    raise_fd_limit();
    let (dir, key) = common::Server::configure(&[]);
    self_signed(&dir);
    let config = dir.join("pagewarden.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let tls = format!(
        "[tls]\ncert_file = \"{}\"\nkey_file = \"{}\"\n",
        dir.join("cert.pem").display(),
        dir.join("key.pem").display()
    );
    std::fs::write(&config, format!("{text}\n{tls}")).unwrap();
    let server = common::Server::start_with(dir, key);
    let addr: SocketAddr = server.url.trim_start_matches("https://").parse().unwrap();
    let rt = runtime();
    let hostile: Vec<_> = rt.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..HOSTILE {
            let s = connect_from_second_address(addr).await;
            tasks.push(tokio::spawn(stay_silent(s, Instant::now())));
        }
        tasks
    });
    std::thread::sleep(Duration::from_secs(1));

    let t = Instant::now();
    let response = health_over_tls(addr);
    let took = t.elapsed();
    println!("under {HOSTILE} silent connections: a TLS handshake and GET /health in {took:?}");
    assert!(response.starts_with("HTTP/1.1 200"), "{response}");
    assert!(took < Duration::from_secs(1), "the handshake and request took {took:?}");

    let closed = rt.block_on(closed_within_a_minute(hostile, "silent"));
    let (at_once, last) = summary(&closed);
    println!("silent clients: {at_once} closed at once (over the cap), the last of the others after {last:?}");
    assert!(at_once >= HOSTILE - CAP, "only {at_once} of {HOSTILE} were refused over the cap of {CAP}");
    assert!(last < HANDSHAKE_TIMEOUT + Duration::from_secs(3), "the last silent client was closed after {last:?}");
}
