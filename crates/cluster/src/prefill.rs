//! The prefill worker's route: check at our own door, compute the prompt's KV, report the
//! first token, stream the KV as MAC'd frames to the decode worker named by the gateway.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use engine::Event;
use kv::BlockTable;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::sync::mpsc::UnboundedSender;
use wire::{CloseFrame, Codec, Frame, KvFrame, PromptDigest, Role, Ticket, TicketKey};

use crate::net::BoxIo;
use crate::proto::{Failure, Spec, ToGateway};
use crate::worker::Ctx;
use crate::{ClusterError, Link};

pub(crate) async fn run(
    ctx: Arc<Ctx>,
    spec: Spec,
    ticket: Ticket,
    key: [u8; 32],
    decode_addr: String,
    out: UnboundedSender<ToGateway>,
) {
    let route = spec.route;
    let deadline = spec.deadline();
    let failure =
        match tokio::time::timeout_at(deadline.into(), route_inner(&ctx, &spec, ticket, key, &decode_addr, &out)).await
        {
            Ok(Ok(())) => return,
            Ok(Err(f)) => f,
            Err(_) => Failure::DeadlineExceeded,
        };
    let _ = out.send(ToGateway::Failed { route, failure });
}

async fn route_inner(
    ctx: &Ctx,
    spec: &Spec,
    ticket: Ticket,
    key: [u8; 32],
    decode_addr: &str,
    out: &UnboundedSender<ToGateway>,
) -> Result<(), Failure> {
    let req = spec.to_request().map_err(|m| Failure::Internal(format!("invalid sampling parameters: {m}")))?;
    // Our own door first: nothing is computed or sent for a request that fails it.
    #[cfg(not(feature = "incident-replay"))]
    ctx.engine.check(&req.prompt, req.max_tokens).map_err(Failure::Refused)?;
    // The incident: a prompt our pool cannot hold becomes a one-token placeholder.
    #[cfg(feature = "incident-replay")]
    let (req, ticket) = {
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
        return Err(Failure::Violation("wrong_ticket".into()));
    }
    let mut stream = ctx.engine.prefill(req.clone()).map_err(Failure::Refused)?;
    let mut cached_tokens = None;
    let (first, table) = loop {
        match stream.next().await {
            Some(Event::Prefilled { first, kv }) => break (first, kv),
            Some(Event::Started) => {}
            Some(Event::PrefixCache { cached_tokens: n }) => cached_tokens = Some(n),
            Some(Event::Failed(e)) => return Err(Failure::of(&e)),
            Some(_) | None => return Err(Failure::Internal("the engine ended the prefill without KV".into())),
        }
    };
    let _ = out.send(ToGateway::First { route: spec.route, token: (&first).into(), cached_tokens });

    let timeout = ctx.cfg.handshake_timeout;
    let unreachable = |e: ClusterError| Failure::Unreachable(format!("decode worker at {decode_addr}: {e}"));
    let io = tokio::time::timeout(timeout, ctx.net.dial(decode_addr))
        .await
        .map_err(|_| unreachable(ClusterError::Timeout("connecting")))?
        .map_err(unreachable)?;
    let link = Link::connect(io, &ctx.cfg.identity, timeout).await.map_err(unreachable)?;
    if link.peer != Role::Decode {
        return Err(unreachable(ClusterError::WrongRole { got: link.peer, want: "decode" }));
    }
    let frames = send_kv(ctx, link.into_io(), &table, &ticket, &TicketKey::from_bytes(key), &req.prompt, first.token)
        .await
        .map_err(unreachable)?;
    drop(table);
    let _ = out.send(ToGateway::Sent { route: spec.route, frames });
    Ok(())
}

/// One frame per page (every layer), then the close; returns the number of frames.
async fn send_kv(
    ctx: &Ctx,
    io: BoxIo,
    table: &BlockTable,
    ticket: &Ticket,
    key: &TicketKey,
    prompt: &[u32],
    first_token: u32,
) -> Result<u32, ClusterError> {
    let codec = Codec::default();
    let layout = *table.layout();
    let (ps, n, layers) = (layout.page_size, prompt.len(), layout.n_layers as u32);
    let mut io = BufWriter::with_capacity(1 << 20, io);
    let mut seq = 0u32;
    for page in 0..n.div_ceil(ps) {
        let (start, end) = (page * ps, ((page + 1) * ps).min(n));
        let mut payload = Vec::new();
        for layer in 0..layout.n_layers {
            table
                .export_rows(layer, start, end - start, &mut payload)
                .map_err(|e| ClusterError::Message(format!("reading the prompt's KV: {e}")))?;
        }
        let kv = KvFrame { page_index: page as u32, layers: 0..layers, tokens: start as u32..end as u32, payload };
        io.write_all(&codec.encode(&Frame::kv(ticket.id(), seq, kv), key)?).await?;
        ctx.metrics.frames_sent.fetch_add(1, Ordering::Relaxed);
        seq += 1;
    }
    let close = CloseFrame { tokens: n as u32, prompt_digest: PromptDigest::of(prompt), first_token };
    io.write_all(&codec.encode(&Frame::close(ticket.id(), seq, close), key)?).await?;
    ctx.metrics.frames_sent.fetch_add(1, Ordering::Relaxed);
    io.flush().await?;
    io.shutdown().await?;
    Ok(seq + 1)
}
