//! A watch: one long-lived POST whose answer is a stream of JSON messages, one a line. The
//! stream is read in frames; lines are cut out of a bounded buffer, so a message split across
//! frames (or several in one) reads the same.

use std::time::Duration;

use http_body_util::BodyExt as _;
use hyper::body::Incoming;

use crate::error::MembershipError;
use crate::json::{message_of, unb64, StreamLine, WatchResult};
use crate::transport::{ConnGuard, MAX_BODY};

/// A change under a watched prefix. `revision` is the store's revision of the change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    Put { key: String, value: Vec<u8>, revision: i64 },
    Delete { key: String, revision: i64 },
}

/// What one message of the stream said.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Message {
    /// The watch is in place.
    Created,
    /// Changes (possibly none: a progress notification).
    Events(Vec<Event>),
}

/// An open watch on a prefix (from [`crate::EtcdClient::watch_prefix`]). Dropping it closes
/// the connection. After an error it should be dropped: the stream is not resumable.
pub struct Watch {
    endpoint: String,
    body: Incoming,
    buf: Vec<u8>,
    ended: bool,
    _conn: ConnGuard,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("endpoint", &self.endpoint).field("ended", &self.ended).finish()
    }
}

impl Watch {
    pub(crate) fn new(endpoint: String, body: Incoming, conn: ConnGuard) -> Self {
        Watch { endpoint, body, buf: Vec::new(), ended: false, _conn: conn }
    }

    /// Next batch of events; `Ok(None)` when etcd ended the stream; `Err` when no batch came
    /// within `within` (a [`MembershipError::Timeout`]), or on a broken or failed watch.
    pub async fn next(&mut self, within: Duration) -> Result<Option<Vec<Event>>, MembershipError> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match self.message(deadline, within).await? {
                None => return Ok(None),
                Some(Message::Events(events)) if !events.is_empty() => return Ok(Some(events)),
                Some(_) => {}
            }
        }
    }

    /// Waits for the message saying the watch is in place (events before it would be etcd
    /// breaking its protocol; they are not dropped silently but refused).
    pub(crate) async fn created(&mut self, within: Duration) -> Result<(), MembershipError> {
        let deadline = tokio::time::Instant::now() + within;
        match self.message(deadline, within).await? {
            Some(Message::Created) => Ok(()),
            Some(Message::Events(_)) => Err(self.malformed("events before the watch was created")),
            None => Err(MembershipError::WatchFailed {
                endpoint: self.endpoint.clone(),
                reason: "the stream ended before the watch was created".into(),
            }),
        }
    }

    /// The next message; `None` at the end of the stream.
    async fn message(
        &mut self,
        deadline: tokio::time::Instant,
        within: Duration,
    ) -> Result<Option<Message>, MembershipError> {
        loop {
            if let Some(line) = self.take_line() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return parse_line(&line).map(Some).map_err(|reason| self.fail(reason));
            }
            if self.ended {
                return Ok(None);
            }
            let frame = tokio::time::timeout_at(deadline, self.body.frame()).await.map_err(|_| {
                MembershipError::Timeout { endpoints: self.endpoint.clone(), call: "watch", timeout: within }
            })?;
            match frame {
                None => {
                    self.ended = true;
                    // A last message without its newline still counts.
                    if !self.buf.is_empty() {
                        self.buf.push(b'\n');
                    }
                }
                Some(Err(e)) => {
                    return Err(MembershipError::Unreachable {
                        endpoints: self.endpoint.clone(),
                        call: "watch",
                        source: Box::new(e),
                    })
                }
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                        if self.buf.len() > MAX_BODY {
                            return Err(self.malformed("a message longer than the limit"));
                        }
                    }
                }
            }
        }
    }

    fn take_line(&mut self) -> Option<Vec<u8>> {
        let end = self.buf.iter().position(|&b| b == b'\n')?;
        let mut line: Vec<u8> = self.buf.drain(..=end).collect();
        line.pop();
        Some(line)
    }

    fn malformed(&self, reason: &str) -> MembershipError {
        MembershipError::Malformed {
            endpoint: self.endpoint.clone(),
            call: "watch",
            reason: reason.to_string(),
            source: None,
        }
    }

    fn fail(&self, failure: LineError) -> MembershipError {
        match failure {
            LineError::Failed(reason) => MembershipError::WatchFailed { endpoint: self.endpoint.clone(), reason },
            LineError::Malformed(reason, source) => {
                MembershipError::Malformed { endpoint: self.endpoint.clone(), call: "watch", reason, source }
            }
        }
    }
}

#[derive(Debug)]
pub(crate) enum LineError {
    /// etcd said the watch is over (cancelled, compacted, an error on the stream).
    Failed(String),
    Malformed(String, Option<crate::error::Cause>),
}

/// One line of the stream. Keys that are not UTF-8 are not ours (we write names): skipped.
pub(crate) fn parse_line(line: &[u8]) -> Result<Message, LineError> {
    let parsed: StreamLine<WatchResult> = serde_json::from_slice(line)
        .map_err(|e| LineError::Malformed("a watch message that is not JSON".into(), Some(Box::new(e))))?;
    if let Some(error) = parsed.error {
        return Err(LineError::Failed(message_of(&error).unwrap_or_else(|| error.to_string())));
    }
    let Some(result) = parsed.result else {
        return Err(LineError::Malformed("a watch message with neither result nor error".into(), None));
    };
    if result.canceled || result.compact_revision != 0 {
        let reason = if result.compact_revision != 0 {
            format!("cancelled: history compacted up to revision {}", result.compact_revision)
        } else if result.cancel_reason.is_empty() {
            "cancelled by etcd".to_string()
        } else {
            format!("cancelled: {}", result.cancel_reason)
        };
        return Err(LineError::Failed(reason));
    }
    if result.created {
        return Ok(Message::Created);
    }
    let mut events = Vec::with_capacity(result.events.len());
    for e in result.events {
        let key = unb64(&e.kv.key)
            .map_err(|err| LineError::Malformed("a key that is not base64".into(), Some(Box::new(err))))?;
        let Ok(key) = String::from_utf8(key) else {
            tracing::warn!(revision = e.kv.mod_revision, "membership: a key that is not UTF-8; skipped");
            continue;
        };
        let revision = e.kv.mod_revision;
        match e.kind.as_str() {
            "" | "PUT" => {
                let value = unb64(&e.kv.value)
                    .map_err(|err| LineError::Malformed("a value that is not base64".into(), Some(Box::new(err))))?;
                events.push(Event::Put { key, value, revision });
            }
            "DELETE" => events.push(Event::Delete { key, revision }),
            other => return Err(LineError::Malformed(format!("an event of unknown type {other:?}"), None)),
        }
    }
    Ok(Message::Events(events))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn puts_and_deletes_read_as_events() {
        let line = br#"{"result":{"header":{"revision":"4"},"events":[{"kv":{"key":"cGE=","mod_revision":"3","value":"MQ=="}},{"type":"DELETE","kv":{"key":"cGE=","mod_revision":"4"}}]}}"#;
        let got = parse_line(line).expect("events");
        assert_eq!(
            got,
            Message::Events(vec![
                Event::Put { key: "pa".into(), value: b"1".to_vec(), revision: 3 },
                Event::Delete { key: "pa".into(), revision: 4 },
            ])
        );
        assert_eq!(parse_line(br#"{"result":{"header":{},"created":true}}"#).expect("created"), Message::Created);
    }

    #[test]
    fn cancelled_compacted_and_error_messages_fail_the_watch() {
        for line in [
            &br#"{"result":{"header":{},"canceled":true,"cancel_reason":"x"}}"#[..],
            br#"{"result":{"header":{},"compact_revision":"7"}}"#,
            br#"{"error":{"grpc_code":14,"message":"etcdserver: no leader"}}"#,
        ] {
            assert!(matches!(parse_line(line), Err(LineError::Failed(_))), "{}", String::from_utf8_lossy(line));
        }
        assert!(matches!(parse_line(b"{nope"), Err(LineError::Malformed(..))));
        assert!(matches!(parse_line(b"{}"), Err(LineError::Malformed(..))));
    }
}
