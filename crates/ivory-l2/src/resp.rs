//! RESP2 replies, read by a bounded incremental parser: a pure function over the bytes
//! received so far that answers "need more", a reply and how many bytes it took, or an error.
//!
//! Every length a reply announces (bulk string, array) and its nesting depth are checked
//! against [`Limits`] *before* anything is allocated, and a reply may never take more than
//! [`Limits::max_total`] bytes, so a hostile server cannot make a replica buffer more than
//! that, whatever it announces or streams. Only the canonical encoding is accepted (no leading
//! zeros, no `+` sign, no `-0`, no negative length other than `-1`): a reply accepted here
//! re-encodes ([`encode`]) to exactly the bytes it consumed.

/// One RESP2 reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply {
    /// `+text`.
    Simple(Vec<u8>),
    /// `-text`: the server refused the command.
    Error(Vec<u8>),
    /// `:n`.
    Integer(i64),
    /// `$len` and bytes; `None` for the null bulk string `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*len` and replies; `None` for the null array `*-1`.
    Array(Option<Vec<Reply>>),
}

/// Bounds on one reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Longest bulk string.
    pub max_bulk: usize,
    /// Most elements of one array.
    pub max_array: usize,
    /// Deepest nesting (an array of bulk strings is depth 2).
    pub max_depth: usize,
    /// Most bytes of one reply, framing included.
    pub max_total: usize,
}

/// Why bytes are not a reply ivory accepts. Any of them ends the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A bulk string longer than [`Limits::max_bulk`].
    #[error("bulk string of {0} bytes is over the limit")]
    BulkTooLong(u64),
    /// An array longer than [`Limits::max_array`].
    #[error("array of {0} elements is over the limit")]
    ArrayTooLong(u64),
    /// Nested deeper than [`Limits::max_depth`].
    #[error("reply nested deeper than the limit")]
    TooDeep,
    /// More bytes than [`Limits::max_total`] (announced or received).
    #[error("reply larger than the limit")]
    TooLarge,
    /// Not RESP2, or not in its canonical form.
    #[error("malformed reply")]
    Malformed,
}

/// What the bytes received so far hold.
#[derive(Debug, PartialEq, Eq)]
pub enum Parsed {
    /// A complete reply and the bytes it took.
    Reply(Reply, usize),
    /// A valid prefix of a reply: read more (never past `max_total` bytes).
    NeedMore,
}

/// Longest accepted length or integer line (`-9223372036854775808`).
const MAX_NUMBER_DIGITS: usize = 20;

/// Parses one reply at the start of `buf`.
pub fn parse(buf: &[u8], limits: &Limits) -> Result<Parsed, ProtocolError> {
    // First a scan that allocates nothing: a prefix re-scanned on every read costs no memory.
    match scan(buf, 0, 1, limits)? {
        None => {
            if buf.len() >= limits.max_total {
                Err(ProtocolError::TooLarge)
            } else {
                Ok(Parsed::NeedMore)
            }
        }
        Some(end) => {
            let (reply, built_end) = build(buf, 0)?;
            if built_end == end {
                Ok(Parsed::Reply(reply, end))
            } else {
                Err(ProtocolError::Malformed)
            }
        }
    }
}

/// The end of the line starting at `at` (index of its `\r`), if complete; `\r` or `\n` alone
/// inside a line are refused (they could not be re-encoded).
fn line_end(buf: &[u8], at: usize, limits: &Limits) -> Result<Option<usize>, ProtocolError> {
    let rest = buf.get(at..).unwrap_or_default();
    for (i, &b) in rest.iter().enumerate() {
        if b == b'\r' {
            return match rest.get(i + 1) {
                None => Ok(None),
                Some(b'\n') => Ok(Some(at + i)),
                Some(_) => Err(ProtocolError::Malformed),
            };
        }
        if b == b'\n' {
            return Err(ProtocolError::Malformed);
        }
    }
    if at + rest.len() >= limits.max_total {
        return Err(ProtocolError::TooLarge);
    }
    Ok(None)
}

/// A canonical decimal: `0`, or digits without a leading zero, optionally after `-`.
fn number(text: &[u8]) -> Result<i64, ProtocolError> {
    let digits = text.strip_prefix(b"-").unwrap_or(text);
    let canonical = !digits.is_empty()
        && text.len() <= MAX_NUMBER_DIGITS
        && digits.iter().all(u8::is_ascii_digit)
        && (digits == b"0" || digits[0] != b'0')
        && text != b"-0";
    if !canonical {
        return Err(ProtocolError::Malformed);
    }
    std::str::from_utf8(text)
        .ok()
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or(ProtocolError::Malformed)
}

/// The end of the reply starting at `at` (`None`: incomplete), checking every limit.
fn scan(
    buf: &[u8],
    at: usize,
    depth: usize,
    limits: &Limits,
) -> Result<Option<usize>, ProtocolError> {
    if depth > limits.max_depth {
        return Err(ProtocolError::TooDeep);
    }
    let Some(&kind) = buf.get(at) else {
        return Ok(None);
    };
    if !matches!(kind, b'+' | b'-' | b':' | b'$' | b'*') {
        return Err(ProtocolError::Malformed);
    }
    let Some(eol) = line_end(buf, at + 1, limits)? else {
        return Ok(None);
    };
    let after_line = eol + 2;
    if after_line > limits.max_total {
        return Err(ProtocolError::TooLarge);
    }
    let text = &buf[at + 1..eol];
    match kind {
        b'+' | b'-' => Ok(Some(after_line)),
        b':' => number(text).map(|_| Some(after_line)),
        b'$' => {
            let len = number(text)?;
            if len == -1 {
                return Ok(Some(after_line));
            }
            let len = u64::try_from(len).map_err(|_| ProtocolError::Malformed)?;
            if len > limits.max_bulk as u64 {
                return Err(ProtocolError::BulkTooLong(len));
            }
            // Checked before reading a byte of it: the announced size alone can be refused.
            let end = (after_line as u64)
                .checked_add(len)
                .and_then(|e| e.checked_add(2))
                .filter(|&e| e <= limits.max_total as u64)
                .ok_or(ProtocolError::TooLarge)? as usize;
            match buf.get(end - 2..end) {
                None => {
                    // The bytes so far must not already break the framing.
                    if buf.len() > end - 2 && buf[end - 2] != b'\r' {
                        return Err(ProtocolError::Malformed);
                    }
                    Ok(None)
                }
                Some(b"\r\n") => Ok(Some(end)),
                Some(_) => Err(ProtocolError::Malformed),
            }
        }
        _ => {
            let len = number(text)?;
            if len == -1 {
                return Ok(Some(after_line));
            }
            let len = u64::try_from(len).map_err(|_| ProtocolError::Malformed)?;
            if len > limits.max_array as u64 {
                return Err(ProtocolError::ArrayTooLong(len));
            }
            // Every element takes at least 3 bytes (`+\r\n`).
            if (after_line as u64).saturating_add(len.saturating_mul(3)) > limits.max_total as u64 {
                return Err(ProtocolError::TooLarge);
            }
            let mut next = after_line;
            for _ in 0..len {
                match scan(buf, next, depth + 1, limits)? {
                    Some(end) => next = end,
                    None => return Ok(None),
                }
            }
            Ok(Some(next))
        }
    }
}

/// Builds the reply at `at` of bytes [`scan`] found complete and within the limits.
fn build(buf: &[u8], at: usize) -> Result<(Reply, usize), ProtocolError> {
    let malformed = || ProtocolError::Malformed;
    let kind = *buf.get(at).ok_or_else(malformed)?;
    let eol = at
        + 1
        + buf
            .get(at + 1..)
            .and_then(|rest| rest.iter().position(|&b| b == b'\r'))
            .ok_or_else(malformed)?;
    let text = &buf[at + 1..eol];
    let after_line = eol + 2;
    match kind {
        b'+' => Ok((Reply::Simple(text.to_vec()), after_line)),
        b'-' => Ok((Reply::Error(text.to_vec()), after_line)),
        b':' => Ok((Reply::Integer(number(text)?), after_line)),
        b'$' => match number(text)? {
            -1 => Ok((Reply::Bulk(None), after_line)),
            len => {
                let len = usize::try_from(len).map_err(|_| malformed())?;
                let data = buf
                    .get(after_line..after_line + len)
                    .ok_or_else(malformed)?;
                Ok((Reply::Bulk(Some(data.to_vec())), after_line + len + 2))
            }
        },
        b'*' => match number(text)? {
            -1 => Ok((Reply::Array(None), after_line)),
            len => {
                let len = usize::try_from(len).map_err(|_| malformed())?;
                // `len` was checked against max_array and the bytes present by `scan`.
                let mut items = Vec::with_capacity(len);
                let mut next = after_line;
                for _ in 0..len {
                    let (item, end) = build(buf, next)?;
                    items.push(item);
                    next = end;
                }
                Ok((Reply::Array(Some(items)), next))
            }
        },
        _ => Err(malformed()),
    }
}

/// The canonical bytes of `reply` (the inverse of [`parse`]).
pub fn encode(reply: &Reply) -> Vec<u8> {
    let mut out = Vec::new();
    encode_into(reply, &mut out);
    out
}

fn encode_into(reply: &Reply, out: &mut Vec<u8>) {
    match reply {
        Reply::Simple(text) => line(out, b'+', text),
        Reply::Error(text) => line(out, b'-', text),
        Reply::Integer(n) => line(out, b':', n.to_string().as_bytes()),
        Reply::Bulk(None) => out.extend_from_slice(b"$-1\r\n"),
        Reply::Bulk(Some(data)) => {
            line(out, b'$', data.len().to_string().as_bytes());
            out.extend_from_slice(data);
            out.extend_from_slice(b"\r\n");
        }
        Reply::Array(None) => out.extend_from_slice(b"*-1\r\n"),
        Reply::Array(Some(items)) => {
            line(out, b'*', items.len().to_string().as_bytes());
            for item in items {
                encode_into(item, out);
            }
        }
    }
}

fn line(out: &mut Vec<u8>, kind: u8, text: &[u8]) {
    out.push(kind);
    out.extend_from_slice(text);
    out.extend_from_slice(b"\r\n");
}

/// A command as RESP2 sends it: an array of bulk strings.
pub fn command(args: &[&[u8]]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + args.iter().map(|a| a.len() + 16).sum::<usize>());
    line(&mut out, b'*', args.len().to_string().as_bytes());
    for arg in args {
        line(&mut out, b'$', arg.len().to_string().as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_bulk: 16,
        max_array: 4,
        max_depth: 2,
        max_total: 64,
    };

    fn ok(bytes: &[u8]) -> Reply {
        match parse(bytes, &LIMITS) {
            Ok(Parsed::Reply(reply, used)) => {
                assert_eq!(used, bytes.len());
                assert_eq!(encode(&reply), bytes);
                reply
            }
            other => panic!("{other:?} for {:?}", String::from_utf8_lossy(bytes)),
        }
    }

    #[test]
    fn replies_parse_and_re_encode() {
        assert_eq!(ok(b"+OK\r\n"), Reply::Simple(b"OK".to_vec()));
        assert_eq!(ok(b"-ERR no\r\n"), Reply::Error(b"ERR no".to_vec()));
        assert_eq!(ok(b":-42\r\n"), Reply::Integer(-42));
        assert_eq!(ok(b"$-1\r\n"), Reply::Bulk(None));
        assert_eq!(ok(b"$0\r\n\r\n"), Reply::Bulk(Some(Vec::new())));
        assert_eq!(
            ok(b"$4\r\na\r\nb\r\n"),
            Reply::Bulk(Some(b"a\r\nb".to_vec()))
        );
        assert_eq!(
            ok(b"*2\r\n$1\r\nv\r\n:0\r\n"),
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"v".to_vec())),
                Reply::Integer(0)
            ]))
        );
        assert_eq!(ok(b"*-1\r\n"), Reply::Array(None));
    }

    #[test]
    fn every_prefix_of_a_reply_needs_more_and_trailing_bytes_are_left() {
        let bytes = b"*2\r\n$3\r\nabc\r\n:7\r\n";
        for cut in 0..bytes.len() {
            assert_eq!(parse(&bytes[..cut], &LIMITS), Ok(Parsed::NeedMore), "{cut}");
        }
        let mut two = bytes.to_vec();
        two.extend_from_slice(b"+OK\r\n");
        assert!(matches!(parse(&two, &LIMITS), Ok(Parsed::Reply(_, n)) if n == bytes.len()));
    }

    #[test]
    fn announced_sizes_over_the_limits_are_refused_before_their_bytes() {
        assert_eq!(
            parse(b"$2000000000\r\n", &LIMITS),
            Err(ProtocolError::BulkTooLong(2_000_000_000))
        );
        assert_eq!(
            parse(b"*2000000000\r\n", &LIMITS),
            Err(ProtocolError::ArrayTooLong(2_000_000_000))
        );
        assert_eq!(
            parse(b"*1\r\n*1\r\n*1\r\n", &LIMITS),
            Err(ProtocolError::TooDeep)
        );
        // Within each limit, but not together.
        assert_eq!(
            parse(b"*4\r\n$16\r\n", &LIMITS),
            Ok(Parsed::NeedMore),
            "a prefix within the total"
        );
        let total = b"*4\r\n$16\r\n0123456789abcdef\r\n$16\r\n0123456789abcdef\r\n$16\r\n";
        assert_eq!(parse(total, &LIMITS), Err(ProtocolError::TooLarge));
        // A line that never ends.
        assert_eq!(parse(&[b'+'; 64], &LIMITS), Err(ProtocolError::TooLarge));
        assert_eq!(parse(&[b'+'; 63], &LIMITS), Ok(Parsed::NeedMore));
    }

    #[test]
    fn non_canonical_or_foreign_bytes_are_malformed() {
        for bad in [
            &b"$01\r\na\r\n"[..],
            b"$+1\r\na\r\n",
            b"$-2\r\n",
            b":-0\r\n",
            b":007\r\n",
            b":\r\n",
            b"$1\r\nab\r\n",
            b"+a\nb\r\n",
            b"+a\rb\r\n",
            b"%1\r\n",
            b"_\r\n",
            b":99999999999999999999\r\n",
        ] {
            assert_eq!(
                parse(bad, &LIMITS),
                Err(ProtocolError::Malformed),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// The fuzz target's properties (fuzz/fuzz_targets/resp_reply.rs) over mutations of
    /// replies, so that a regression shows without a fuzzing toolchain.
    #[test]
    fn mutated_replies_keep_the_parser_properties() {
        let seeds: [&[u8]; 6] = [
            b"*3\r\n$8\r\nIVL2abcd\r\n:0\r\n$0\r\n\r\n",
            b"*2\r\n$0\r\n\r\n$6\r\nplant!\r\n",
            b"*2\r\n*1\r\n:-1\r\n+OK\r\n",
            b"$-1\r\n",
            b"-ERR x\r\n",
            b"$2000000000\r\n",
        ];
        let alphabet = b"$*:+-\r\n0129-x";
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut accepted = 0;
        for round in 0..20_000u32 {
            let mut bytes = seeds[round as usize % seeds.len()].to_vec();
            for _ in 0..(next() % 4) {
                let at = (next() as usize) % (bytes.len() + 1);
                let b = alphabet[(next() as usize) % alphabet.len()];
                match next() % 3 {
                    0 if at < bytes.len() => bytes[at] = b,
                    1 => bytes.insert(at, b),
                    _ => bytes.truncate(at),
                }
            }
            let limits = Limits {
                max_bulk: (next() % 12) as usize,
                max_array: (next() % 4) as usize,
                max_depth: (next() % 4) as usize,
                max_total: 4 + (next() % 40) as usize,
            };
            match parse(&bytes, &limits) {
                Err(_) => {}
                Ok(Parsed::NeedMore) => assert!(bytes.len() < limits.max_total),
                Ok(Parsed::Reply(reply, used)) => {
                    accepted += 1;
                    assert!(used <= limits.max_total);
                    assert_eq!(encode(&reply), &bytes[..used]);
                    assert_eq!(parse(&bytes[..used - 1], &limits), Ok(Parsed::NeedMore));
                }
            }
        }
        // The mutations must reach accepted replies, or the checks above check nothing.
        assert!(accepted > 1_000, "{accepted}");
    }

    #[test]
    fn commands_are_arrays_of_bulk_strings() {
        assert_eq!(
            command(&[b"GET", b"k"]),
            b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n".to_vec()
        );
    }
}
