//! The verification host: answers the CEL verification functions synchronously from the results
//! prefetched for the request, and records per-image evidence for `required`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use ivory_cel::{Host, HostError};
use ivory_policy::compiled::CompiledPolicy;
use ivory_policy::types::Attestation;
use serde_json::Value;

use super::prefetch::{LateImageData, Outcome, Prefetched, VerifyKey};
use crate::resources::host::ClusterHost;
use crate::verifier::{ErrorKind, Signer, Verification, VerifyError};

/// Kyverno's error when a payload is asked for before its attestation was verified.
pub(super) const PAYLOAD_NOT_VERIFIED: &str = "failed to get payload: intoto attestation payload cannot be fetch before verifying intoto attestation";

/// Request-scoped evidence shared by all policies: image → verified (monotonic OR). An image
/// is present once any policy asked a verification function about it with attestors. Also
/// who signed what was verified, for the audit trail ([`Evidence::verified`]).
#[derive(Debug, Default)]
pub(super) struct Evidence {
    images: Mutex<BTreeMap<String, bool>>,
    /// Shared: a memoized result's evidence is copied into every request it answers.
    signers: Mutex<BTreeSet<Arc<VerifiedBy>>>,
    /// Verdicts read that name a log the trust root does not know, by image: said in a
    /// warning when the image ends up unverified (a stale root, not a bad signature).
    unknown_logs: Mutex<BTreeMap<String, BTreeSet<String>>>,
}

/// One verification an expression read and that verified: what, by which policy and attestor,
/// and who signed it. Written as one flat JSON object ([`VerifiedBy::json`]).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct VerifiedBy {
    image: String,
    digest: String,
    policy: String,
    attestor: String,
    attestation: Option<String>,
    signer: SignerFields,
    /// The fields above as the annotation writes them, written once: a memoized result's
    /// entries go into every request it answers. A function of the fields (private, set only
    /// by [`VerifiedBy::new`]), so the derived order and equality stay theirs.
    json: Box<str>,
}

/// [`Signer`] with an order, for a deterministic annotation.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct SignerFields {
    key: Option<String>,
    subject: Option<String>,
    issuer: Option<String>,
    log_index: Option<u64>,
}

/// Longest image string carried into the annotation.
const MAX_IMAGE_CHARS: usize = 256;

impl VerifiedBy {
    /// The entry for `image` (at `digest`) verified by `attestor` of `policy`.
    pub(super) fn new(
        image: String,
        digest: String,
        policy: String,
        attestor: String,
        attestation: Option<String>,
        signer: SignerFields,
    ) -> Self {
        let mut entry = Self {
            image,
            digest,
            policy,
            attestor,
            attestation,
            signer,
            json: Box::default(),
        };
        let mut json = String::new();
        entry.push_json(&mut json);
        entry.json = json.into_boxed_str();
        entry
    }

    /// One flat JSON object: `{image, digest, policy, attestor, attestation?, key?, subject?,
    /// issuer?, logIndex?}`, absent parts left out, the image cut to [`MAX_IMAGE_CHARS`]
    /// characters (everything else in it comes from verification).
    pub(super) fn json(&self) -> &str {
        &self.json
    }

    fn push_json(&self, out: &mut String) {
        use ivory_plumbing::json_text::push_string as string;
        let signer = &self.signer;
        let image = match self.image.char_indices().nth(MAX_IMAGE_CHARS) {
            Some((cut, _)) => &self.image[..cut],
            None => &self.image,
        };
        let fields = [
            ("{\"image\":", Some(image)),
            (",\"digest\":", Some(self.digest.as_str())),
            (",\"policy\":", Some(self.policy.as_str())),
            (",\"attestor\":", Some(self.attestor.as_str())),
            (",\"attestation\":", self.attestation.as_deref()),
            (",\"key\":", signer.key.as_deref()),
            (",\"subject\":", signer.subject.as_deref()),
            (",\"issuer\":", signer.issuer.as_deref()),
        ];
        for (name, value) in fields {
            if let Some(value) = value {
                out.push_str(name);
                string(out, value);
            }
        }
        if let Some(index) = signer.log_index {
            out.push_str(",\"logIndex\":");
            ivory_plumbing::json_text::push_u64(out, index);
        }
        out.push('}');
    }
}

impl From<&Signer> for SignerFields {
    fn from(s: &Signer) -> Self {
        Self {
            key: s.key.clone(),
            subject: s.subject.clone(),
            issuer: s.issuer.clone(),
            log_index: s.log_index,
        }
    }
}

/// What the request learnt about one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ImageEvidence {
    NeverAttempted,
    Failed,
    Verified,
}

impl Evidence {
    fn images(&self) -> MutexGuard<'_, BTreeMap<String, bool>> {
        // Nothing panics while holding the lock; recover the data if a test thread did.
        self.images.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record(&self, image: &str, verified: bool) {
        let mut images = self.images();
        let entry = images.entry(image.to_owned()).or_insert(false);
        *entry |= verified;
    }

    fn unknown_logs(&self) -> MutexGuard<'_, BTreeMap<String, BTreeSet<String>>> {
        self.unknown_logs.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn record_unknown_log(&self, image: &str, reason: String) {
        self.unknown_logs()
            .entry(image.to_owned())
            .or_default()
            .insert(reason);
    }

    /// `image <image>: <reason>` for each image no policy verified whose verdicts named a log
    /// the trust root does not know, in a stable order.
    pub(super) fn unknown_log_warnings(&self) -> Vec<String> {
        // Nearly every request has none: no lock of the images, no copy.
        let unknown = self.unknown_logs();
        if unknown.is_empty() {
            return Vec::new();
        }
        let images = self.images();
        unknown
            .iter()
            .filter(|(image, _)| images.get(*image) != Some(&true))
            .flat_map(|(image, reasons)| reasons.iter().map(move |r| format!("image {image}: {r}")))
            .collect()
    }

    fn record_signer(&self, verified: Arc<VerifiedBy>) {
        self.signers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(verified);
    }

    /// Adds what `other` learnt (the evidence of one policy's final evaluation).
    pub(super) fn merge(&self, other: Evidence) {
        let images = other.images.into_inner().unwrap_or_else(|p| p.into_inner());
        let mut mine = self.images();
        for (image, verified) in images {
            *mine.entry(image).or_insert(false) |= verified;
        }
        drop(mine);
        let signers = other
            .signers
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        self.signers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(signers);
        let unknown = other
            .unknown_logs
            .into_inner()
            .unwrap_or_else(|p| p.into_inner());
        let mut mine = self.unknown_logs();
        for (image, reasons) in unknown {
            mine.entry(image).or_default().extend(reasons);
        }
    }

    /// A copy of what was learnt, to be merged again later ([`Evidence::merge`]).
    pub(super) fn snapshot(&self) -> Evidence {
        Evidence {
            images: Mutex::new(self.images().clone()),
            signers: Mutex::new(
                self.signers
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .clone(),
            ),
            unknown_logs: Mutex::new(self.unknown_logs().clone()),
        }
    }

    /// Every verification that verified and was read, in a stable order.
    pub(super) fn verified(&self) -> Vec<Arc<VerifiedBy>> {
        let signers = self.signers.lock().unwrap_or_else(|p| p.into_inner());
        signers.iter().cloned().collect()
    }

    pub(super) fn of(&self, image: &str) -> ImageEvidence {
        match self.images().get(image) {
            None => ImageEvidence::NeverAttempted,
            Some(false) => ImageEvidence::Failed,
            Some(true) => ImageEvidence::Verified,
        }
    }
}

/// The [`Host`] for one policy evaluation.
pub(super) struct PolicyHost<'a> {
    pub(super) policy: &'a CompiledPolicy,
    /// Whether an image matches the policy's `matchImageReferences` (Kyverno answers 0 otherwise).
    pub(super) matches: &'a (dyn Fn(&str) -> bool + Sync),
    /// Names of notary attestors (they cannot verify in-toto attestations).
    pub(super) notary_attestors: &'a [String],
    pub(super) prefetched: &'a Prefetched,
    pub(super) keys: &'a BTreeMap<VerifyKey, usize>,
    pub(super) image_data: &'a BTreeMap<String, usize>,
    /// Image data fetched because an earlier evaluation of the policy asked for it: images the
    /// policy does not select and literals, or why ivory would not fetch it.
    pub(super) late_image_data: &'a BTreeMap<String, LateImageData>,
    pub(super) evidence: &'a Evidence,
    /// Payloads verified during this policy's evaluation: (image, attestation name) → statement.
    pub(super) payloads: Mutex<BTreeMap<(String, String), Value>>,
    /// Prefetched answers that were errors and that an expression read. Only these decide
    /// whether the failurePolicy applies: an unanswered question nobody asked changes nothing.
    pub(super) unanswered: Mutex<Vec<VerifyError>>,
    /// While set, a verification the budget did not allow counts as this answer (verified or
    /// not) instead of an error, and nothing is recorded as evidence: used only to learn
    /// whether an expression fails whatever the missing answers would have been.
    pub(super) assumed: Mutex<Option<bool>>,
    /// Images whose data an expression asked for and nothing fetched yet.
    pub(super) wanted: Mutex<BTreeSet<String>>,
    /// Answers `resource.*` and `globalContext.*` (`None`: not available).
    pub(super) cluster: Option<&'a ClusterHost<'a>>,
}

impl PolicyHost<'_> {
    /// Remembers that an expression needed `err` (CEL keeps only its text, and may absorb
    /// it), and hands CEL the error of its class, in `err`'s words after `context`.
    fn needed(&self, err: &VerifyError, context: &str) -> HostError {
        self.unanswered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(err.clone());
        let text = format!("{context}{err}");
        match err.kind() {
            ErrorKind::Deadline => HostError::BudgetExhausted(text),
            ErrorKind::Unavailable | ErrorKind::NotFound | ErrorKind::Hostile => {
                HostError::Registry(text)
            }
        }
    }

    /// The images whose data was asked for and not fetched, taken out.
    pub(super) fn take_wanted(&self) -> BTreeSet<String> {
        std::mem::take(&mut *self.wanted.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Sets (or clears) the answer assumed for verifications the budget did not allow.
    pub(super) fn assume_missing(&self, verified: Option<bool>) {
        *self.assumed.lock().unwrap_or_else(|p| p.into_inner()) = verified;
    }

    fn assumed(&self) -> Option<bool> {
        *self.assumed.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How many unanswered questions were read so far (for [`Self::deciding_error_since`]).
    pub(super) fn mark(&self) -> usize {
        self.unanswered
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }

    /// The error that decides an expression's outcome, among those read since `mark`: a spent
    /// budget wins, so that the failurePolicy applies.
    pub(super) fn deciding_error_since(&self, mark: usize) -> Option<VerifyError> {
        let errors = self.unanswered.lock().unwrap_or_else(|p| p.into_inner());
        let errors = errors.get(mark..).unwrap_or_default();
        errors
            .iter()
            .find(|e| e.is_deadline())
            .or_else(|| errors.first())
            .cloned()
    }

    fn attestation(&self, name: &str) -> Result<&Attestation, HostError> {
        self.policy
            .attestations
            .iter()
            .find(|a| a.name == name)
            .ok_or_else(|| {
                HostError::InvalidArgument(format!("attestation not found in policy: {name}"))
            })
    }

    /// Counts the attestors that verified (image, attestation); records the evidence.
    fn count(
        &self,
        image: &str,
        attestation: Option<&str>,
        attestors: &[Value],
    ) -> Result<i64, HostError> {
        let mut count = 0i64;
        let assumed = self.assumed();
        for attestor in attestors {
            let name = attestor_name(attestor)?;
            let key = VerifyKey {
                image: image.to_owned(),
                attestor: name.to_owned(),
                attestation: attestation.map(str::to_owned),
            };
            let Some(&index) = self.keys.get(&key) else {
                return Err(not_prepared(image, name, attestation));
            };
            match self.prefetched.outcome(index) {
                Some(Outcome::Verify(Ok(Verification::Verified {
                    payload,
                    digest,
                    signer,
                }))) => {
                    count += 1;
                    if let (Some(signer), None) = (signer, assumed) {
                        self.evidence.record_signer(Arc::new(VerifiedBy::new(
                            image.to_owned(),
                            digest.clone(),
                            self.policy.name.clone(),
                            name.to_owned(),
                            attestation.map(str::to_owned),
                            signer.into(),
                        )));
                    }
                    if let (Some(att), Some(payload)) = (attestation, payload) {
                        self.payloads
                            .lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .entry((image.to_owned(), att.to_owned()))
                            .or_insert_with(|| payload.clone());
                    }
                }
                Some(Outcome::Verify(Ok(Verification::NotVerified { reason, .. }))) => {
                    if let Some(unknown) = reason.unknown_log() {
                        self.evidence.record_unknown_log(image, unknown.to_string());
                    }
                }
                Some(Outcome::Verify(Err(err))) => match assumed {
                    Some(verified) if err.is_deadline() => count += i64::from(verified),
                    _ => return Err(self.needed(err, "")),
                },
                Some(Outcome::ImageData(_) | Outcome::Resolve(_)) | None => {
                    return Err(not_prepared(image, name, attestation));
                }
            }
        }
        if !attestors.is_empty() && assumed.is_none() {
            self.evidence.record(image, count > 0);
        }
        Ok(count)
    }
}

impl Host for PolicyHost<'_> {
    fn verify_image_signatures(&self, image: &str, attestors: &[Value]) -> Result<i64, HostError> {
        if !(self.matches)(image) {
            return Ok(0);
        }
        self.count(image, None, attestors)
    }

    fn verify_attestation_signatures(
        &self,
        image: &str,
        attestation: &str,
        attestors: &[Value],
    ) -> Result<i64, HostError> {
        if !(self.matches)(image) {
            return Ok(0);
        }
        let att = self.attestation(attestation)?;
        if att.intoto.is_some() {
            for attestor in attestors {
                let name = attestor_name(attestor)?;
                if self.notary_attestors.iter().any(|n| n == name) {
                    return Err(HostError::InvalidArgument(
                        "notary verifier only supports oci 1.1 referrers as attestations".into(),
                    ));
                }
            }
        }
        self.count(image, Some(attestation), attestors)
    }

    fn extract_payload(&self, image: &str, attestation: &str) -> Result<Value, HostError> {
        let att = self.attestation(attestation)?;
        let verified = self
            .payloads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&(image.to_owned(), attestation.to_owned()))
            .cloned();
        match verified {
            Some(payload) => Ok(payload),
            // Kyverno falls back to live, unverified referrer data here (#17130); ivory never
            // returns a payload that was not verified.
            None if att.referrer.is_some() => Err(HostError::NotVerified(format!(
                "failed to get payload: referrer attestation {attestation} cannot be fetched before verifying it"
            ))),
            None => Err(HostError::NotVerified(PAYLOAD_NOT_VERIFIED.to_owned())),
        }
    }

    fn resource_get(&self, query: &ivory_cel::ResourceQuery) -> Result<Option<Value>, HostError> {
        self.cluster
            .ok_or(HostError::NotAvailable)?
            .resource_get(query)
    }

    fn resource_list(&self, query: &ivory_cel::ResourceQuery) -> Result<Value, HostError> {
        self.cluster
            .ok_or(HostError::NotAvailable)?
            .resource_list(query)
    }

    fn global_context(&self, entry: &str, projection: &str) -> Result<Value, HostError> {
        self.cluster
            .ok_or(HostError::NotAvailable)?
            .global_context(entry, projection)
    }

    /// Any image an expression names, as Kyverno answers (the policy's images, the request's
    /// others, literals): the policy's own images come from the prefetch; any other is asked
    /// for here ([`PolicyHost::take_wanted`]) and answered when the policy is evaluated again.
    /// A failed answer fails only the expression that reads it.
    fn image_data(&self, image: &str) -> Result<Value, HostError> {
        let failed = "failed to get imagedata: ";
        if let Some(&index) = self.image_data.get(image) {
            return match self.prefetched.outcome(index) {
                Some(Outcome::ImageData(Ok(data))) => Ok(data.clone()),
                Some(Outcome::ImageData(Err(err))) => Err(self.needed(err, failed)),
                Some(Outcome::Verify(_) | Outcome::Resolve(_)) | None => {
                    Err(HostError::InvalidArgument(format!("{failed}{image}")))
                }
            };
        }
        match self.late_image_data.get(image) {
            Some(LateImageData::Answer(Ok(data))) => Ok(data.clone()),
            Some(LateImageData::Answer(Err(err))) => Err(self.needed(err, failed)),
            Some(LateImageData::Refused(why)) => {
                Err(HostError::InvalidArgument(format!("{failed}{why}")))
            }
            None => {
                self.wanted
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(image.to_owned());
                Err(HostError::InvalidArgument(format!(
                    "{failed}image {image} was named only after ivory's last round of image data fetches for this request"
                )))
            }
        }
    }
}

fn attestor_name(attestor: &Value) -> Result<&str, HostError> {
    attestor.get("name").and_then(Value::as_str).ok_or_else(|| {
        HostError::InvalidArgument(
            "attestor argument is not one of the policy's attestors (no name)".to_owned(),
        )
    })
}

/// A question outside those prefetched for the policy.
fn not_prepared(image: &str, attestor: &str, attestation: Option<&str>) -> HostError {
    let what = match attestation {
        Some(att) => format!("attestation {att} of image {image}"),
        None => format!("signature of image {image}"),
    };
    HostError::InvalidArgument(format!(
        "{what} was not verified by attestor {attestor}: ivory verifies only the policy's matched images with its declared attestors and attestations"
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    const IMAGE: &str = "ghcr.io/acme/app:1";

    /// The annotation's entry is one flat object in a fixed key order, with absent signer
    /// fields left out (as the serde derive with `#[serde(flatten)]` wrote it before).
    #[test]
    fn a_verified_entry_is_one_flat_object_in_a_fixed_order() {
        let keyless = Signer {
            key: None,
            subject: Some("ci@example.com".to_owned()),
            issuer: Some("https://issuer.example".to_owned()),
            log_index: Some(7),
        };
        let entry = |attestation: Option<&str>, signer: &Signer| {
            VerifiedBy::new(
                IMAGE.to_owned(),
                "sha256:abc".to_owned(),
                "p".to_owned(),
                "a".to_owned(),
                attestation.map(str::to_owned),
                signer.into(),
            )
        };
        let json = |entry: VerifiedBy| entry.json().to_owned();
        let full = json(entry(Some("sbom"), &keyless));
        assert_eq!(
            full,
            r#"{"image":"ghcr.io/acme/app:1","digest":"sha256:abc","policy":"p","attestor":"a","attestation":"sbom","subject":"ci@example.com","issuer":"https://issuer.example","logIndex":7}"#
        );
        let key = Signer {
            key: Some("sha256:k".to_owned()),
            ..Signer::default()
        };
        let bare = json(entry(None, &key));
        assert_eq!(
            bare,
            r#"{"image":"ghcr.io/acme/app:1","digest":"sha256:abc","policy":"p","attestor":"a","key":"sha256:k"}"#
        );
    }

    /// The image is the one part of an entry the request chose: cut to 256 characters (not
    /// bytes, so never inside a character), while the entry itself keeps it whole.
    #[test]
    fn a_long_image_is_cut_to_256_characters_in_the_entry_only() {
        let signed = |image: &str| {
            VerifiedBy::new(
                image.to_owned(),
                "sha256:abc".to_owned(),
                "p".to_owned(),
                "a".to_owned(),
                None,
                (&Signer::default()).into(),
            )
        };
        let written = |entry: &VerifiedBy| {
            let value: Value = serde_json::from_str(entry.json()).unwrap();
            value["image"].as_str().unwrap().to_owned()
        };
        let long = format!("ghcr.io/{}", "é".repeat(300));
        let entry = signed(&long);
        let cut = written(&entry);
        assert_eq!(cut.chars().count(), 256);
        assert!(long.starts_with(&cut));
        assert_eq!(entry.image, long);
        let exact = "x".repeat(256);
        assert_eq!(written(&signed(&exact)), exact);
    }

    fn policy() -> CompiledPolicy {
        let yaml = "apiVersion: policies.kyverno.io/v1
kind: ImageValidatingPolicy
metadata:
  name: p
spec:
  matchConstraints:
    resourceRules:
    - apiGroups: ['']
      apiVersions: ['v1']
      operations: ['CREATE']
      resources: ['pods']
  attestors:
  - name: slow
    cosign:
      key:
        data: |
          -----BEGIN PUBLIC KEY-----
          MFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE6QsNef3SKYhJVYSVj+ZfbPwJd0pv
          DLYNHXITZkhIzfE+apcxDjCCkDPcJ3A3zvhPATYOIsCxYPch7Q2JdJLsDQ==
          -----END PUBLIC KEY-----
  attestations:
  - name: sbom
    intoto:
      type: https://spdx.dev/Document
  validations:
  - expression: 'true'
";
        let report = ivory_policy::load_str(yaml, "host.yaml");
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        report.policies.into_iter().next().unwrap()
    }

    #[test]
    fn host_errors_take_their_class_from_the_verify_errors_kind() {
        let deadline = VerifyError::DeadlineExceeded {
            image: IMAGE.into(),
            registry: "ghcr.io".into(),
            operation: "verifying signatures".into(),
            budget_ms: 5,
        };
        // Worded like a spent budget, but a registry failure: the kind decides, not the text.
        let down = VerifyError::Unavailable {
            image: IMAGE.into(),
            registry: "ghcr.io".into(),
            message: "time budget of 5ms exhausted".into(),
        };
        let missing = VerifyError::NotFound {
            image: IMAGE.into(),
            registry: "ghcr.io".into(),
            message: "manifest unknown".into(),
        };
        let prefetched = Prefetched::from_outcomes(vec![
            Outcome::Verify(Err(deadline.clone())),
            Outcome::Verify(Err(down.clone())),
            Outcome::ImageData(Err(missing.clone())),
        ]);
        let key = |attestor: &str| VerifyKey {
            image: IMAGE.into(),
            attestor: attestor.into(),
            attestation: None,
        };
        let keys = BTreeMap::from([(key("slow"), 0), (key("down"), 1)]);
        let image_data = BTreeMap::from([(IMAGE.to_owned(), 2)]);
        let policy = policy();
        let evidence = Evidence::default();
        let host = PolicyHost {
            policy: &policy,
            matches: &|_: &str| true,
            notary_attestors: &[],
            prefetched: &prefetched,
            keys: &keys,
            image_data: &image_data,
            late_image_data: &BTreeMap::new(),
            evidence: &evidence,
            payloads: Mutex::new(BTreeMap::new()),
            unanswered: Mutex::new(Vec::new()),
            assumed: Mutex::new(None),
            wanted: Mutex::new(BTreeSet::new()),
            cluster: None,
        };
        let attestor = |name: &str| [json!({ "name": name })];

        assert_eq!(
            host.verify_image_signatures(IMAGE, &attestor("slow")),
            Err(HostError::BudgetExhausted(deadline.to_string()))
        );
        assert_eq!(
            host.verify_image_signatures(IMAGE, &attestor("down")),
            Err(HostError::Registry(down.to_string()))
        );
        assert_eq!(
            host.image_data(IMAGE),
            Err(HostError::Registry(format!(
                "failed to get imagedata: {missing}"
            )))
        );
        // Every registry error an expression read is recorded; the spent budget decides.
        assert_eq!(host.mark(), 3);
        assert_eq!(host.deciding_error_since(0), Some(deadline));
        assert_eq!(host.deciding_error_since(1), Some(down));

        // A payload nothing verified is a verdict, not a failure to reach one.
        assert_eq!(
            host.extract_payload(IMAGE, "sbom"),
            Err(HostError::NotVerified(PAYLOAD_NOT_VERIFIED.to_owned()))
        );
        // Questions outside the policy are the caller's mistake, and record nothing.
        for refused in [
            host.extract_payload(IMAGE, "unknown"),
            host.verify_image_signatures(IMAGE, &[json!({})])
                .map(|_| json!(0)),
            host.verify_image_signatures(IMAGE, &attestor("other"))
                .map(|_| json!(0)),
        ] {
            assert!(
                matches!(refused, Err(HostError::InvalidArgument(_))),
                "{refused:?}"
            );
        }
        assert_eq!(host.mark(), 3);
    }
}
