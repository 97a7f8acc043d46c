//! The Mooncake FAST'25 request trace (kvcache-ai/Mooncake, `FAST25-release/traces/`), read one
//! line at a time: a trace of millions of lines is never held in memory.
//!
//! One JSON object per line: `timestamp` (ms; Mooncake's count from the first request, and the
//! replay runs its clock from the first line's, so epoch timestamps replay the same; a trace may
//! span 31 days, [`crate::trace_replay::MAX_TRACE_SPAN_MS`]), `input_length` and
//! `output_length` (tokens), `hash_ids` (ids of the prompt's 512-token prefix blocks; equal ids
//! mean the same prefix, so the KV of that block can be reused). A line is refused, naming its
//! number (from 1) and the field, when a length is missing, negative or not an integer, when
//! `hash_ids` does not hold exactly `ceil(input_length / 512)` non-negative integers, when the
//! timestamp is earlier than the previous line's, when the line is not a JSON object, or when
//! it names a key twice. Other fields are refused by name (nothing is dropped silently). Empty
//! lines are skipped, and a UTF-8 byte-order mark at the start of the file. Each line is read
//! by a typed serde model (`trace_line`), never into a `serde_json::Value`.

use std::io::BufRead;

/// Tokens per prefix block of the Mooncake traces.
pub const BLOCK_TOKENS: u64 = 512;

/// One request of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Line number in the trace (from 1).
    pub line: u64,
    /// Arrival, milliseconds (as in the trace; the replay counts from the first request's).
    pub timestamp_ms: u64,
    /// Prompt tokens.
    pub input_tokens: u64,
    /// Tokens decoded after the prompt.
    pub output_tokens: u64,
    /// Prefix-block ids, one per 512 prompt tokens (the last block may be partial).
    pub hash_ids: Vec<u64>,
}

/// A line that is not a valid request, or a read error.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The line is not a valid request.
    #[error("trace line {line}: {field}: {problem}")]
    Line {
        /// Line number (from 1).
        line: u64,
        /// The field (`timestamp`, `input_length`, `output_length`, `hash_ids`, or `line`).
        field: String,
        /// What is wrong, with the value.
        problem: String,
    },
    /// The trace holds no request (only empty lines, or nothing).
    #[error("trace {trace}: no requests")]
    Empty {
        /// The trace's name (its path, `stdin`, or the embedded trace).
        trace: String,
    },
    /// The file cannot be read.
    #[error("trace: reading line {line}: {source}")]
    Io {
        /// The line being read.
        line: u64,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// A [`TraceError::Line`].
pub(crate) fn line_err(line: u64, field: &str, problem: String) -> TraceError {
    TraceError::Line {
        line,
        field: field.to_string(),
        problem,
    }
}

/// Parses line `line` of a trace; `previous_ms` is the previous request's timestamp.
///
/// # Errors
///
/// [`TraceError::Line`] naming `line`, the field and its value: a line that is not one JSON object
/// of the trace's fields, a missing field, a zero `input_length`, a timestamp before `previous_ms`,
/// or `hash_ids` that do not fit the prompt.
pub fn parse_line(text: &str, line: u64, previous_ms: Option<u64>) -> Result<Request, TraceError> {
    let fields = crate::trace_line::read(text).map_err(|r| line_err(line, &r.field, r.problem))?;
    let present =
        |v: Option<u64>, field: &str| v.ok_or_else(|| line_err(line, field, "missing".into()));
    let timestamp_ms = present(fields.timestamp, "timestamp")?;
    if let Some(prev) = previous_ms
        && timestamp_ms < prev
    {
        return Err(line_err(
            line,
            "timestamp",
            format!("{timestamp_ms} goes back (the previous line's is {prev})"),
        ));
    }
    let input_tokens = present(fields.input_length, "input_length")?;
    if input_tokens == 0 {
        return Err(line_err(
            line,
            "input_length",
            "must be at least 1, got 0".into(),
        ));
    }
    let output_tokens = present(fields.output_length, "output_length")?;
    let hash_ids = fields
        .hash_ids
        .ok_or_else(|| line_err(line, "hash_ids", "missing".into()))?;
    let blocks = input_tokens.div_ceil(BLOCK_TOKENS);
    if hash_ids.len() as u64 != blocks {
        return Err(line_err(
            line,
            "hash_ids",
            format!(
                "{} ids for input_length {input_tokens}; {BLOCK_TOKENS}-token blocks need exactly ceil({input_tokens}/{BLOCK_TOKENS}) = {blocks}",
                hash_ids.len()
            ),
        ));
    }
    Ok(Request {
        line,
        timestamp_ms,
        input_tokens,
        output_tokens,
        hash_ids,
    })
}

/// Streams the requests of a trace, checking each line and the order of timestamps.
pub struct TraceReader<R> {
    input: R,
    line: u64,
    previous_ms: Option<u64>,
    buf: String,
}

impl<R: BufRead> TraceReader<R> {
    /// A reader over `input`.
    pub fn new(input: R) -> Self {
        TraceReader {
            input,
            line: 0,
            previous_ms: None,
            buf: String::new(),
        }
    }

    /// The underlying reader.
    pub fn get_ref(&self) -> &R {
        &self.input
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<Request, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            self.buf.clear();
            self.line += 1;
            match self.input.read_line(&mut self.buf) {
                Ok(0) => return None,
                Ok(_) => {}
                Err(source) => {
                    return Some(Err(TraceError::Io {
                        line: self.line,
                        source,
                    }));
                }
            }
            let mut text = self.buf.trim();
            if self.line == 1 {
                // A UTF-8 byte-order mark, as geometry files and config.json allow.
                text = text.strip_prefix('\u{feff}').unwrap_or(text);
            }
            if text.is_empty() {
                continue;
            }
            let r = parse_line(text, self.line, self.previous_ms);
            if let Ok(req) = &r {
                self.previous_ms = Some(req.timestamp_ms);
            }
            return Some(r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        parse_line(text, 7, Some(100)).unwrap_err().to_string()
    }

    #[test]
    fn a_valid_line() {
        // 1000 tokens at 512 per block: ceil(1000 / 512) = 2 ids.
        let r = parse_line(
            r#"{"timestamp": 100, "input_length": 1000, "output_length": 5, "hash_ids": [0, 9]}"#,
            3,
            Some(100),
        )
        .unwrap();
        assert_eq!(
            r,
            Request {
                line: 3,
                timestamp_ms: 100,
                input_tokens: 1000,
                output_tokens: 5,
                hash_ids: vec![0, 9]
            }
        );
    }

    #[test]
    fn bad_lines_name_line_and_field() {
        let ok = r#""output_length": 5, "hash_ids": [0, 9]"#;
        assert_eq!(
            err(&format!(
                r#"{{"timestamp": 100, "input_length": -3, {ok}}}"#
            )),
            "trace line 7: input_length: -3 is not a non-negative integer (tokens or milliseconds)"
        );
        assert_eq!(
            err(&format!(r#"{{"timestamp": 100, {ok}}}"#)),
            "trace line 7: input_length: missing"
        );
        assert_eq!(
            err(&format!(
                r#"{{"timestamp": 99, "input_length": 1000, {ok}}}"#
            )),
            "trace line 7: timestamp: 99 goes back (the previous line's is 100)"
        );
        // 1025 tokens need ceil(1025 / 512) = 3 ids; 2 are given.
        assert_eq!(
            err(&format!(
                r#"{{"timestamp": 100, "input_length": 1025, {ok}}}"#
            )),
            "trace line 7: hash_ids: 2 ids for input_length 1025; 512-token blocks need exactly ceil(1025/512) = 3"
        );
        // A surplus is refused too: 512 tokens are ceil(512 / 512) = 1 block; 2 ids are given.
        assert_eq!(
            err(&format!(
                r#"{{"timestamp": 100, "input_length": 512, {ok}}}"#
            )),
            "trace line 7: hash_ids: 2 ids for input_length 512; 512-token blocks need exactly ceil(512/512) = 1"
        );
        assert!(err(r#"{"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [0], "x": 1}"#)
            .contains("x: unknown field"));
        assert!(err("[1]").contains("line: not a JSON object"));
    }

    /// Hostile review: a UTF-8 BOM made line 1 "not JSON: expected value at line 1 column 1";
    /// geometry files and config.json strip one. Only at the start of the file.
    #[test]
    fn a_bom_at_the_start_is_skipped() {
        let line = r#"{"timestamp": 5, "input_length": 512, "output_length": 1, "hash_ids": [3]}"#;
        let text = format!("\u{feff}{line}\n{line}\n");
        let got: Vec<Request> = TraceReader::new(text.as_bytes())
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(got.len(), 2);
        assert_eq!(
            (got[0].line, got[0].timestamp_ms, got[0].hash_ids.clone()),
            (1, 5, vec![3])
        );
        let text = format!("{line}\n\u{feff}{line}\n");
        let e = TraceReader::new(text.as_bytes())
            .nth(1)
            .unwrap()
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("trace line 2: line: not JSON"), "{e}");
    }

    /// Hostile review: a repeated key was read as its last value. Column 28 is the closing
    /// quote of the second `"timestamp"` (`{` 1, the first key 2-12, `: 1, ` 13-17, the second
    /// key 18-28).
    #[test]
    fn a_key_named_twice_is_refused_naming_it() {
        assert_eq!(
            err(
                r#"{"timestamp": 1, "timestamp": 100, "input_length": 512, "output_length": 5, "hash_ids": [0]}"#
            ),
            "trace line 7: timestamp: key \"timestamp\" given twice in one object (the second value \
             would silently win) at column 28"
        );
    }

    /// A key holding a quote, given twice, was reported under the text before its quote
    /// (`a\`): the message was split at quotes. The key is now recorded as read, and refused
    /// whole at its first occurrence (it is no trace field).
    #[test]
    fn a_key_with_a_quote_named_twice_is_named_whole() {
        assert_eq!(
            err(r#"{"a\"b": 1, "a\"b": 2}"#),
            "trace line 7: a\"b: unknown field (not modelled)"
        );
    }

    #[test]
    fn hash_ids_entries_and_types_are_named() {
        let head = r#""timestamp": 100, "input_length": 1000, "output_length": 5"#;
        assert_eq!(
            err(&format!(r#"{{{head}, "hash_ids": [0, -9]}}"#)),
            "trace line 7: hash_ids: entry 1: -9 is not a non-negative integer"
        );
        assert_eq!(
            err(&format!(r#"{{{head}, "hash_ids": "0,9"}}"#)),
            "trace line 7: hash_ids: the string \"0,9\" is not an array"
        );
        assert_eq!(
            err(r#"{"timestamp": 1.5, "input_length": 1, "output_length": 1, "hash_ids": [0]}"#),
            "trace line 7: timestamp: 1.5 is not a non-negative integer (tokens or milliseconds)"
        );
    }

    /// `100.0` was shown as `100` ("100 is not a non-negative integer"), and `1e300` as its
    /// 301 digits: floats are now shown as JSON writes them.
    #[test]
    fn a_float_is_shown_as_a_float() {
        assert_eq!(
            err(r#"{"timestamp": 0, "input_length": 100.0, "output_length": 1, "hash_ids": [0]}"#),
            "trace line 7: input_length: 100.0 is not a non-negative integer (tokens or milliseconds)"
        );
        assert_eq!(
            err(r#"{"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [0]}"#),
            "trace line 7: timestamp: 1e300 is not a non-negative integer (tokens or milliseconds)"
        );
        let head = r#""timestamp": 100, "input_length": 1000, "output_length": 5"#;
        assert_eq!(
            err(&format!(r#"{{{head}, "hash_ids": [0, 1.0]}}"#)),
            "trace line 7: hash_ids: entry 1: 1.0 is not a non-negative integer"
        );
        assert_eq!(
            err(&format!(r#"{{{head}, "hash_ids": 2.0}}"#)),
            "trace line 7: hash_ids: 2.0 is not an array"
        );
    }

    #[test]
    fn reader_streams_and_checks_order() {
        let text = "{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": [1]}\n\n{\"timestamp\": 4, \"input_length\": 1, \"output_length\": 0, \"hash_ids\": [1]}\n";
        let mut r = TraceReader::new(text.as_bytes());
        assert_eq!(r.next().unwrap().unwrap().line, 1);
        let e = r.next().unwrap().unwrap_err().to_string();
        assert_eq!(
            e,
            "trace line 3: timestamp: 4 goes back (the previous line's is 5)"
        );
    }
}
