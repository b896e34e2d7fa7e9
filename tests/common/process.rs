//! The real `tito` binary as a child process, its stdout and stderr lines
//! read as they come.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

/// How long a process may take to print its listening line.
pub const START_TIMEOUT: Duration = Duration::from_secs(120);

/// A running `tito` whose stdout and stderr lines are read as they come.
pub struct Tito {
    /// `None` once [`Tito::wait_exit`] took it.
    child: Option<Child>,
    lines: mpsc::Receiver<(&'static str, String)>,
    seen: Vec<(&'static str, String)>,
}

impl Tito {
    pub fn spawn(args: &[&str], rust_log: Option<&str>) -> Tito {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tito"));
        cmd.args(args)
            .env_remove("TITO_LOG_FORMAT")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        match rust_log {
            Some(l) => cmd.env("RUST_LOG", l),
            None => cmd.env_remove("RUST_LOG"),
        };
        let mut child = cmd.spawn().expect("run tito");
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        for (name, pipe) in [
            ("stdout", Box::new(out) as Box<dyn std::io::Read + Send>),
            ("stderr", Box::new(err)),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    if tx.send((name, line)).is_err() {
                        break;
                    }
                }
            });
        }
        Tito {
            child: Some(child),
            lines,
            seen: Vec::new(),
        }
    }

    /// Reads lines until one (as JSON) has this message; returns it.
    pub fn wait_for(&mut self, message: &str) -> Value {
        loop {
            let (stream, line) = self
                .lines
                .recv_timeout(START_TIMEOUT)
                .unwrap_or_else(|_| panic!("no {message:?} line; got so far: {:#?}", self.seen));
            self.seen.push((stream, line.clone()));
            if let Ok(v) = serde_json::from_str::<Value>(&line) {
                if v["message"] == message {
                    return v;
                }
            }
        }
    }

    /// Stops the process and returns every line it wrote.
    pub fn stop(&mut self) -> Vec<(&'static str, String)> {
        self.kill();
        // Both pipes close with the process: the readers end, the channel too.
        let rest: Vec<_> = self.lines.iter().collect();
        self.seen.extend(rest);
        std::mem::take(&mut self.seen)
    }
}

impl Tito {
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends SIGTERM (what `systemctl stop` and `docker stop` send).
    pub fn terminate(&self) {
        if let Some(pid) = self.pid().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill(2) with a pid this test started and a valid signal.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }

    /// Waits up to `timeout` for the process to exit; its status, or `None`
    /// when it did not exit in time (it is then killed).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait());
        });
        match rx.recv_timeout(timeout) {
            Ok(status) => status.ok(),
            Err(_) => {
                if let Ok(pid) = i32::try_from(pid) {
                    // SAFETY: as in `terminate`.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
                None
            }
        }
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Tito {
    /// A failed test does not leave the process running.
    fn drop(&mut self) {
        self.kill();
    }
}
