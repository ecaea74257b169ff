//! Notation JWS envelopes (`application/jose+json`): `ivory_verify::notation::envelope::parse_jws`.
//!
//! Checked properties besides "no panic": an accepted envelope keeps the specification's
//! invariants its parser promises (at most `MAX_CHAIN` certificates, a signing time for
//! `notary.x509`, an authentic signing time for `notary.x509.signingAuthority`), and its signed
//! bytes are the JWS signing input (`protected.payload`, ASCII, one dot).
#![no_main]

use ivory_fuzz::notation_invariants;
use ivory_verify::notation::envelope::parse_jws;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(env) = parse_jws(data) {
        notation_invariants(&env);
        assert!(env.signed_bytes.is_ascii(), "JWS signing input is not ASCII");
        assert_eq!(
            env.signed_bytes.iter().filter(|b| **b == b'.').count(),
            1,
            "JWS signing input is not protected.payload"
        );
    }
});
