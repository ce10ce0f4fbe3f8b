//! The decode worker's side of a route: reserve the whole sequence, hand out a ticket, accept
//! KV only through encrypted links with a prefill worker and only as frames that open under
//! that link's key for that ticket and pass the transfer checks against our own reservation
//! and the admitted prompt; decode only from a complete transfer. Anything else fails the
//! route, frees its pages and counts a violation.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use engine::{Event, ViolationKind};
use kv::BlockTable;
use tokio::io::AsyncReadExt;
use tokio::sync::mpsc::{self, UnboundedSender};
use wire::{FrameRef, Geometry, PageWrite, Received, Role, Ticket, TicketNonce, Transfer, WireError, HEADER_LEN};

use crate::constraints::constrain;
use crate::link::{refusal_reason, refuse_busy, HandshakeGate, HandshakePermit};
use crate::net::{BoxIo, Listener};
use crate::proto::{Spec, ToGateway};
use crate::state::Ctx;
use crate::tickets::{nonce_hex, Inbound};
use crate::{random, Link};
use protocol::RequestError;

pub(crate) async fn reserve(ctx: Arc<Ctx>, spec: Spec, out: UnboundedSender<ToGateway>) {
    let route = spec.route;
    let deadline = spec.deadline();
    let failure = match tokio::time::timeout_at(deadline.into(), route_inner(&ctx, &spec, &out)).await {
        Ok(Ok(())) => return,
        Ok(Err(f)) => f,
        Err(_) => RequestError::DeadlineExceeded,
    };
    if let RequestError::IsolationViolation { kind } = &failure {
        let kind = *kind;
        ctx.metrics.violation(kind);
        tracing::error!(
            worker = %ctx.cfg.name,
            kind = %kind,
            route,
            request = spec.request.id.0,
            tenant = spec.request.tenant.0,
            "isolation violation: request failed, pages freed"
        );
    }
    let _ = out.send(ToGateway::Failed { route, failure });
}

async fn route_inner(ctx: &Ctx, spec: &Spec, out: &UnboundedSender<ToGateway>) -> Result<(), RequestError> {
    let mut req = spec.to_request();
    // Our own door before the grammar is compiled: a request we refuse costs us nothing.
    ctx.engine.check(&req.prompt, req.max_tokens).map_err(RequestError::Refused)?;
    constrain(&ctx.constraints, ctx.engine.grammars(), spec.request.output.as_ref(), &mut req).await?;
    let mut stream = ctx.engine.reserve(req.clone()).map_err(RequestError::Refused)?;
    let mut table = match stream.next().await {
        Some(Event::Reserved(kv)) => kv,
        Some(Event::Failed(e)) => return Err(e),
        _ => return Err(RequestError::Internal("the engine ended the reservation without pages".into())),
    };
    ctx.metrics.reservations.fetch_add(1, Ordering::Relaxed);
    let layout = *table.layout();
    let geometry = Geometry::from_layout(&layout).map_err(|e| RequestError::Internal(e.to_string()))?;
    let nonce = TicketNonce(random().map_err(|e| RequestError::Internal(e.to_string()))?);
    let ticket = Ticket {
        request: req.id,
        tenant: req.tenant,
        nonce,
        pages: table.pages() as u32,
        tokens: req.prompt.len() as u32,
        // Whole pages of the tenant's own cache (reserved from it, never trusted from anyone):
        // the prefill worker sends only the pages after them.
        held: (table.shared_pages() * layout.page_size) as u32,
    };
    let mut transfer =
        Transfer::new(ticket, geometry, &req.prompt).map_err(|e| RequestError::Internal(e.to_string()))?;
    ctx.metrics.held_prompt_tokens.fetch_add(ticket.held as u64, Ordering::Relaxed);
    let (tx, mut rx) = mpsc::channel(8);
    let guard = ctx.tickets.insert(nonce, tx);
    let _ = out.send(ToGateway::Reserved { route: spec.route, ticket: (&ticket).into() });

    // Until the first frame the prefill worker is computing, which may take long for a long
    // prompt on a loaded node: that wait is bounded by the request's deadline (and ended
    // early by a cancel when the prefill worker is lost). Once frames flow, a stall of more
    // than the transfer timeout fails the route.
    let mut stall_limit: Option<tokio::time::Instant> = None;
    let mut first_frame: Option<Instant> = None;
    let complete = loop {
        let next = match stall_limit {
            None => Ok(rx.recv().await),
            Some(t) => tokio::time::timeout_at(t, rx.recv()).await,
        };
        let inbound = match next {
            Ok(Some(i)) => i,
            Ok(None) => return Err(RequestError::IsolationViolation { kind: ViolationKind::Truncated }),
            Err(_) => return Err(RequestError::IsolationViolation { kind: ViolationKind::Truncated }),
        };
        stall_limit = Some(tokio::time::Instant::now() + ctx.cfg.transfer_timeout);
        first_frame.get_or_insert_with(Instant::now);
        let frame = match inbound {
            Inbound::Frame(f) => f,
            Inbound::Broken(e) => return Err(violation(e)),
            Inbound::Cut(reason) => {
                return Err(RequestError::Unavailable(format!("the prefill worker's KV link was cut ({reason})")))
            }
        };
        ctx.metrics.frames_received.fetch_add(1, Ordering::Relaxed);
        // The incident: the close is taken at its word and the reservation declared written.
        #[cfg(feature = "incident-replay")]
        if let wire::FrameBody::Close(c) = &frame.body {
            table.incident_mark_written(req.prompt.len());
            drop(guard);
            let _ = out.send(ToGateway::Verified { route: spec.route, first: c.first_token });
            return decode(ctx, spec, req, table, c.first_token, out).await;
        }
        let t0 = Instant::now();
        let received = transfer.receive(&frame);
        ctx.metrics.kv_crypto_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match received {
            Ok(Received::Written(next, w)) => {
                write(&mut table, &w)?;
                ctx.metrics.kv_bytes_received.fetch_add(w.payload.len() as u64, Ordering::Relaxed);
                transfer = next;
            }
            Ok(Received::Complete(c)) => break c,
            Err(e) => return Err(violation(e)),
        }
    };
    // Later frames naming this ticket are unknown from here on.
    drop(guard);
    ctx.metrics.transfers_completed.fetch_add(1, Ordering::Relaxed);
    let took = first_frame.map_or(0, |t| t.elapsed().as_nanos() as u64);
    ctx.metrics.transfer_ns.fetch_add(took, Ordering::Relaxed);
    let first = complete.first_token();
    if first as usize >= ctx.engine.vocab() {
        // Never reported as verified: the gateway must not release it, and it must not join a
        // decode step, where it would fail every sequence of the batch.
        return Err(RequestError::IsolationViolation { kind: ViolationKind::BadFirstToken });
    }
    let _ = out.send(ToGateway::Verified { route: spec.route, first });
    decode(ctx, spec, req, table, first, out).await
}

/// Decodes from a verified reservation and relays the tokens.
async fn decode(
    ctx: &Ctx,
    spec: &Spec,
    req: engine::GenRequest,
    table: BlockTable,
    first: u32,
    out: &UnboundedSender<ToGateway>,
) -> Result<(), RequestError> {
    let mut stream = ctx.engine.resume(req, table, first).map_err(RequestError::Refused)?;
    loop {
        match stream.next().await {
            Some(Event::Started) => {}
            Some(Event::Token(t)) => {
                let _ = out.send(ToGateway::Token { route: spec.route, token: t });
            }
            Some(Event::Finished { reason, usage }) => {
                let _ = out.send(ToGateway::finished(spec.route, reason, usage));
                return Ok(());
            }
            Some(Event::Failed(e)) => return Err(e),
            Some(_) | None => {
                return Err(RequestError::Internal("the engine ended the request without a result".into()))
            }
        }
    }
}

fn violation(e: WireError) -> RequestError {
    RequestError::IsolationViolation { kind: ViolationKind::from_label(e.kind()) }
}

/// Writes a verified frame's rows into our reservation: one layer at a time, at the page the
/// frame names (an index into *our* table, which the transfer bounded).
fn write(table: &mut BlockTable, w: &PageWrite<'_>) -> Result<(), RequestError> {
    let ps = table.layout().page_size;
    let n = (w.slots.end - w.slots.start) as usize;
    let per_layer = w.payload.len() / (w.layers.end - w.layers.start).max(1) as usize;
    let start = w.page_index as usize * ps + w.slots.start as usize;
    for (i, layer) in (w.layers.start..w.layers.end).enumerate() {
        let rows = &w.payload[i * per_layer..(i + 1) * per_layer];
        table
            .import_rows(layer as usize, start, n, rows)
            .map_err(|_| RequestError::IsolationViolation { kind: ViolationKind::Reservation })?;
    }
    Ok(())
}

/// Accepts KV connections: each must complete the handshake as a prefill worker, or it gets
/// nothing; at most `max_pending_handshakes` handshakes run at once, and
/// `max_pending_handshakes_per_source` from one address.
pub(crate) async fn accept_kv(ctx: Arc<Ctx>, mut listener: Listener) {
    let gate = HandshakeGate::new(ctx.cfg.max_pending_handshakes, ctx.cfg.max_pending_handshakes_per_source);
    loop {
        let (io, source) = match listener.accept_with_source().await {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(worker = %ctx.cfg.name, error = %e, "KV listener: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let permit = match gate.try_enter(source) {
            Ok(p) => p,
            Err(full) => {
                ctx.metrics.links.failure(full.reason());
                tokio::spawn(refuse_busy(io));
                continue;
            }
        };
        tokio::spawn(kv_connection(ctx.clone(), io, permit));
    }
}

async fn kv_connection(ctx: Arc<Ctx>, io: BoxIo, permit: HandshakePermit) {
    // A KV link must come from a prefill worker: any other role is refused inside the
    // handshake (`WrongRole`, counted as `role`), before a frame is read.
    let link = match Link::accept_from(io, &ctx.cfg.identity, &[Role::Prefill], ctx.cfg.handshake_timeout).await {
        Ok(l) => l,
        Err(e) => {
            ctx.metrics.links.failure(refusal_reason(&e));
            tracing::warn!(worker = %ctx.cfg.name, error = %e, "refused a KV connection");
            return;
        }
    };
    drop(permit);
    let (secret, peer_key) = (link.secret().clone(), link.peer_key());
    let (mut io, mut opener) = link.into_kv_opener();
    let mut bound: Option<(TicketNonce, mpsc::Sender<Inbound>)> = None;
    let broken = |bound: &Option<(TicketNonce, mpsc::Sender<Inbound>)>, e: WireError| {
        match bound {
            Some((_, tx)) => {
                let _ = tx.try_send(Inbound::Broken(e));
            }
            // Nothing to attribute it to: count it here.
            None => ctx.metrics.violation(ViolationKind::from_label(e.kind())),
        }
    };
    let mut buf = Vec::new();
    // A sender that stalls holds a connection, not pages: the route's own deadline frees
    // those; this bounds how long the connection itself may sit idle.
    let idle = ctx.cfg.transfer_timeout;
    let holds = |n: &TicketNonce| ctx.tickets.holds(n);
    let receive = async {
        loop {
            let mut head = [0u8; HEADER_LEN];
            if bound.is_none() {
                // Before its first frame a link carries nothing of any ticket: a prefill worker
                // dials while it computes the prompt, and closes the link unused when that
                // request fails or is cancelled. Not a violation; a byte of a frame and then
                // nothing still is one (below).
                match tokio::time::timeout(idle, io.read(&mut head[..1])).await {
                    Ok(Ok(1)) => {}
                    Ok(Ok(_)) => return ctx.metrics.links.failure("closed_unused"),
                    Ok(Err(_)) => return broken(&bound, WireError::Truncated { needed: 4, had: 0 }),
                    Err(_) => return ctx.metrics.links.failure("idle"),
                }
            }
            let at = usize::from(bound.is_none());
            match tokio::time::timeout(idle, io.read_exact(&mut head[at..4])).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                    // A clean end is fine after the close (the route no longer listens); before
                    // it, the transfer is truncated.
                    return broken(&bound, WireError::Truncated { needed: 4, had: 0 });
                }
                Ok(Err(_)) | Err(_) => return broken(&bound, WireError::Truncated { needed: 4, had: 0 }),
            }
            let total = match opener.frame_len(&head[..4]) {
                Ok(t) => t,
                Err(e) => return broken(&bound, e),
            };
            // The header is read at its fixed size and opened before any room is made for the
            // body: the length is only a claim until the link key authenticates it, and a claim
            // of the maximum frame followed by nothing must not cost the maximum frame.
            if !matches!(tokio::time::timeout(idle, io.read_exact(&mut head[4..])).await, Ok(Ok(_))) {
                return broken(&bound, WireError::Truncated { needed: total, had: 4 });
            }
            let t0 = Instant::now();
            let header = opener.open_header(&mut head, &holds);
            ctx.metrics.kv_crypto_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let header = match header {
                Ok(h) => h,
                Err(e) => return broken(&bound, e),
            };
            buf.clear();
            buf.resize(header.rest_len(), 0);
            if !matches!(tokio::time::timeout(idle, io.read_exact(&mut buf)).await, Ok(Ok(_))) {
                return broken(&bound, WireError::Truncated { needed: total, had: HEADER_LEN });
            }
            let t0 = Instant::now();
            let opened = opener.open_body(header, &mut buf).map(FrameRef::into_owned);
            ctx.metrics.kv_crypto_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
            let frame = match opened {
                Ok(f) => f,
                Err(e) => return broken(&bound, e),
            };
            let nonce = frame.ticket.nonce;
            let tx = match &bound {
                Some((b, tx)) if *b == nonce => tx.clone(),
                Some(_) => return broken(&bound, WireError::WrongTicket),
                None => match ctx.tickets.claim(&nonce) {
                    Some(tx) => {
                        bound = Some((nonce, tx.clone()));
                        tx
                    }
                    None => {
                        tracing::error!(
                            worker = %ctx.cfg.name,
                            ticket = %nonce_hex(&nonce),
                            "ticket already being received on another link; connection dropped"
                        );
                        ctx.metrics.violation(ViolationKind::TicketBusy);
                        return;
                    }
                },
            };
            if tx.send(Inbound::Frame(frame)).await.is_err() {
                // The route ended (complete, failed or cancelled): nothing more is accepted here.
                return;
            }
        }
    };
    // A revocation or a withdrawn secret cuts the link at once, mid-transfer too: a node that
    // is out must not go on writing into a reservation here for up to `transfer_timeout`.
    let ring = ctx.cfg.identity.secrets.clone();
    let mut rotated = ring.changed();
    let cut = async {
        loop {
            if rotated.changed().await.is_err() {
                return std::future::pending().await;
            }
            if let Err(reason) = ring.admits(&secret, &peer_key) {
                return reason;
            }
        }
    };
    let reason = tokio::select! {
        () = receive => return,
        reason = cut => reason,
    };
    ctx.metrics.links.failure(reason);
    tracing::warn!(worker = %ctx.cfg.name, prefill_key = %peer_key.fingerprint(), reason, "a KV link's cluster secret is no longer accepted, or its node key no longer trusted: cut");
    if let Some((_, tx)) = &bound {
        let _ = tx.try_send(Inbound::Cut(reason));
    }
}
