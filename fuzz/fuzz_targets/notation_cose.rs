//! Notation COSE envelopes (`application/cose`, tagged COSE_Sign1):
//! `ivory_verify::notation::envelope::parse_cose`.
//!
//! Checked properties besides "no panic": an accepted envelope keeps the specification's
//! invariants (see `notation_invariants`), and its signed bytes are a `Sig_structure` that
//! starts with the CBOR array header and the text "Signature1" and ends with the payload.
#![no_main]

use ivory_fuzz::notation_invariants;
use ivory_verify::notation::envelope::parse_cose;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = parse_cose(data) {
        notation_invariants(&env);
        assert!(
            env.signed_bytes.starts_with(b"\x84\x6aSignature1"),
            "Sig_structure does not start with its context"
        );
        assert!(
            env.signed_bytes.ends_with(&env.payload),
            "Sig_structure does not end with the payload"
        );
    }
});
