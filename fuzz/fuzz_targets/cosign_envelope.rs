//! cosign's legacy signature layers: simple-signing payloads (`.sig`) and DSSE envelopes
//! (`.att`), with the annotations cosign writes next to them.
//!
//! The first byte picks the mode:
//! * 0: the rest is a simple-signing payload, signed by the harness key;
//! * 1: the rest is an in-toto statement, wrapped in a DSSE envelope signed by the harness key;
//! * else: the rest is a raw layer, `blob NUL signature NUL certificate NUL chain NUL
//!   rekor-bundle`, read as `.sig` (even mode byte) or `.att` (odd), not signed by the harness.
//!
//! Checked properties: a signed payload is accepted only when it names the image digest and
//! carries the required annotation; a statement only when its subject names the digest (and,
//! for attestations, its predicate type is the one asked for); nothing the harness did not
//! sign is ever accepted by its key.
#![no_main]

use std::sync::LazyLock;

use base64::Engine as _;
use ivory_fuzz::{ANNOTATION, DIGEST, PREDICATE, Signer, key_plan, keyless_plan, pae};
use ivory_verify::{Envelope, Legacy, Plan, evaluate};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

const IN_TOTO: &str = "application/vnd.in-toto+json";

struct Fixture {
    signer: Signer,
    offline: Plan,
    with_tlog: Plan,
    keyless: Plan,
}

static FIXTURE: LazyLock<Fixture> = LazyLock::new(|| {
    let signer = Signer::new();
    let pem = signer.public_pem();
    Fixture {
        offline: key_plan(&pem, true),
        with_tlog: key_plan(&pem, false),
        keyless: keyless_plan(),
        signer,
    }
});

fn names_digest(statement: &Value) -> bool {
    statement["subject"].as_array().is_some_and(|subjects| {
        subjects.iter().any(|s| {
            s.pointer("/digest/sha256")
                .and_then(Value::as_str)
                .is_some_and(|d| d.eq_ignore_ascii_case(&DIGEST["sha256:".len()..]))
        })
    })
}

fn simple_signing(f: &Fixture, payload: &[u8]) {
    let env = Envelope::SimpleSigning(Legacy {
        blob: payload.to_vec(),
        signature: Some(f.signer.sign_b64(payload)),
        ..Legacy::default()
    });
    if evaluate(&f.offline, DIGEST, std::slice::from_ref(&env), None).is_ok() {
        // ivory, like cosign's Go decoder, skips the fields it does not read, even when they
        // hold invalid UTF-8 (crash-a64c82dc, a harness error); read the payload as Go would.
        let text = String::from_utf8_lossy(payload);
        match serde_json::from_str::<Value>(&text) {
            Ok(doc) => {
                assert_eq!(
                    doc.pointer("/critical/image/docker-manifest-digest"),
                    Some(&json!(DIGEST)),
                    "accepted a payload for another digest"
                );
                let annotation = doc.pointer(&format!("/optional/{}", ANNOTATION.0));
                assert!(
                    annotation.is_some_and(|v| v == ANNOTATION.1 || v.to_string() == ANNOTATION.1),
                    "accepted a payload without the required annotation"
                );
            }
            // Escapes serde_json refuses (lone surrogates) in fields ivory skips.
            Err(_) => assert!(
                text.contains(DIGEST),
                "accepted a payload for another digest"
            ),
        }
    }
    assert!(evaluate(&f.offline, DIGEST, &[env], Some(PREDICATE)).is_err());
}

fn dsse(f: &Fixture, statement: &[u8]) {
    let b64 = base64::engine::general_purpose::STANDARD;
    let envelope = json!({
        "payloadType": IN_TOTO,
        "payload": b64.encode(statement),
        "signatures": [{ "keyid": "", "sig": f.signer.sign_b64(&pae(IN_TOTO, statement)) }],
    });
    let env = Envelope::Dsse(Legacy {
        blob: envelope.to_string().into_bytes(),
        ..Legacy::default()
    });
    let envs = std::slice::from_ref(&env);
    if let Ok(accepted) = evaluate(&f.offline, DIGEST, envs, Some(PREDICATE)) {
        let st = accepted
            .statement
            .expect("an attestation verdict carries its statement");
        assert_eq!(
            st["predicateType"],
            json!(PREDICATE),
            "wrong predicate type accepted"
        );
        assert!(
            names_digest(&st),
            "accepted a statement about another image"
        );
    }
    // `.att` layers are never signatures.
    assert!(evaluate(&f.offline, DIGEST, envs, None).is_err());
}

fn raw_layer(f: &Fixture, as_dsse: bool, rest: &[u8]) {
    let mut fields = rest.split(|b| *b == 0);
    let blob = fields.next().unwrap_or_default().to_vec();
    let mut text = || {
        fields
            .next()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .filter(|s| !s.is_empty())
    };
    let legacy = Legacy {
        blob,
        signature: text(),
        certificate: text(),
        chain: text(),
        rekor_bundle: text(),
    };
    let env = if as_dsse {
        Envelope::Dsse(legacy)
    } else {
        Envelope::SimpleSigning(legacy)
    };
    let envs = std::slice::from_ref(&env);
    for predicate in [None, Some(PREDICATE)] {
        assert!(
            evaluate(&f.offline, DIGEST, envs, predicate).is_err(),
            "the harness key accepted a layer it did not sign"
        );
        assert!(
            evaluate(&f.with_tlog, DIGEST, envs, predicate).is_err(),
            "the harness key accepted a layer it did not sign"
        );
        let _ = evaluate(&f.keyless, DIGEST, envs, predicate);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let f = &*FIXTURE;
    match mode {
        0 => simple_signing(f, rest),
        1 => dsse(f, rest),
        m => raw_layer(f, m % 2 == 1, rest),
    }
});
