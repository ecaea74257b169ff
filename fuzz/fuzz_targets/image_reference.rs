//! Image references (go-containerregistry rules) and Kyverno's normalisation.
//!
//! Property checks on today's parser, standing in for a differential check against a
//! canonical form: parsing keeps the input, normalisation is idempotent and preserves what
//! the reference names (registry, repository, tag, digest), the pinned form names the same
//! repository, and the oci-client reference the registry client fetches names the same
//! image when oci-client reads it back from its string form.
#![no_main]

use ivory_reference::ImageReference;
use libfuzzer_sys::fuzz_target;

const DIGEST: &str = "sha256:e2e16842c9b54d985bf1ef9242a313f36b856181f188de21313820e177002501";

/// What a reference names, as the registry client sees it.
fn identity(r: &ImageReference) -> (&str, &str, Option<&str>, Option<&str>) {
    (r.registry(), r.repository(), r.tag(), r.digest())
}

fn reparse(text: &str, what: &str, input: &str) -> ImageReference {
    match ImageReference::parse(text) {
        Ok(r) => r,
        Err(e) => panic!("{what} {text:?} of {input:?} does not parse: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(parsed) = ImageReference::parse(input) else {
        return;
    };
    assert_eq!(parsed.original(), input);
    assert_eq!(parsed.to_string(), input);
    assert_eq!(
        parsed.identifier(),
        parsed.digest().or(parsed.tag()).unwrap_or("latest")
    );

    let normalized = parsed.kyverno_normalized();
    let again = reparse(&normalized, "normalised form", input);
    assert_eq!(
        again.kyverno_normalized(),
        normalized,
        "normalisation is not idempotent for {input:?}"
    );
    assert_eq!(
        identity(&again),
        identity(&parsed),
        "normalisation of {input:?} changed the image"
    );

    let pinned = parsed.with_digest(DIGEST);
    let pinned_ref = reparse(&pinned, "pinned form", input);
    assert_eq!(
        (
            pinned_ref.registry(),
            pinned_ref.repository(),
            pinned_ref.digest()
        ),
        (parsed.registry(), parsed.repository(), Some(DIGEST)),
        "pinning {input:?} changed the repository"
    );
    assert_eq!(
        reparse(
            &pinned_ref.kyverno_normalized(),
            "normalised pinned form",
            input
        )
        .digest(),
        Some(DIGEST)
    );

    let fetched = ivory_registry::parse_reference(input)
        .unwrap_or_else(|e| panic!("registry client refuses {input:?} the parser accepted: {e}"));
    assert_eq!(
        (
            fetched.resolve_registry(),
            fetched.repository(),
            fetched.digest()
        ),
        (parsed.registry(), parsed.repository(), parsed.digest()),
        "registry client would fetch another image than {input:?}"
    );
    if let Ok(read_back) = fetched.whole().parse::<oci_client::Reference>() {
        assert_eq!(
            (
                read_back.resolve_registry(),
                read_back.repository(),
                read_back.digest()
            ),
            (
                fetched.resolve_registry(),
                fetched.repository(),
                fetched.digest()
            ),
            "oci-client reads {:?} (from {input:?}) as another image",
            fetched.whole()
        );
    }
});
