//! Image references (go-containerregistry rules) and Kyverno's normalisation.
//!
//! Property checks on the parser: parsing keeps the input, normalisation is idempotent and
//! preserves what the reference names (registry, repository, tag, digest), the pinned form
//! names the same repository, and the oci-client reference the registry client fetches names
//! the same image when oci-client reads it back from its string form.
//!
//! Differential checks of the canonical form that policies match on (docs/SECURITY.md,
//! "Image spelling"): it is idempotent for any string, it is among the spellings an image is
//! matched under, a valid reference stays valid with its tag and digest, and Kyverno's
//! normalisation of the reference as written and of its canonical form agree canonically.
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

/// The canonical spelling, checked against the other spellings an image is matched under.
fn check_canonical(input: &str) {
    let canonical = ivory_reference::canonical(input);
    assert_eq!(
        ivory_reference::canonical(&canonical),
        canonical,
        "canonical form of {input:?} is not idempotent"
    );
    if canonical != input {
        assert!(
            ivory_reference::alternative_spellings(input).contains(&canonical.to_string()),
            "{input:?} is not matched under its canonical form {canonical:?}"
        );
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(input) = std::str::from_utf8(data) else {
        return;
    };
    check_canonical(input);
    let Ok(parsed) = ImageReference::parse(input) else {
        return;
    };
    let canonical = ivory_reference::canonical(input);
    let Ok(canonical_ref) = ImageReference::parse(&canonical) else {
        // go-containerregistry limits the repository as written; `library/` filled in can
        // take a Docker Hub name that was within the limit past it. Matching is on strings.
        let repository = canonical.split_once('/').map_or("", |(_, path)| path);
        assert!(
            repository.starts_with("library/") && repository.len() > 255,
            "canonical form {canonical:?} of {input:?} does not parse"
        );
        return;
    };
    assert_eq!(
        (canonical_ref.tag(), canonical_ref.digest()),
        (parsed.tag(), parsed.digest()),
        "the canonical form of {input:?} changed its tag or digest"
    );
    assert_eq!(
        ivory_reference::canonical(&parsed.kyverno_normalized()),
        ivory_reference::canonical(&canonical_ref.kyverno_normalized()),
        "Kyverno's normalisation of {input:?} and of its canonical form disagree"
    );
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

    // The registry client parses with the same crate now (one image reference type); what it
    // would fetch must still be what every other part judged.
    let fetched = ivory_registry::parse_reference(input)
        .unwrap_or_else(|e| panic!("registry client refuses {input:?} the parser accepted: {e}"));
    assert_eq!(
        (fetched.registry(), fetched.repository(), fetched.digest()),
        (parsed.registry(), parsed.repository(), parsed.digest()),
        "registry client would fetch another image than {input:?}"
    );
});
