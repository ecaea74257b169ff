//! Sigstore bundles (v0.1 to v0.3) as found among an image's OCI referrers.
//!
//! Every input is evaluated as a bundle by a keyless attestor under the fixtures' trust root
//! and by a key attestor the input cannot have been signed for (with and without the
//! transparency log), which must refuse it. When the input is a JSON bundle with a DSSE
//! envelope, a copy re-signed by the harness key is evaluated too, reaching the statement
//! checks: accepted only when the subject names the image and the predicate type matches.
#![no_main]

use std::sync::LazyLock;

use base64::Engine as _;
use ivory_fuzz::{DIGEST, PREDICATE, Signer, key_plan, keyless_plan, pae};
use ivory_verify::{Envelope, Plan, evaluate};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};

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

/// `bundle` with its DSSE signature replaced by the harness key's; `None` without one.
fn resigned(f: &Fixture, bundle: &[u8]) -> Option<Vec<u8>> {
    let mut doc: Value = serde_json::from_slice(bundle).ok()?;
    let env = doc.get_mut("dsseEnvelope")?;
    let payload_type = env.get("payloadType")?.as_str()?.to_owned();
    let payload = base64::engine::general_purpose::STANDARD
        .decode(env.get("payload")?.as_str()?)
        .ok()?;
    let sig = f.signer.sign_b64(&pae(&payload_type, &payload));
    env["signatures"] = json!([{ "keyid": "", "sig": sig }]);
    Some(doc.to_string().into_bytes())
}

fn names_digest(statement: &Value) -> bool {
    statement["subject"].as_array().is_some_and(|subjects| {
        subjects.iter().any(|s| {
            s.pointer("/digest/sha256")
                .and_then(Value::as_str)
                .is_some_and(|d| d.eq_ignore_ascii_case(&DIGEST["sha256:".len()..]))
        })
    })
}

fuzz_target!(|data: &[u8]| {
    let f = &*FIXTURE;
    let env = [Envelope::Bundle(data.to_vec())];
    for predicate in [None, Some(PREDICATE)] {
        let _ = evaluate(&f.keyless, DIGEST, &env, predicate);
        assert!(
            evaluate(&f.offline, DIGEST, &env, predicate).is_err(),
            "a key attestor accepted a bundle its key did not sign"
        );
        assert!(
            evaluate(&f.with_tlog, DIGEST, &env, predicate).is_err(),
            "a key attestor accepted a bundle its key did not sign"
        );
    }
    let Some(signed) = resigned(f, data) else {
        return;
    };
    let env = [Envelope::Bundle(signed)];
    if let Ok(accepted) = evaluate(&f.offline, DIGEST, &env, Some(PREDICATE)) {
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
    if evaluate(&f.offline, DIGEST, &env, None).is_ok() {
        let doc: Value = serde_json::from_slice(data).expect("accepted bundle is JSON");
        let payload = base64::engine::general_purpose::STANDARD
            .decode(doc["dsseEnvelope"]["payload"].as_str().unwrap_or_default())
            .expect("accepted payload is base64");
        let st: Value = serde_json::from_slice(&payload).expect("accepted statement is JSON");
        assert!(
            names_digest(&st),
            "accepted a signature statement about another image"
        );
    }
});
