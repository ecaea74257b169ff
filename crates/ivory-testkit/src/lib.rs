//! ivory-testkit: test support shared by ivory's crates (never shipped).
//!
//! - [`RegistryHarness`]: the real `docker-registry` binary on loopback, with TLS from a
//!   generated CA and no auth, htpasswd basic auth, or bearer tokens from an in-process
//!   token server; request log parsed from Distribution's JSON log.
//! - [`OciLayout`] / [`write_simple_image`] and [`Harness::push_oci_layout`]: fixtures.
//! - [`FaultServer`], [`HungRegistry`], [`refused_host`]: faults on demand.
//! - [`HostileServer`], [`CaptureServer`]: registries that attack their clients.
//! - The `ivory-testkit-registry` binary: the harness registry with OCI layouts pushed, kept
//!   running for `scripts/demo.sh` and people trying ivory by hand.
//! - [`RekorV2Log`] / [`dsse_v002_body`]: Rekor v2 log entries (`dsse/0.0.2` and others) with
//!   inclusion proofs and Ed25519-signed checkpoints, and the trusted-root entry of their log.
//! - [`RedisServer`]: the real `redis-server` on loopback (pause, stop, restart on demand; TLS
//!   on a second port).
//! - [`HostileRedis`]: a fake Redis answering every command with an attack on its client's
//!   memory ([`RedisAttack`]).
//! - [`policy`] and [`review`]: the ImageValidatingPolicy YAML and AdmissionReview JSON the
//!   tests and benchmarks build their cases from.
//! - [`in_metadata_netns`], [`MetadataListener`]: a private network namespace where
//!   169.254.169.254 is a local stand-in, for tests whose failure would connect there.
//! - [`TufMirror`]: a TUF mirror on loopback serving one repository state of `fixtures/tuf/`
//!   (made by python-tuf, laid out as Sigstore's), switched, taken down, hung on demand, with
//!   requests counted by path.
//! - [`eventually`]: the one wait for what happens asynchronously, naming what it waited for.
//! - [`cases::Failures`]: case tables that report every failing case, not just the first.
//! - [`fixtures_dir`]: the repository's committed fixtures, the one place their path is built.
//! - [`free_port`]: ports for those servers from below the kernel's ephemeral range, so no other
//!   socket of the test run takes one between choosing and binding it.
//!
//! Committed fixtures are pushed by name ([`Harness::push_fixture`]); the builders the tests,
//! the end-to-end suite and the benchmarks share are [`policy::PodPolicy`],
//! [`review::object_review`] and [`review::pod_review`].
//!
//! # Tests by tier
//!
//! - Unit tests beside the code, with one in-memory `ImageVerifier` (ivory-engine's
//!   `testing::FakeVerifier`, feature `test-support`) for engine, route and command logic only.
//! - Integration tests through the real Debian `docker-registry` ([`RegistryHarness`]: TLS with a
//!   generated CA, htpasswd, token realm, access-log request counting, hung and fault servers)
//!   and fixtures signed by real tools; the shared cache through the real Debian `redis-server`
//!   ([`RedisServer`]: plain and TLS, paused, stopped, restarted) and [`HostileRedis`], a fake
//!   RESP server on loopback that attacks its client's memory.
//! - Tests whose failure would connect to the cloud metadata address run in a private network
//!   namespace ([`in_metadata_netns`]: the test binary runs that one test again under `unshare`
//!   with `169.254.169.254` and `fd00:ec2::254` on its own loopback, a stand-in listener counting
//!   connections, and a hosts file whose names resolve there), so no packet reaches the host's
//!   network even on a regression.
//! - The binary run as a process over HTTPS (`crates/ivory/tests`), including `dogfood`: ivory's
//!   own image from `scripts/image.sh`, signed and attested with cosign v2, judged by
//!   `policies/samples/verify-ivory.yaml`.
//! - The official Sigstore conformance suite (`fixtures/sigstore-conformance`, vendored byte for
//!   byte): `scripts/sigstore-conformance.sh` runs its 140 verification cases offline against
//!   `ivory verify-blob` through `scripts/sigstore-conformance-client` (the suite's CLI
//!   protocol), and the integration test `cli_verify_blob` requires all 140 to pass.
//! - End to end on a real kube-apiserver + etcd (`crates/ivory-e2e`, one test binary run by
//!   `scripts/e2e.sh`), whose
//!   audit log the tests read (the `verified-images` audit annotation).
//! - Side by side with the real Kyverno v1.19.1, outside `scripts/test.sh`:
//!   `scripts/bench.sh --peers` (figures) and `scripts/convert-proof.sh`
//!   (`ivory-bench convert-proof`: the legacy corpus under Kyverno, its conversion under ivory,
//!   verdicts recorded in `fixtures/legacy/verdicts.json`, which the main suite replays).
//! - A one-node cluster from real parts in its own network namespace, with ivory installed from
//!   its image by its Helm chart (`scripts/cluster.sh`, `docs/CLUSTER.md`; needs root, not in
//!   CI).

pub use error::{Error, Result};
pub use fault::{DEEP_LEVELS, FaultOptions, FaultServer, HungRegistry, refused_host};
pub use hostile::{
    CaptureServer, HOSTILE_REPOSITORIES, HOSTILE_SECRET, HOSTILE_TAGS, HUGE_LENGTH, HostileAuth,
    HostileOptions, HostileServer, SeenRequest, pages_tag,
};
pub use hostile_redis::{HOSTILE_REDIS_CAP, HostileRedis, RedisAttack};
pub use layout::{
    Descriptor, OCI_CONFIG, OCI_INDEX, OCI_LAYER, OCI_MANIFEST, OciLayout, REF_NAME, SimpleImage,
    sha256_digest, write_simple_image,
};
pub use netns::{
    METADATA_HOSTS, METADATA_PORT, METADATA_SECRET, METADATA_V4, METADATA_V6, MetadataListener,
    in_metadata_netns,
};
pub use pki::{CosignSigner, TestPki, TokenSigner};
pub use ports::{free_port, is_port_taken};
pub use redis::{REDIS_BINARY, RedisServer};
pub use registry::{
    AuthMode, Harness, HarnessOptions, LoggedRequest, REGISTRY_BINARY, RegistryHarness,
};
pub use rekor_v2::{DsseVerifier, LOGGED_INDEX, RekorV2Log, TREE_SIZE, dsse_v002_body};
pub use token::{TOKEN_ISSUER, TOKEN_SERVICE, TOKEN_TTL_SECS};
pub use tsa::{OpensslTsa, TsaKey};
pub use tuf_mirror::{TUF_STATES, TufMirror, tuf_fixtures_dir};
pub use wait::{Check, NotYet, Timeout, eventually};

/// The repository's `fixtures/` folder: signed test images, keys, reviews (see its README).
pub fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures")
}

pub mod cases;
pub mod crl;
mod error;
mod fault;
mod hostile;
mod hostile_redis;
mod layout;
mod netns;
mod pki;
pub mod policy;
mod ports;
mod push;
mod redis;
mod registry;
mod rekor_v2;
pub mod review;
mod token;
mod tsa;
mod tuf_mirror;
mod wait;
