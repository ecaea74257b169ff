//! A JSON reader for serde's derived types, for the subset of JSON an API server writes, that
//! skips the values a type does not read at the speed of a scan.
//!
//! Hand-written (docs/ARCHITECTURE.md's rule), beside serde_json, for one reason: a review's
//! parse reads a few fields of a 4 KiB body and skips the rest, and serde_json's skip costs
//! ~110 instructions per skipped string (BENCHMARKS.md, issue 47): half of the parse. This
//! reader finds a string's end a word (eight bytes) at a time.
//!
//! It reads exactly what serde_json reads, or refuses: every input outside its subset is an
//! [`Outside`] error, and the caller reads the text again with serde_json, which then answers
//! (a value, or the error that names line and column) as it always did. Outside the subset:
//! an escape in a string a type reads (skipped strings may hold the short escapes), any `\u`
//! escape, a number with a fraction or an exponent where one is read, an integer past 64 bits,
//! nesting deeper than [`MAX_DEPTH`], a struct written as a list, serde_json's own types
//! (`RawValue`), and any text that is not JSON. Oracle: the property tests below against
//! serde_json, and the review's own (`ivory_engine::admission`).

use std::fmt;

use serde::de::value::BorrowedStrDeserializer;
use serde::de::{self, DeserializeSeed, MapAccess, SeqAccess, Visitor};

/// Containers nested deeper than this are outside the subset (serde_json's own limit is 128).
pub const MAX_DEPTH: usize = 64;

/// The text is outside this reader's subset, or is not what the type reads: read it with
/// serde_json, which says which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outside;

impl fmt::Display for Outside {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("outside the fast JSON reader's subset")
    }
}

impl std::error::Error for Outside {}

impl de::Error for Outside {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Outside
    }
}

type Result<T> = std::result::Result<T, Outside>;

/// Reads a `T` from `text`, or says it is [`Outside`] the subset (see the module docs).
pub fn from_str<'de, T: de::Deserialize<'de>>(text: &'de str) -> Result<T> {
    let mut reader = Reader {
        bytes: text.as_bytes(),
        text,
        at: 0,
        depth: 0,
    };
    let value = T::deserialize(&mut reader)?;
    reader.whitespace();
    if reader.at == reader.bytes.len() {
        Ok(value)
    } else {
        Err(Outside)
    }
}

struct Reader<'de> {
    bytes: &'de [u8],
    text: &'de str,
    at: usize,
    depth: usize,
}

/// Bytes in a string that end a plain run: the quote, the backslash, control characters.
#[inline]
fn ends_run(byte: u8) -> bool {
    byte == b'"' || byte == b'\\' || byte < 0x20
}

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The bytes of `word` that are zero, as their high bits; the lowest set bit is exactly the
/// first zero byte (higher ones may be false, from a borrow: only the lowest is read).
#[inline]
fn zeros(word: u64) -> u64 {
    word.wrapping_sub(ONES) & !word & HIGHS
}

/// The bytes of `word` that end a plain run ([`ends_run`]), as [`zeros`] marks them.
#[inline]
fn run_ends(word: u64) -> u64 {
    let below_space = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    below_space | zeros(word ^ (ONES * u64::from(b'"'))) | zeros(word ^ (ONES * u64::from(b'\\')))
}

impl<'de> Reader<'de> {
    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    #[inline]
    fn whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.at += 1;
        }
    }

    /// The next byte after whitespace.
    #[inline]
    fn next_token(&mut self) -> Result<u8> {
        self.whitespace();
        self.peek().ok_or(Outside)
    }

    #[inline]
    fn expect(&mut self, byte: u8) -> Result<()> {
        if self.next_token()? == byte {
            self.at += 1;
            Ok(())
        } else {
            Err(Outside)
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<()> {
        if self.bytes.get(self.at..self.at + word.len()) == Some(word) {
            self.at += word.len();
            Ok(())
        } else {
            Err(Outside)
        }
    }

    /// Moves past plain string bytes to the next quote, backslash or control character, a
    /// word at a time, and returns that byte.
    #[inline]
    fn run(&mut self) -> Result<u8> {
        let bytes = self.bytes;
        let mut at = self.at;
        while let Some(word) = bytes.get(at..).and_then(<[u8]>::first_chunk::<8>) {
            let ends = run_ends(u64::from_le_bytes(*word));
            if ends != 0 {
                at += (ends.trailing_zeros() / 8) as usize;
                self.at = at;
                return bytes.get(at).copied().ok_or(Outside);
            }
            at += 8;
        }
        while let Some(&byte) = bytes.get(at) {
            if ends_run(byte) {
                self.at = at;
                return Ok(byte);
            }
            at += 1;
        }
        Err(Outside)
    }

    /// A string without escapes, borrowed (the opening quote is next).
    #[inline(always)]
    fn plain_string(&mut self) -> Result<&'de str> {
        self.expect(b'"')?;
        let start = self.at;
        match self.run()? {
            b'"' => {
                let text = self.text.get(start..self.at).ok_or(Outside)?;
                self.at += 1;
                Ok(text)
            }
            _ => Err(Outside),
        }
    }

    /// Skips a string, which may hold the short escapes (the opening quote is next).
    #[inline(always)]
    fn skip_string(&mut self) -> Result<()> {
        self.at += 1;
        loop {
            match self.run()? {
                b'"' => {
                    self.at += 1;
                    return Ok(());
                }
                b'\\' => match self.bytes.get(self.at + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => self.at += 2,
                    _ => return Err(Outside),
                },
                _ => return Err(Outside),
            }
        }
    }

    /// Moves past a number (JSON's grammar); returns whether it was an integer.
    fn number(&mut self) -> Result<bool> {
        if self.peek() == Some(b'-') {
            self.at += 1;
        }
        match self.peek() {
            Some(b'0') => self.at += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(Outside),
        }
        let mut integer = true;
        if self.peek() == Some(b'.') {
            self.at += 1;
            self.one_or_more_digits()?;
            integer = false;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.at += 1;
            }
            self.one_or_more_digits()?;
            integer = false;
        }
        Ok(integer)
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
    }

    fn one_or_more_digits(&mut self) -> Result<()> {
        match self.peek() {
            Some(b'0'..=b'9') => {
                self.digits();
                Ok(())
            }
            _ => Err(Outside),
        }
    }

    fn enter(&mut self) -> Result<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            Err(Outside)
        } else {
            Ok(())
        }
    }

    /// Skips one value of any kind.
    fn skip_value(&mut self) -> Result<()> {
        match self.next_token()? {
            b'"' => self.skip_string(),
            b'{' => self.skip_container(b'}', true),
            b'[' => self.skip_container(b']', false),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number().map(|_| ()),
            _ => Err(Outside),
        }
    }

    /// Skips the object (`keyed`) or list that opens at the next byte and ends with `close`.
    #[inline(always)]
    fn skip_container(&mut self, close: u8, keyed: bool) -> Result<()> {
        self.enter()?;
        self.at += 1;
        if self.next_token()? != close {
            loop {
                if keyed {
                    if self.next_token()? != b'"' {
                        return Err(Outside);
                    }
                    self.skip_string()?;
                    self.expect(b':')?;
                }
                // Most values of an object are strings: skipped here, without a call.
                if self.next_token()? == b'"' {
                    self.skip_string()?;
                } else {
                    self.skip_value()?;
                }
                match self.next_token()? {
                    b',' => self.at += 1,
                    byte if byte == close => break,
                    _ => return Err(Outside),
                }
            }
        }
        self.at += 1;
        self.depth -= 1;
        Ok(())
    }

    /// An integer as serde_json hands it to a visitor (`u64`, or `i64` when negative).
    fn integer<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        let start = self.at;
        if !self.number()? {
            return Err(Outside);
        }
        let lexeme = self.text.get(start..self.at).ok_or(Outside)?;
        // `-0` is a float to serde_json: outside.
        if let Some(magnitude) = lexeme.strip_prefix('-') {
            if magnitude == "0" {
                return Err(Outside);
            }
            visitor.visit_i64(lexeme.parse().map_err(|_| Outside)?)
        } else {
            visitor.visit_u64(lexeme.parse().map_err(|_| Outside)?)
        }
    }

    /// `{`…`}` through `visitor`, which must read every entry.
    fn map<V: Visitor<'de>>(&mut self, visitor: V) -> Result<V::Value> {
        self.within(b'{', b'}', |entries| visitor.visit_map(entries))
    }

    /// The container between `open` and `close`, its entries read by `read`.
    #[inline(always)]
    fn within<T>(
        &mut self,
        open: u8,
        close: u8,
        read: impl FnOnce(Entries<'_, 'de>) -> Result<T>,
    ) -> Result<T> {
        self.expect(open)?;
        self.enter()?;
        let value = read(Entries {
            reader: self,
            first: true,
        })?;
        self.expect(close)?;
        self.depth -= 1;
        Ok(value)
    }
}

/// A map's entries or a list's items, after the opening bracket.
struct Entries<'r, 'de> {
    reader: &'r mut Reader<'de>,
    first: bool,
}

impl Entries<'_, '_> {
    /// Whether another entry follows (`close` ends the container, which is left unread).
    #[inline]
    fn has_next(&mut self, close: u8) -> Result<bool> {
        let next = self.reader.next_token()?;
        if next == close {
            return Ok(false);
        }
        if self.first {
            self.first = false;
            return Ok(true);
        }
        if next != b',' {
            return Err(Outside);
        }
        self.reader.at += 1;
        if self.reader.next_token()? == close {
            return Err(Outside);
        }
        Ok(true)
    }
}

impl<'de> MapAccess<'de> for Entries<'_, 'de> {
    type Error = Outside;

    fn next_key_seed<K: DeserializeSeed<'de>>(&mut self, seed: K) -> Result<Option<K::Value>> {
        if !self.has_next(b'}')? {
            return Ok(None);
        }
        let key = self.reader.plain_string()?;
        self.reader.expect(b':')?;
        seed.deserialize(BorrowedStrDeserializer::<Outside>::new(key))
            .map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value> {
        seed.deserialize(&mut *self.reader)
    }
}

impl<'de> SeqAccess<'de> for Entries<'_, 'de> {
    type Error = Outside;

    fn next_element_seed<T: DeserializeSeed<'de>>(&mut self, seed: T) -> Result<Option<T::Value>> {
        if !self.has_next(b']')? {
            return Ok(None);
        }
        seed.deserialize(&mut *self.reader).map(Some)
    }
}

impl<'de> de::Deserializer<'de> for &mut Reader<'de> {
    type Error = Outside;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.next_token()? {
            b'"' => visitor.visit_borrowed_str(self.plain_string()?),
            b'{' => self.map(visitor),
            b'[' => self.deserialize_seq(visitor),
            b't' => {
                self.literal(b"true")?;
                visitor.visit_bool(true)
            }
            b'f' => {
                self.literal(b"false")?;
                visitor.visit_bool(false)
            }
            b'n' => {
                self.literal(b"null")?;
                visitor.visit_unit()
            }
            b'-' | b'0'..=b'9' => self.integer(visitor),
            _ => Err(Outside),
        }
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        match self.next_token()? {
            b't' | b'f' => self.deserialize_any(visitor),
            _ => Err(Outside),
        }
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        visitor.visit_borrowed_str(self.plain_string()?)
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.next_token()? == b'n' {
            self.literal(b"null")?;
            visitor.visit_none()
        } else {
            visitor.visit_some(self)
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        if self.next_token()? != b'n' {
            return Err(Outside);
        }
        self.literal(b"null")?;
        visitor.visit_unit()
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.within(b'[', b']', |entries| visitor.visit_seq(entries))
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.map(visitor)
    }

    /// Only as an object: serde_json also reads a struct from a list of its fields, which is
    /// outside the subset.
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        self.map(visitor)
    }

    /// Unit variants, written as strings; anything else is outside the subset.
    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value> {
        let name = self.plain_string()?;
        visitor.visit_enum(BorrowedStrDeserializer::<Outside>::new(name))
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.skip_value()?;
        visitor.visit_unit()
    }

    /// serde_json's own types (`RawValue`, its arbitrary-precision numbers) are outside the
    /// subset; other newtypes are their content.
    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        visitor: V,
    ) -> Result<V::Value> {
        if name.starts_with("$serde_json") {
            return Err(Outside);
        }
        visitor.visit_newtype_struct(self)
    }

    /// Floats are read only when written as integers (a fraction or an exponent is outside).
    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_any(visitor)
    }

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value> {
        self.deserialize_any(visitor)
    }

    serde::forward_to_deserialize_any! {
        i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 char bytes byte_buf unit_struct tuple
        tuple_struct
    }
}

#[cfg(test)]
mod tests;
