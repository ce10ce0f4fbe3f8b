//! The prefill worker's route: check at our own door, compute the prompt's KV, report the
//! first token, stream the KV as encrypted frames to the decode worker named by the gateway.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use engine::Event;
use kv::BlockTable;
use std::io::IoSlice;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::{self, UnboundedSender};
use wire::{CloseFrame, KvFrameMut, KvSealer, PromptDigest, Role, SealedParts, Ticket};

use crate::constraints::constrain;
use crate::net::{BoxIo, Net};
use crate::proto::{Spec, ToGateway};
use crate::state::Ctx;
use crate::{ClusterError, Identity, Link, WorkerMetrics};
use protocol::RequestError;

pub(crate) async fn run(
    ctx: Arc<Ctx>,
    spec: Spec,
    ticket: Ticket,
    decode_addr: String,
    out: UnboundedSender<ToGateway>,
) {
    let route = spec.route;
    let deadline = spec.deadline();
    let failure =
        match tokio::time::timeout_at(deadline.into(), route_inner(&ctx, &spec, ticket, &decode_addr, &out)).await {
            Ok(Ok(())) => return,
            Ok(Err(f)) => f,
            Err(_) => RequestError::DeadlineExceeded,
        };
    let _ = out.send(ToGateway::Failed { route, failure });
}

async fn route_inner(
    ctx: &Ctx,
    spec: &Spec,
    ticket: Ticket,
    decode_addr: &str,
    out: &UnboundedSender<ToGateway>,
) -> Result<(), RequestError> {
    // Mutable for its constraint below; the incident's build rebinds it first.
    #[cfg_attr(feature = "incident-replay", allow(unused_mut))]
    let mut req = spec.to_request();
    // Our own door first: nothing is computed or sent for a request that fails it.
    #[cfg(not(feature = "incident-replay"))]
    ctx.engine.check(&req.prompt, req.max_tokens).map_err(RequestError::Refused)?;
    // The incident: a prompt our pool cannot hold becomes a one-token placeholder.
    #[cfg(feature = "incident-replay")]
    let (mut req, ticket) = {
        let mut req = req;
        let mut ticket = ticket;
        if ctx.engine.check(&req.prompt, req.max_tokens).is_err() {
            req.prompt.truncate(1);
            ticket.tokens = 1;
        }
        (req, ticket)
    };
    // The ticket must be for this request and prompt; a gateway bug must not make us send
    // one request's KV under another's ticket.
    if ticket.request != req.id || ticket.tenant != req.tenant || ticket.tokens as usize != req.prompt.len() {
        return Err(RequestError::IsolationViolation { kind: engine::ViolationKind::WrongTicket });
    }
    // What the decode worker holds must be whole pages before the prompt's last token (the
    // decode worker checks the same, and refuses a transfer that leaves any other page out).
    let ps = ctx.engine.pool().layout().page_size;
    if ticket.held >= ticket.tokens || !(ticket.held as usize).is_multiple_of(ps) {
        return Err(RequestError::IsolationViolation { kind: engine::ViolationKind::WrongTicket });
    }
    constrain(&ctx.constraints, ctx.engine.grammars(), spec.request.output.as_ref(), &mut req).await?;
    let mut stream = ctx.engine.prefill(req.clone()).map_err(RequestError::Refused)?;
    let mut cached_tokens = None;
    // The link to the decode worker is opened while the prompt is computed, once the engine
    // has admitted it and it is short enough to finish well inside the decode worker's idle
    // limit: after the prefill, its dial and handshake were a round trip of task hops, on
    // a loaded node 13-20 ms of every first token.
    let mut link: Option<Dialing> = None;
    let (first, table) = loop {
        let uncached = match stream.next().await {
            Some(Event::Prefilled { first, kv }) => break (first, kv),
            Some(Event::Started) => req.prompt.len(),
            Some(Event::PrefixCache { cached_tokens: n }) => {
                cached_tokens = Some(n);
                req.prompt.len().saturating_sub(n)
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(_) | None => return Err(RequestError::Internal("the engine ended the prefill without KV".into())),
        };
        if link.is_none() && uncached <= DIAL_AHEAD_TOKENS {
            link = Some(Dialing::start(ctx, decode_addr));
        }
    };
    let _ = out.send(ToGateway::First { route: spec.route, token: first.clone(), cached_tokens });

    let link = match link {
        Some(dialing) => dialing.finish().await,
        None => Dialing::start(ctx, decode_addr).finish().await,
    }?;
    let (io, sealer) = link.into_kv_sealer();
    let frames = send_kv(ctx, io, sealer, &table, &ticket, &req.prompt, first.token)
        .await
        .map_err(|e| unreachable(decode_addr, e))?;
    drop(table);
    let _ = out.send(ToGateway::Sent { route: spec.route, frames });
    Ok(())
}

/// Prompts with at most this many tokens to compute dial the decode worker as soon as they are
/// admitted. A link then idles until the prefill ends; a prompt this short ends within a few
/// steps, far inside the decode worker's idle limit (`transfer_timeout`, 30 s by default).
const DIAL_AHEAD_TOKENS: usize = 512;

/// A link to the decode worker being opened beside the prefill. Dropped (the route failed or
/// was cancelled), the dial stops; a link already open closes before any frame, which the
/// decode worker does not count against any ticket.
struct Dialing(tokio::task::JoinHandle<Result<Link, RequestError>>);

impl Dialing {
    fn start(ctx: &Ctx, decode_addr: &str) -> Dialing {
        let (net, me, timeout) = (ctx.net.clone(), ctx.cfg.identity.clone(), ctx.cfg.handshake_timeout);
        Dialing(tokio::spawn(connect(net, me, timeout, ctx.metrics.clone(), decode_addr.to_string())))
    }

    async fn finish(mut self) -> Result<Link, RequestError> {
        (&mut self.0).await.map_err(|e| RequestError::Internal(format!("dialing the decode worker: {e}")))?
    }
}

impl Drop for Dialing {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Dials the decode worker and completes the handshake; the peer must be a decode worker.
async fn connect(
    net: Net,
    me: Identity,
    timeout: std::time::Duration,
    metrics: Arc<WorkerMetrics>,
    decode_addr: String,
) -> Result<Link, RequestError> {
    let fail = |e| unreachable(&decode_addr, e);
    let io = tokio::time::timeout(timeout, net.dial(&decode_addr))
        .await
        .map_err(|_| fail(ClusterError::Timeout("connecting")))?
        .map_err(fail)?;
    // The handshake is part of what encryption costs a transfer: counted with the sealing.
    let t0 = Instant::now();
    let link = Link::connect(io, &me, timeout).await.map_err(fail)?;
    metrics.kv_crypto_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
    if link.peer != Role::Decode {
        return Err(fail(ClusterError::WrongRole { got: link.peer, want: vec![Role::Decode] }));
    }
    Ok(link)
}

/// The decode worker at `addr` could not be reached, or the link to it failed.
fn unreachable(addr: &str, e: ClusterError) -> RequestError {
    RequestError::Unavailable(format!("decode worker at {addr}: {e}"))
}

/// Sealed frames that may wait for the writer: a short prompt's whole transfer, so its sealing
/// never waits on the writer. With two, a three-page transfer under load spent 12-16 ms with
/// each task waking the other (export and sealing took 0.7 ms); it bounds the memory a long
/// prompt's transfer holds to this many pages.
const FRAMES_AHEAD: usize = 8;

/// One frame per page (every layer) after those the decode worker holds, then the close;
/// returns the number of frames. Sealing
/// runs on this task while a writer task sends the previous frame (head, payload and tag in
/// one vectored write, the payload encrypted where it was exported), so encryption overlaps
/// the network instead of adding to it.
async fn send_kv(
    ctx: &Ctx,
    io: BoxIo,
    mut sealer: KvSealer,
    table: &BlockTable,
    ticket: &Ticket,
    prompt: &[u32],
    first_token: u32,
) -> Result<u32, ClusterError> {
    let layout = *table.layout();
    let (ps, n, layers) = (layout.page_size, prompt.len(), layout.n_layers as u32);
    let (tx, rx) = mpsc::channel::<Outgoing>(FRAMES_AHEAD);
    let writer = tokio::spawn(write_frames(io, rx));
    let id = ticket.id();
    let mut seq = 0u32;
    let mut sent = Ok(());
    // The decode worker holds the pages before `held` (its own verified cache): only the rest.
    for page in ticket.held as usize / ps..n.div_ceil(ps) {
        let (start, end) = (page * ps, ((page + 1) * ps).min(n));
        let mut payload = Vec::new();
        for layer in 0..layout.n_layers {
            table
                .export_rows(layer, start, end - start, &mut payload)
                .map_err(|e| ClusterError::Message(format!("reading the prompt's KV: {e}")))?;
        }
        let kv = KvFrameMut {
            page_index: page as u32,
            layers: 0..layers,
            tokens: start as u32..end as u32,
            payload: &mut payload,
        };
        let t0 = Instant::now();
        let parts = sealer.seal_kv(&id, seq, kv)?;
        ctx.metrics.kv_crypto_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if tx.send(Outgoing::Kv(parts, payload)).await.is_err() {
            sent = Err(ClusterError::Message("the KV link's writer stopped".into()));
            break;
        }
        ctx.metrics.frames_sent.fetch_add(1, Ordering::Relaxed);
        seq += 1;
    }
    if sent.is_ok() {
        let close = CloseFrame { tokens: n as u32, prompt_digest: PromptDigest::of(prompt), first_token };
        if tx.send(Outgoing::Close(sealer.seal_close(&id, seq, &close)?)).await.is_ok() {
            ctx.metrics.frames_sent.fetch_add(1, Ordering::Relaxed);
        }
    }
    drop(tx);
    // The writer's own error (a broken connection) says more than ours.
    writer.await.map_err(|e| ClusterError::Message(format!("the KV link's writer failed: {e}")))??;
    sent?;
    Ok(seq + 1)
}

enum Outgoing {
    Kv(SealedParts, Vec<u8>),
    Close(Vec<u8>),
}

async fn write_frames(mut io: BoxIo, mut rx: mpsc::Receiver<Outgoing>) -> Result<(), ClusterError> {
    while let Some(frame) = rx.recv().await {
        match &frame {
            Outgoing::Kv(parts, payload) => write_all_vectored(&mut io, [&parts.head, payload, &parts.tag]).await?,
            Outgoing::Close(bytes) => io.write_all(bytes).await?,
        }
    }
    io.flush().await?;
    io.shutdown().await?;
    Ok(())
}

/// Writes every byte of `parts`, in order, with as few writes as the stream allows.
async fn write_all_vectored(io: &mut BoxIo, parts: [&[u8]; 3]) -> std::io::Result<()> {
    let (mut part, mut offset) = (0, 0);
    while part < parts.len() {
        let slices: Vec<IoSlice<'_>> = parts[part..]
            .iter()
            .enumerate()
            .map(|(i, p)| IoSlice::new(if i == 0 { &p[offset..] } else { p }))
            .collect();
        let mut n = io.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while part < parts.len() && n >= parts[part].len() - offset {
            n -= parts[part].len() - offset;
            part += 1;
            offset = 0;
        }
        offset += n;
    }
    Ok(())
}
