//! Tamper evidence: every value stored in the L2 is sealed with an HMAC-SHA256 over its name,
//! its expiry time and its bytes, under a key the replicas share (a Kubernetes Secret). Write
//! access to the store alone therefore cannot create a verdict, move one to another name
//! (another digest or attestor), or keep an old one alive past its lifetime.
//!
//! Two keys may be active so that the key can be rotated without a cold fleet: the first seals,
//! both open.
//!
//! Layout: `IVL2` | key id (8 bytes) | expiry (Unix ms, u64 big endian) | value | tag (32).

use aws_lc_rs::hmac;

use crate::Error;
use aws_lc_rs::rand::{SecureRandom as _, SystemRandom};

/// Shortest accepted key: a full SHA-256 block of entropy is expected from the Secret.
pub const MIN_KEY_BYTES: usize = 32;

const MAGIC: &[u8; 4] = b"IVL2";
const KEY_ID_LEN: usize = 8;
const EXPIRY_LEN: usize = 8;
const TAG_LEN: usize = 32;
const HEADER_LEN: usize = MAGIC.len() + KEY_ID_LEN + EXPIRY_LEN;
/// Bytes a sealed entry adds to its value.
pub(crate) const SEAL_OVERHEAD: usize = HEADER_LEN + TAG_LEN;
/// Domain separation of the MAC input from any other use of the same key.
const MAC_CONTEXT: &[u8] = b"ivory-l2 entry v1\0";
const NAME_CONTEXT: &[u8] = b"ivory-l2 name v1\0";

/// One HMAC key and its id.
struct Key {
    id: [u8; KEY_ID_LEN],
    mac: hmac::Key,
}

impl Key {
    fn new(bytes: &[u8]) -> Self {
        let id_hash = aws_lc_rs::digest::digest(
            &aws_lc_rs::digest::SHA256,
            &[b"ivory-l2 key id\0".as_slice(), bytes].concat(),
        );
        let mut id = [0u8; KEY_ID_LEN];
        id.copy_from_slice(&id_hash.as_ref()[..KEY_ID_LEN]);
        Self {
            id,
            mac: hmac::Key::new(hmac::HMAC_SHA256, bytes),
        }
    }
}

/// The active keys: the first seals, every one opens.
pub struct Keys {
    keys: Vec<Key>,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<String> = self.keys.iter().map(|k| hex::encode(k.id)).collect();
        f.debug_struct("Keys").field("ids", &ids).finish()
    }
}

/// Why a stored entry was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rejected {
    /// Not an entry at all (garbage, truncated, another format).
    Malformed,
    /// Sealed with a key that is not active here.
    UnknownKey,
    /// The tag does not match: modified, or moved from another name.
    BadTag,
    /// Past the lifetime sealed into it.
    Expired,
}

impl Keys {
    /// `keys` named by where they came from (for errors): first the sealing key, then at most
    /// one older key still accepted.
    pub fn new(keys: &[(String, Vec<u8>)]) -> Result<Self, Error> {
        if keys.is_empty() || keys.len() > 2 {
            return Err(Error::KeyCount(keys.len()));
        }
        let mut out = Vec::with_capacity(keys.len());
        for (what, bytes) in keys {
            if bytes.len() < MIN_KEY_BYTES {
                return Err(Error::KeyTooShort {
                    what: what.clone(),
                    len: bytes.len(),
                });
            }
            out.push(Key::new(bytes));
        }
        Ok(Self { keys: out })
    }

    fn sealing(&self) -> &Key {
        // `new` refuses an empty list.
        &self.keys[0]
    }

    /// `value` sealed for `name`, valid until `expires_ms` (Unix ms).
    pub fn seal(&self, name: &str, value: &[u8], expires_ms: u64) -> Vec<u8> {
        let key = self.sealing();
        let mut out = Vec::with_capacity(HEADER_LEN + value.len() + TAG_LEN);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&key.id);
        out.extend_from_slice(&expires_ms.to_be_bytes());
        out.extend_from_slice(value);
        let tag = hmac::sign(&key.mac, &mac_input(name, &out));
        out.extend_from_slice(tag.as_ref());
        out
    }

    /// The value of an entry stored under `name`, if it was sealed for that name by an active
    /// key and has not expired at `now_ms`.
    pub fn open<'e>(&self, name: &str, entry: &'e [u8], now_ms: u64) -> Result<&'e [u8], Rejected> {
        self.open_with_expiry(name, entry, now_ms)
            .map(|(value, _)| value)
    }

    /// [`Keys::open`], and the expiry sealed into the entry (Unix ms).
    pub fn open_with_expiry<'e>(
        &self,
        name: &str,
        entry: &'e [u8],
        now_ms: u64,
    ) -> Result<(&'e [u8], u64), Rejected> {
        if entry.len() < HEADER_LEN + TAG_LEN || !entry.starts_with(MAGIC) {
            return Err(Rejected::Malformed);
        }
        let (sealed, tag) = entry.split_at(entry.len() - TAG_LEN);
        let id = &sealed[MAGIC.len()..MAGIC.len() + KEY_ID_LEN];
        let key = self
            .keys
            .iter()
            .find(|k| k.id == id)
            .ok_or(Rejected::UnknownKey)?;
        hmac::verify(&key.mac, &mac_input(name, sealed), tag).map_err(|_| Rejected::BadTag)?;
        let mut expiry = [0u8; EXPIRY_LEN];
        expiry.copy_from_slice(&sealed[MAGIC.len() + KEY_ID_LEN..HEADER_LEN]);
        let expires_ms = u64::from_be_bytes(expiry);
        if expires_ms <= now_ms {
            return Err(Rejected::Expired);
        }
        Ok((&sealed[HEADER_LEN..], expires_ms))
    }

    /// HMAC of secret material under the sealing key, for use inside names.
    pub fn keyed_hash(&self, secret: &[u8]) -> [u8; 32] {
        let tag = hmac::sign(&self.sealing().mac, &[NAME_CONTEXT, secret].concat());
        let mut out = [0u8; 32];
        out.copy_from_slice(tag.as_ref());
        out
    }
}

/// What the tag covers: the context, the name (length-prefixed) and the sealed bytes.
fn mac_input(name: &str, sealed: &[u8]) -> Vec<u8> {
    let mut input = Vec::with_capacity(MAC_CONTEXT.len() + 8 + name.len() + sealed.len());
    input.extend_from_slice(MAC_CONTEXT);
    input.extend_from_slice(&(name.len() as u64).to_be_bytes());
    input.extend_from_slice(name.as_bytes());
    input.extend_from_slice(sealed);
    input
}

/// A random lease token (hex): whoever holds the lease can prove it when releasing.
pub(crate) fn lease_token() -> String {
    let mut bytes = [0u8; 16];
    // The system source failing is not recoverable here; a fixed token would only make two
    // replicas' releases indistinguishable, which costs a duplicate load, never a verdict.
    let _ = SystemRandom::new().fill(&mut bytes);
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(list: &[&[u8]]) -> Keys {
        let named: Vec<(String, Vec<u8>)> = list
            .iter()
            .enumerate()
            .map(|(i, k)| (format!("key{i}"), k.to_vec()))
            .collect();
        Keys::new(&named).unwrap_or_else(|e| panic!("{e}"))
    }

    const A: &[u8] = b"0123456789abcdef0123456789abcdef-A";
    const B: &[u8] = b"0123456789abcdef0123456789abcdef-B";

    #[test]
    fn sealed_entries_open_only_under_their_name_and_key() {
        let k = keys(&[A]);
        let entry = k.seal("n1", b"verified", 2_000);
        assert_eq!(k.open("n1", &entry, 1_000), Ok(b"verified".as_slice()));
        assert_eq!(
            k.open_with_expiry("n1", &entry, 1_000),
            Ok((b"verified".as_slice(), 2_000))
        );
        assert_eq!(k.open("n2", &entry, 1_000), Err(Rejected::BadTag));
        assert_eq!(k.open("n1", &entry, 2_000), Err(Rejected::Expired));
        let mut changed = entry.clone();
        let at = HEADER_LEN;
        changed[at] ^= 1;
        assert_eq!(k.open("n1", &changed, 1_000), Err(Rejected::BadTag));
        // A longer life written by someone without the key does not verify either.
        let mut extended = entry.clone();
        extended[MAGIC.len() + KEY_ID_LEN] ^= 0x80;
        assert_eq!(k.open("n1", &extended, 1_000), Err(Rejected::BadTag));
        assert_eq!(k.open("n1", b"garbage", 1_000), Err(Rejected::Malformed));
        assert_eq!(
            keys(&[B]).open("n1", &entry, 1_000),
            Err(Rejected::UnknownKey)
        );
    }

    #[test]
    fn rotation_keeps_both_keys_readable() {
        let old = keys(&[A]);
        let rotating = keys(&[B, A]);
        let by_old = old.seal("n", b"v", 10);
        let by_new = rotating.seal("n", b"v", 10);
        assert_eq!(rotating.open("n", &by_old, 1), Ok(b"v".as_slice()));
        assert_eq!(rotating.open("n", &by_new, 1), Ok(b"v".as_slice()));
        assert_eq!(old.open("n", &by_new, 1), Err(Rejected::UnknownKey));
    }

    #[test]
    fn keys_are_checked() {
        assert_eq!(
            Keys::new(&[("secret/l2-key".into(), b"short".to_vec())]).map(|_| ()),
            Err(Error::KeyTooShort {
                what: "secret/l2-key".into(),
                len: 5
            })
        );
        assert_eq!(Keys::new(&[]).map(|_| ()), Err(Error::KeyCount(0)));
        let three = vec![("k".to_owned(), A.to_vec()); 3];
        assert_eq!(Keys::new(&three).map(|_| ()), Err(Error::KeyCount(3)));
    }

    #[test]
    fn keyed_hashes_depend_on_the_key() {
        assert_ne!(keys(&[A]).keyed_hash(b"pw"), keys(&[B]).keyed_hash(b"pw"));
        assert_ne!(keys(&[A]).keyed_hash(b"pw"), keys(&[A]).keyed_hash(b"pw2"));
    }
}
