//! Image data an expression asked for after the prefetch: images of the request outside the
//! policy's `matchImageReferences`, strings an expression builds, any image an expression names
//! that the prefetch did not cover (Kyverno's `image.GetMetadata` answers for any image; the
//! policy's own images and literals are prefetched). Fetched through the same verifier
//! (its caches, coalescing and byte caps), under the request deadline, and bounded per request:
//! the request now chooses which registry ivory asks, so it must not choose how often or
//! where to (see SECURITY.md, "Image data the request chooses").

use std::collections::BTreeSet;
use std::net::IpAddr;

use tokio::time::Instant;

use super::plan::Plan;
use super::prefetch::{self, JobSet, LateImageData, Outcome, Refusal};
use crate::verifier::{ImageReference, ImageVerifier};

/// Rounds of late fetches per request: one for what the first evaluation names, one more for
/// an image named from another image's data.
pub(super) const MAX_ROUNDS: usize = 2;

/// Distinct images whose data is fetched late, per request: every container of a large Pod
/// and a policy's literals, but not an unbounded fan-out chosen by the request.
pub(super) const MAX_LATE_IMAGES: usize = 32;

/// Fetches the image data each plan wants, at most [`MAX_LATE_IMAGES`] distinct images per
/// request (`seen` carries the count across rounds), and stores the answers (or why ivory did
/// not ask) in the plans' `late_image_data`.
pub(super) async fn fetch(
    verifier: &dyn ImageVerifier,
    wants: &mut [(&mut Plan<'_>, BTreeSet<String>)],
    seen: &mut BTreeSet<String>,
    started: Instant,
    deadline: Instant,
) {
    let mut jobs = JobSet::default();
    let mut asked = Vec::new();
    for (index, (plan, images)) in wants.iter_mut().enumerate() {
        let Some(platform) = plan.platform().cloned() else {
            continue;
        };
        for image in std::mem::take(images) {
            let reference = match admitted(&image, seen) {
                Ok(reference) => reference,
                Err(why) => {
                    plan.late_image_data
                        .insert(image, LateImageData::Refused(why));
                    continue;
                }
            };
            let job = jobs.image_data(
                reference,
                plan.policy.credentials().cloned(),
                &plan.facts.credentials_key,
                platform.clone(),
            );
            asked.push((index, image, job));
        }
    }
    if jobs.is_empty() {
        return;
    }
    let count = jobs.len();
    let outcomes = prefetch::run(verifier, &jobs, started, deadline)
        .await
        .into_outcomes();
    tracing::debug!(calls = count, elapsed = ?started.elapsed(), "late image data fetched");
    for (index, image, job) in asked {
        let answer = match outcomes.get(job) {
            Some(Outcome::ImageData(answer)) => LateImageData::Answer(answer.clone()),
            _ => LateImageData::Refused(Refusal::NotFetched {
                image: image.clone(),
            }),
        };
        if let Some((plan, _)) = wants.get_mut(index) {
            plan.late_image_data.insert(image, answer);
        }
    }
}

/// `image` parsed, once, where an expression named it, and counted in `seen`; or why ivory does
/// not fetch its data.
fn admitted(image: &str, seen: &mut BTreeSet<String>) -> Result<ImageReference, Refusal> {
    let reference = ImageReference::parse(image).map_err(|error| Refusal::InvalidReference {
        image: image.to_owned(),
        error,
    })?;
    // The registry client judges every address it connects to (any spelling, resolved names,
    // redirects) by the operator's egress rule; this refuses the plain literals early, with
    // the expression's error, and whatever the allow-list says: a request never chooses them.
    if let Some(ip) = host_ip(reference.registry())
        && ivory_reference::is_metadata_or_unspecified(ip)
    {
        return Err(Refusal::Address {
            image: image.to_owned(),
            ip,
            class: ivory_reference::AddressClass::of(ip),
        });
    }
    if !seen.contains(image) && seen.len() >= MAX_LATE_IMAGES {
        return Err(Refusal::TooMany {
            image: image.to_owned(),
            max: MAX_LATE_IMAGES,
        });
    }
    seen.insert(image.to_owned());
    Ok(reference)
}

/// The registry host as an IP address, when it is one (`10.0.0.1:5000`, `[fe80::1]:5000`).
fn host_ip(registry: &str) -> Option<IpAddr> {
    if let Some(rest) = registry.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    let host = registry.rsplit_once(':').map_or(registry, |(host, _)| host);
    host.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_local_and_unspecified_hosts_are_refused_and_the_count_is_capped() {
        let mut seen = BTreeSet::new();
        for image in [
            "169.254.169.254/latest/meta-data:1",
            "169.254.169.254:80/xx:1",
            "[fe80::1]:5000/xx:1",
            "[fd00:ec2::254]/xx:1",
            "[::ffff:169.254.169.254]:5000/xx:1",
            "0.0.0.0:5000/xx:1",
            "[::]:5000/xx:1",
        ] {
            let why = admitted(image, &mut seen).err();
            assert!(
                matches!(why, Some(Refusal::Address { .. })),
                "{image}: {why:?}"
            );
            let why = why.map(|e| e.to_string()).unwrap_or_default();
            assert!(why.contains("ivory never fetches"), "{image}: {why}");
        }
        assert!(seen.is_empty());
        let why = admitted("not a reference!", &mut seen).err();
        assert!(
            matches!(why, Some(Refusal::InvalidReference { .. })),
            "{why:?}"
        );
        assert!(
            why.map(|e| e.to_string())
                .unwrap_or_default()
                .starts_with("invalid image reference not a reference!: "),
        );
        // Loopback, private and public hosts are asked (a kubelet pulls from them as well).
        for image in [
            "127.0.0.1:5000/xx:1",
            "10.0.0.1:5000/xx:1",
            "[::1]:5000/xx:1",
            "registry.example/xx:1",
        ] {
            let reference = admitted(image, &mut seen).unwrap_or_else(|e| panic!("{image}: {e}"));
            assert_eq!(reference.original(), image);
        }
        for n in seen.len()..MAX_LATE_IMAGES {
            assert!(admitted(&format!("r.example/xx:{n}"), &mut seen).is_ok());
        }
        let why = admitted("r.example/one-too-many:1", &mut seen)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            why.contains(&format!("at most {MAX_LATE_IMAGES} images")),
            "{why}"
        );
        // An image already counted is asked again (another policy, another round).
        assert!(admitted("r.example/xx:4", &mut seen).is_ok());
    }
}
