//! Running an operator's program safely: no shell, a cleared environment
//! (only a fixed `PATH`), input on stdin, a deadline after which it is
//! killed (and killed if its caller goes away) — with everything it started,
//! as it runs in a process group of its own —, and capped output, so a hung
//! or chatty script can neither stall nor flood the server. Used by the
//! script notifier and the custom signer.

use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The only environment a program gets.
const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

/// A program that finished in time.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

impl Finished {
    /// The first line of stderr (what a failure is logged with; never sent
    /// to a client).
    pub fn first_error_line(&self) -> String {
        String::from_utf8_lossy(&self.stderr)
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("could not start {0}: {1}")]
    Spawn(String, std::io::Error),
    #[error("did not finish within {0:?} and was killed")]
    TimedOut(Duration),
    #[error("wrote more than {0} bytes and was killed")]
    TooMuchOutput(usize),
    #[error("talking to it failed: {0}")]
    Io(std::io::Error),
}

/// Runs `program` with `args`, `input` on stdin, within `timeout`, keeping
/// at most `cap` bytes of each of stdout and stderr.
pub async fn run(
    program: &Path,
    args: &[String],
    input: &[u8],
    timeout: Duration,
    cap: usize,
) -> Result<Finished, RunError> {
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env_clear()
        .env("PATH", PATH)
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // Its own process group, so that what a script starts (`sleep`,
        // `openssl`) dies with it at the deadline.
        .process_group(0)
        .spawn()
        .map_err(|e| RunError::Spawn(program.display().to_string(), e))?;
    let mut group = GroupGuard(child.id());
    let mut stdin = child.stdin.take();
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let exchange = async {
        if let Some(mut w) = stdin.take() {
            // A program that does not read its input is not an error.
            let _ = w.write_all(input).await;
            drop(w);
        }
        // Each side stops at the cap and fails at once (try_join), so a
        // flood on one pipe does not wait for the other to close.
        let (out, err) = tokio::try_join!(
            read_capped(stdout.take(), cap),
            read_capped(stderr.take(), cap)
        )?;
        let status = child.wait().await.map_err(RunError::Io)?;
        // Finished: its group is left alone (the id may be reused soon).
        group.0 = None;
        Ok(Finished {
            status,
            stdout: out,
            stderr: err,
        })
    };
    // Dropping the future on timeout drops the child: kill_on_drop.
    match tokio::time::timeout(timeout, exchange).await {
        Ok(r) => r,
        Err(_) => Err(RunError::TimedOut(timeout)),
    }
}

/// Kills the program's process group unless disarmed: on the deadline,
/// on a flood, and when the caller goes away.
struct GroupGuard(Option<u32>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pid) = self
            .0
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
        {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
    }
}

/// Reads a pipe to its end, failing as soon as it passes `cap` bytes.
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(
    pipe: Option<R>,
    cap: usize,
) -> Result<Vec<u8>, RunError> {
    let mut buf = Vec::new();
    if let Some(p) = pipe {
        p.take(cap as u64 + 1)
            .read_to_end(&mut buf)
            .await
            .map_err(RunError::Io)?;
    }
    if buf.len() > cap {
        return Err(RunError::TooMuchOutput(cap));
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sh(script: &str) -> (std::path::PathBuf, tempfile::TempDir) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("prog");
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        (path, dir)
    }

    #[tokio::test]
    async fn a_program_gets_its_input_and_nothing_of_our_environment() {
        let (prog, _d) = sh("cat; env");
        let r = run(&prog, &[], b"hello\n", Duration::from_secs(5), 4096)
            .await
            .unwrap();
        let out = String::from_utf8(r.stdout).unwrap();
        assert!(out.starts_with("hello\n"), "{out}");
        assert!(out.contains("PATH=/usr/local/bin:/usr/bin:/bin"), "{out}");
        assert!(!out.contains("HOME=") && !out.contains("CARGO"), "{out}");
    }

    #[tokio::test]
    async fn a_hung_program_is_killed_at_the_deadline() {
        let (prog, _d) = sh("sleep 30");
        let started = std::time::Instant::now();
        let e = run(&prog, &[], b"", Duration::from_millis(300), 4096)
            .await
            .unwrap_err();
        assert!(matches!(e, RunError::TimedOut(_)), "{e}");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[tokio::test]
    async fn what_a_hung_program_started_is_killed_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("pid");
        let (prog, _d) = sh(&format!("sleep 30 & echo $! > {}; wait", pidfile.display()));
        let e = run(&prog, &[], b"", Duration::from_millis(500), 4096)
            .await
            .unwrap_err();
        assert!(matches!(e, RunError::TimedOut(_)), "{e}");
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Gone (or a zombie awaiting its reaper) within a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let alive = state
                .rsplit(')')
                .next()
                .and_then(|rest| rest.split_whitespace().next())
                .is_some_and(|s| s != "Z" && s != "X");
            if !alive {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "sleep {pid} survived: {state}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    #[tokio::test]
    async fn a_flood_of_output_is_cut_off() {
        let (prog, _d) = sh("yes");
        let e = run(&prog, &[], b"", Duration::from_secs(5), 10_000)
            .await
            .unwrap_err();
        assert!(matches!(e, RunError::TooMuchOutput(_)), "{e}");
    }

    #[tokio::test]
    async fn the_first_error_line_is_kept_for_the_log() {
        let (prog, _d) = sh("echo 'first problem' >&2; echo second >&2; exit 3");
        let r = run(&prog, &[], b"", Duration::from_secs(5), 4096)
            .await
            .unwrap();
        assert_eq!(r.status.code(), Some(3));
        assert_eq!(r.first_error_line(), "first problem");
    }
}
