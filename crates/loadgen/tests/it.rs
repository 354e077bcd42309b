//! The load generator as a program: what the benchmark scripts rely on.

// A test fails by panicking.
#![allow(clippy::expect_used, clippy::panic)]

use std::io::Read;
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A server that accepts connections and never answers: what a deadlocked
/// Pebble looks like from the client.
fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("address").port();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in listener.incoming().flatten() {
            held.push(stream);
        }
    });
    port
}

#[test]
fn a_run_against_a_server_that_stops_answering_ends_with_status_3_after_the_stall_period() {
    let port = silent_server();
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_acme-loadgen"))
        .args([
            "--directory",
            &format!("http://127.0.0.1:{port}/dir"),
            "--orders",
            "4",
            "--stall-secs",
            "1",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start acme-loadgen");
    // Without the watchdog the run would hang: the directory request has no
    // timeout of its own.
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if started.elapsed() > Duration::from_secs(20) {
            child.kill().ok();
            panic!("acme-loadgen was still running after 20 s against a silent server");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let elapsed = started.elapsed();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("read stdout");
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");

    assert_eq!(status.code(), Some(3), "stderr: {stderr}");
    assert!(
        elapsed >= Duration::from_secs(1),
        "gave up after {elapsed:?}, before the stall period"
    );
    assert!(stderr.contains("the server stalled"), "stderr: {stderr}");
    assert!(
        stdout.is_empty(),
        "a stalled run prints no figures: {stdout}"
    );
}
