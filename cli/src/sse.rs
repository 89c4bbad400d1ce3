//! Reading a Server-Sent Events stream as the HTML specification's "event stream
//! interpretation" says (html.spec.whatwg.org, § 9.2.6): lines end in CRLF, LF or a lone CR; a
//! line starting with `:` is a comment; `data:` lines join with a newline; `id` sets the last
//! event ID, which lasts across events; an event is dispatched at a blank line, and an event
//! left without one when the stream ends is dropped. The CLI's two followers (`--wait` and
//! `--watch`) read their streams through it.

use std::io::BufRead;

/// One dispatched event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// The `event` field, `message` when there was none.
    pub(crate) kind: String,
    /// The `data` lines joined with `\n`.
    pub(crate) data: String,
    /// The last event ID when the event was dispatched (set by this event or an earlier one).
    pub(crate) last_id: String,
}

/// What a blank line ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Block {
    Event(Event),
    /// A block without data: a keep-alive comment, or fields alone (an `id` still counts).
    Empty,
}

/// The events of one stream, each at its blank line.
pub(crate) struct Events<R> {
    reader: R,
    /// The last line ended in CR: an LF that starts the next read belongs to it.
    after_cr: bool,
    /// No byte read yet: a leading byte-order mark is dropped.
    at_start: bool,
    data: String,
    kind: String,
    last_id: String,
}

impl<R: BufRead> Events<R> {
    pub(crate) fn new(reader: R) -> Self {
        Self {
            reader,
            after_cr: false,
            at_start: true,
            data: String::new(),
            kind: String::new(),
            last_id: String::new(),
        }
    }

    /// The last event ID seen so far (what a reconnection sends as `Last-Event-ID`).
    pub(crate) fn last_id(&self) -> &str {
        &self.last_id
    }

    /// The next line without its end; `None` at the end of the stream (a line cut by the end
    /// is dropped with the event it belonged to).
    fn line(&mut self) -> std::io::Result<Option<String>> {
        let mut line = Vec::new();
        loop {
            let available = self.reader.fill_buf()?;
            if available.is_empty() {
                return Ok(None);
            }
            let mut start = 0;
            if self.after_cr && available[0] == b'\n' {
                start = 1;
            }
            self.after_cr = false;
            if self.at_start {
                self.at_start = false;
                if available[start..].starts_with(b"\xEF\xBB\xBF") {
                    start += 3;
                }
            }
            let rest = &available[start..];
            if let Some(end) = rest.iter().position(|b| matches!(b, b'\n' | b'\r')) {
                line.extend_from_slice(&rest[..end]);
                self.after_cr = rest[end] == b'\r';
                self.reader.consume(start + end + 1);
                return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
            }
            line.extend_from_slice(rest);
            let used = available.len();
            self.reader.consume(used);
        }
    }

    /// Takes one line; a blank line ends a block.
    fn take(&mut self, line: &str) -> Option<Block> {
        if line.is_empty() {
            if self.data.is_empty() {
                self.kind.clear();
                return Some(Block::Empty);
            }
            let mut data = std::mem::take(&mut self.data);
            data.pop(); // the LF after the last data line
            let kind = std::mem::take(&mut self.kind);
            return Some(Block::Event(Event {
                kind: if kind.is_empty() {
                    "message".into()
                } else {
                    kind
                },
                data,
                last_id: self.last_id.clone(),
            }));
        }
        if line.starts_with(':') {
            return None;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => value.clone_into(&mut self.kind),
            "data" => {
                self.data.push_str(value);
                self.data.push('\n');
            }
            "id" if !value.contains('\0') => value.clone_into(&mut self.last_id),
            // `retry` is the browser's reconnection delay: the CLI keeps its own pace.
            _ => {}
        }
        None
    }
}

impl<R: BufRead> Iterator for Events<R> {
    type Item = std::io::Result<Block>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            match self.line() {
                Ok(Some(line)) => {
                    if let Some(block) = self.take(&line) {
                        return Some(Ok(block));
                    }
                }
                Ok(None) => return None,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "test code")]

    use super::*;

    fn blocks(stream: &[u8]) -> Vec<Block> {
        Events::new(stream).map(Result::unwrap).collect()
    }

    fn event(data: &str, last_id: &str) -> Block {
        Block::Event(Event {
            kind: "message".into(),
            data: data.into(),
            last_id: last_id.into(),
        })
    }

    /// The specification's examples (§ 9.2.5 and § 9.2.6), one by one.
    #[test]
    fn the_specifications_examples() {
        // Several data lines are one event's lines, joined with a newline.
        assert_eq!(
            blocks(b"data: YHOO\ndata: +2\ndata: 10\n\n"),
            vec![event("YHOO\n+2\n10", "")]
        );
        // A comment, an id that lasts, an `id` without a value that resets it, a second space
        // that stays.
        assert_eq!(
            blocks(
                b": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n"
            ),
            vec![
                Block::Empty,
                event("first event", "1"),
                event("second event", ""),
                event(" third event", ""),
            ]
        );
        // `data` alone is an empty line of data; an event the stream ends inside is dropped.
        assert_eq!(
            blocks(b"data\n\ndata\ndata\n\ndata:"),
            vec![event("", ""), event("\n", "")]
        );
        // One space after the colon is dropped, no more.
        assert_eq!(
            blocks(b"data:test\n\ndata: test\n\n"),
            vec![event("test", ""), event("test", "")]
        );
    }

    #[test]
    fn every_line_ending_and_the_fields_the_api_sends() {
        let stream = b"\xEF\xBB\xBFid: 7\r\nevent: status\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n\
                       :keep-alive\r\rid: 8\revent: node\rdata: x\r\r\
                       retry: 10\nevent: gone\ndata: y\n\n";
        let got = blocks(stream);
        assert_eq!(
            got,
            vec![
                Block::Event(Event {
                    kind: "status".into(),
                    data: "{\"a\":\n1}".into(),
                    last_id: "7".into()
                }),
                Block::Empty,
                Block::Event(Event {
                    kind: "node".into(),
                    data: "x".into(),
                    last_id: "8".into()
                }),
                Block::Event(Event {
                    kind: "gone".into(),
                    data: "y".into(),
                    last_id: "8".into()
                }),
            ]
        );
    }

    #[test]
    fn a_cr_lf_split_between_reads_is_one_line_end() {
        // A reader that hands out one byte at a time: the LF after a CR comes in the next read.
        let stream: &[u8] = b"data: a\r\n\r\ndata: b\r\n\r\n";
        let reader = std::io::BufReader::with_capacity(1, stream);
        let got: Vec<Block> = Events::new(reader).map(Result::unwrap).collect();
        assert_eq!(got, vec![event("a", ""), event("b", "")]);
        // An id with a NUL is ignored; the type resets after each event.
        assert_eq!(
            blocks(b"id: 1\n\nid: 2\0\nevent: x\n\ndata: z\n\n"),
            vec![Block::Empty, Block::Empty, event("z", "1")]
        );
    }
}
