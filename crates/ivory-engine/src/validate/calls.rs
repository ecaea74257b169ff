//! What a policy's programs call and read: the CEL functions that need verdicts or image
//! data, and whether a program reads only what the memo may key on. Kept apart so that the
//! plan, the per-policy facts and the memo all ask the same question the same way.

use ivory_cel::Program;
use ivory_policy::compiled::CompiledPolicy;

/// CEL functions that need signature verdicts / attestation verdicts / image metadata.
pub(super) const SIGNATURE_FUNCTIONS: [&str; 1] = ["verifyImageSignatures"];
pub(super) const ATTESTATION_FUNCTIONS: [&str; 2] =
    ["verifyAttestationSignatures", "extractPayload"];
pub(super) const IMAGE_DATA_FUNCTIONS: [&str; 5] = [
    "getImageData",
    "image.GetMetadata",
    "image.getMetadata",
    "GetMetadata",
    "getMetadata",
];

/// What an expression of a memoizable policy may read.
const PURE_INPUTS: [&str; 4] = ["images", "attestors", "attestations", "variables"];

/// Every program of the policy that runs after the prefetch.
pub(super) fn programs(policy: &CompiledPolicy) -> impl Iterator<Item = &Program> {
    policy
        .validations
        .iter()
        .flat_map(|v| std::iter::once(&v.expression).chain(v.message_expression.as_ref()))
        .chain(policy.variables.iter().map(|v| &v.program))
        .chain(policy.audit_annotations.iter().map(|a| &a.value_expression))
}

/// Whether `program` reads only what a memoizable policy may read, and calls no image-data,
/// cluster or clock function (`time.now()` answers differently later for the same inputs).
pub(super) fn reads_only_pure_inputs(program: &Program) -> bool {
    let cluster = ivory_cel::cluster_functions::RESOURCE_GET
        .iter()
        .chain(&ivory_cel::cluster_functions::RESOURCE_LIST)
        .chain(&ivory_cel::cluster_functions::GLOBAL_CONTEXT_GET)
        .chain(&ivory_cel::clock_functions::TIME_NOW);
    program.globals().all(|g| PURE_INPUTS.contains(&g))
        && !IMAGE_DATA_FUNCTIONS
            .iter()
            .chain(cluster)
            .any(|f| program.calls_function(f))
}
