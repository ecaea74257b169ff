//! `ivory serve --supervise`: a serving process ended by SIGKILL (as the OOM killer ends one) is
//! replaced on the same listening socket, and no connection made meanwhile is refused; SIGTERM
//! reaches the serving process and the parent exits with its status.

use std::time::Duration;

use rustix::process::{Pid, Signal, kill_process};

use crate::util::Ivory;
use ivory_testkit::eventually;

/// The serving process started by the supervising process `parent` (`ppid` field of
/// `/proc/PID/stat`), if there is one.
fn serving_child(parent: u32) -> Option<i32> {
    std::fs::read_dir("/proc")
        .ok()?
        .flatten()
        .find_map(|entry| {
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            // The command name, in parentheses, may hold spaces: the fields after it are fixed.
            let after_name = &stat[stat.rfind(')')? + 2..];
            let ppid: u32 = after_name.split(' ').nth(1)?.parse().ok()?;
            (ppid == parent).then_some(pid)
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_serving_process_is_replaced_without_refusing_a_connection() {
    let dir = tempfile::tempdir().unwrap();
    let mut ivory = Ivory::start_in(dir.path(), &["--supervise".into()]).await;
    let parent = ivory.child.id().unwrap();
    let first = serving_child(parent).expect("a serving process");
    kill_process(Pid::from_raw(first).unwrap(), Signal::KILL).unwrap();

    // From the kill on: each request on a connection of its own, as the API server dials again
    // after losing its connection. Without the supervising process the first would be refused.
    let client = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(ivory.ca_pem.as_bytes()).unwrap()])
        .pool_max_idle_per_host(0)
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    for i in 0..50 {
        let answer = client.get(ivory.url("/healthz")).send().await;
        match answer {
            Ok(r) => assert_eq!(r.status(), 200, "request {i}"),
            Err(e) => panic!("request {i} after the SIGKILL failed: {e:?}"),
        }
    }
    let second = serving_child(parent).expect("a serving process again");
    assert_ne!(first, second, "the killed process was replaced");
    assert!(
        ivory
            .logs()
            .contains("serving process killed; starting another on the same socket"),
        "{}",
        ivory.logs()
    );

    kill_process(Pid::from_raw(parent as i32).unwrap(), Signal::TERM).unwrap();
    let status = tokio::time::timeout(Duration::from_secs(20), ivory.child.wait())
        .await
        .expect("the supervising process ends after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(
        eventually(
            "the serving process to end",
            Duration::from_secs(5),
            || async { !std::path::Path::new(&format!("/proc/{second}")).exists() }
        )
        .await
        .is_ok(),
        "the serving process ended too"
    );
}
