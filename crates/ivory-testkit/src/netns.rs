//! A private network namespace with a stand-in for the cloud metadata service, for tests whose
//! failure would connect to 169.254.169.254: no packet of theirs may reach the host's network.
//!
//! A test calls [`in_metadata_netns`] with its own name. Outside the namespace, that runs the
//! same test binary again, filtered to that one test, under `unshare` (a new user, network and
//! mount namespace: loopback up, 169.254.169.254/32 and fd00:ec2::254/128 on it, and
//! [`METADATA_HOSTS`] bind-mounted over `/etc/hosts` so real `getaddrinfo` answers name the
//! metadata address), and fails unless that run passed. Inside, it returns true and the test
//! runs there. [`MetadataListener::bind`] only works where 169.254.169.254 is a local address,
//! so a body that starts by binding it can never talk to a real metadata service.

use std::io::{Read as _, Write as _};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The cloud metadata address, local inside the namespace only.
pub const METADATA_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
/// AWS's IPv6 metadata address, local inside the namespace only.
pub const METADATA_V6: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254);
/// The port the stand-in listens on (the real service's).
pub const METADATA_PORT: u16 = 80;
/// Names `/etc/hosts` gives inside the namespace, each resolving to a form of the metadata
/// address, as a DNS server an attacker controls would answer.
pub const METADATA_HOSTS: &str = "127.0.0.1 localhost
::1 localhost
169.254.169.254 metadata.ivory.test
fd00:ec2::254 metadata6.ivory.test
64:ff9b::a9fe:a9fe nat64.ivory.test
";
/// Set in the namespace's environment.
const CHILD_ENV: &str = "IVORY_TEST_METADATA_NETNS";

/// True inside the namespace (run the test body). Outside, runs `test` (its libtest path, e.g.
/// `egress::redirects_to_the_metadata_address_are_refused`) of the current test binary in a
/// fresh namespace, panics with its output unless it passed, and returns false.
pub fn in_metadata_netns(test: &str) -> bool {
    if std::env::var_os(CHILD_ENV).is_some() {
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let dir = tempfile::tempdir().expect("a folder for the namespace's hosts file");
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, METADATA_HOSTS).expect("writing the namespace's hosts file");
    let setup = "set -e
ip link set lo up
ip addr add 169.254.169.254/32 dev lo
ip addr add fd00:ec2::254/128 dev lo nodad
mount --bind \"$1\" /etc/hosts
shift
exec \"$@\"";
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "--mount", "--"])
        .args(["sh", "-c", setup, "sh"])
        .arg(&hosts)
        .arg(&exe)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, "1")
        .output()
        .expect("running unshare (util-linux) for a private network namespace");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{test} in its network namespace: {}\n{stdout}\n{stderr}",
        out.status
    );
    false
}

/// The stand-in metadata service: accepts on 169.254.169.254:80 and `[fd00:ec2::254]:80`,
/// answers every connection with a 200 that holds a fake credential, and counts connections.
pub struct MetadataListener {
    accepted: Arc<AtomicUsize>,
}

/// What the stand-in answers: a client that shows this was fooled.
pub const METADATA_SECRET: &str = "IVORY-FAKE-CLOUD-CREDENTIAL-9d2e";

impl MetadataListener {
    /// Binds both addresses; panics outside the namespace (where neither is local), before
    /// the test can connect anywhere.
    pub fn bind() -> Self {
        assert!(
            std::env::var_os(CHILD_ENV).is_some(),
            "MetadataListener outside its network namespace"
        );
        let accepted = Arc::new(AtomicUsize::new(0));
        for ip in [IpAddr::V4(METADATA_V4), IpAddr::V6(METADATA_V6)] {
            let listener = TcpListener::bind(SocketAddr::new(ip, METADATA_PORT))
                .unwrap_or_else(|e| panic!("binding {ip}:{METADATA_PORT} in the namespace: {e}"));
            let count = accepted.clone();
            std::thread::spawn(move || serve(&listener, &count));
        }
        Self { accepted }
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

fn serve(listener: &TcpListener, count: &AtomicUsize) {
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        count.fetch_add(1, Ordering::SeqCst);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
        let mut buf = [0u8; 4096];
        let _ = stream.read(&mut buf);
        let body = format!(r#"{{"token":"{METADATA_SECRET}"}}"#);
        let _ = write!(
            stream,
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
}
