//! A throwaway etcd on loopback ports that only the warden knows: the start-up check's validation,
//! the replay of deltas, deep verify and drills, and the fenced final snapshot. Its client and peer
//! listeners speak TLS and demand a certificate only the warden has (`super::private_tls`), which
//! etcd also takes as its `root` user: the warden reads it whatever auth the data has, and no other
//! local user can.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use etcd_client::Client;

use super::private_tls::PrivateTls;
use crate::process::pid1::{ExitStatus, Reaper, run_to_completion};

/// Why a private etcd did not come up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartError {
    /// etcd itself exited at start: it refused the data (or its flags). Otherwise nothing was
    /// learnt of the data (no answer in time, no process), which is no evidence against it.
    pub refused: bool,
    pub message: String,
}

impl StartError {
    fn unknown(message: String) -> Self {
        Self {
            refused: false,
            message,
        }
    }
}

/// A throwaway etcd on loopback ports that only the restore knows.
pub struct PrivateEtcd {
    pid: u32,
    exit: tokio::sync::oneshot::Receiver<ExitStatus>,
    endpoint: String,
    log_path: std::path::PathBuf,
    stopped: bool,
    /// Dropped (its files removed) after the process: declared after `stopped`, dropped after
    /// `Drop::drop` has killed it.
    tls: PrivateTls,
}

impl Drop for PrivateEtcd {
    /// An interrupted restore must not leave the private etcd running.
    fn drop(&mut self) {
        if !self.stopped {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(self.pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| format!("find a free loopback port: {e}"))
}

impl PrivateEtcd {
    /// Starts etcd on `data` with client and peer listeners on loopback ports nobody else is told,
    /// and waits for it to answer. `scratch`: the dir is a restore's work dir, so fsync may be
    /// skipped (3.5+) and done once before the swap; on a real data dir every write is synced as
    /// usual.
    pub async fn start(
        reaper: &Reaper,
        etcd: &Path,
        data: &Path,
        wal: Option<&Path>,
        name: &str,
        log_path: &Path,
        scratch: bool,
    ) -> Result<Self, String> {
        Self::start_checked(reaper, etcd, data, wal, name, log_path, scratch)
            .await
            .map_err(|e| e.message)
    }

    /// `start`, telling etcd's refusal of the data (it exited at start) from a failure to learn
    /// anything (no answer in time, no process): only the first is evidence against the data.
    pub async fn start_checked(
        reaper: &Reaper,
        etcd: &Path,
        data: &Path,
        wal: Option<&Path>,
        name: &str,
        log_path: &Path,
        scratch: bool,
    ) -> Result<Self, StartError> {
        // Its ports are free when picked and bound only when etcd starts: another process can
        // take one meanwhile. That says nothing about the data dir (a validation must not call it
        // broken): pick other ports and start again.
        let mut attempts = 0;
        loop {
            let mut me = Self::spawn(reaper, etcd, data, wal, name, log_path, scratch)
                .await
                .map_err(StartError::unknown)?;
            match me.come_up().await {
                Ok(()) => return Ok(me),
                Err(e) if e.message.contains("address already in use") && attempts < 3 => {
                    attempts += 1;
                    tracing::warn!(error = %e.message, "a port picked for the private etcd was taken meanwhile; starting it on other ports");
                }
                Err(e) if e.message.contains("address already in use") => {
                    return Err(StartError::unknown(e.message));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// `start` without the wait: for a caller that may be cancelled while etcd comes up (the
    /// fence, when ownership returns). It holds the process meanwhile and stops it, waiting for
    /// its exit, so that nothing else starts on the data dir while this one still has it open.
    pub async fn spawn(
        reaper: &Reaper,
        etcd: &Path,
        data: &Path,
        wal: Option<&Path>,
        name: &str,
        log_path: &Path,
        scratch: bool,
    ) -> Result<Self, String> {
        // A cluster member's data names its peers: an etcd started on it dials them at their peer
        // URLs as that member (a second instance of one identity in their raft group). Never.
        if let Some(n) = crate::etcd::local::member_count(data).filter(|n| *n > 1) {
            return Err(format!(
                "{} is a cluster member's data ({n} members in its membership): a private etcd on it would reach the other members; not started",
                data.display()
            ));
        }
        let log_path = log_path.to_owned();
        // Where its errors go, so that a failed start can say why. Failing to create that file is
        // the environment's problem, never evidence against the data dir: carry on without it.
        let log: std::process::Stdio = match super::dirs::create_fresh(&log_path) {
            Ok(f) => f.into(),
            Err(e) => {
                tracing::warn!(path = %log_path.display(), error = %e, "cannot create the private etcd's log; running it without one");
                std::process::Stdio::null()
            }
        };
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let endpoint = format!("https://127.0.0.1:{client_port}");
        let tls = PrivateTls::create(&super::dirs::beside(
            data,
            &format!(".private-tls-{}", fastrand::u64(..)),
        ))?;
        let (_, version, _) = run_to_completion(reaper, Command::new(etcd).arg("--version"))
            .await
            .map_err(|e| format!("run {} --version: {e}", etcd.display()))?;
        // Own process group, parent-death signal, no warden variables: like the supervised etcd.
        let mut cmd = crate::etcd::supervisor::Launch {
            program: etcd.to_owned(),
            args: Vec::new(),
            env: Vec::new(),
        }
        .command();
        cmd.arg("--name")
            .arg(name)
            .arg("--data-dir")
            .arg(data)
            .arg("--listen-client-urls")
            .arg(&endpoint)
            .arg("--advertise-client-urls")
            .arg(&endpoint)
            .arg("--listen-peer-urls")
            .arg(format!("https://127.0.0.1:{peer_port}"))
            .arg("--log-level")
            .arg("error")
            .arg("--quota-backend-bytes")
            .arg((8u64 << 30).to_string())
            // A replayed revision is one transaction however many keys it changed (a range delete
            // of thousands of keys is one revision), and as large as the original allowed.
            .arg("--max-txn-ops")
            .arg((1u32 << 20).to_string())
            .arg("--max-request-bytes")
            .arg((64u32 << 20).to_string())
            .stdout(std::process::Stdio::null())
            .stderr(log);
        // Both listeners: TLS, and a certificate from the warden's own CA demanded.
        for listener in ["", "peer-"] {
            cmd.arg(format!("--{listener}client-cert-auth"))
                .arg(format!("--{listener}trusted-ca-file"))
                .arg(tls.ca())
                .arg(format!("--{listener}cert-file"))
                .arg(tls.cert())
                .arg(format!("--{listener}key-file"))
                .arg(tls.key());
        }
        if let Some(wal) = wal {
            cmd.arg("--wal-dir").arg(wal);
        }
        if scratch && !version.contains("etcd Version: 3.4") {
            // 3.5+: skip fsync while replaying; the warden syncs the files once before the swap.
            cmd.arg("--unsafe-no-fsync");
        }
        for (k, _) in std::env::vars() {
            if k.starts_with("ETCD_") {
                cmd.env_remove(k);
            }
        }
        let spawned = reaper
            .spawn(&mut cmd)
            .map_err(|e| format!("start the private etcd: {e}"))?;
        Ok(Self {
            pid: spawned.pid,
            exit: spawned.exit,
            endpoint,
            log_path,
            stopped: false,
            tls,
        })
    }

    /// Waits until it answers a read. On an error it has exited (or been stopped).
    pub async fn wait_up(&mut self) -> Result<(), String> {
        self.come_up().await.map_err(|e| e.message)
    }

    async fn come_up(&mut self) -> Result<(), StartError> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(status) = self.exit.try_recv() {
                self.stopped = true;
                let log = std::fs::read_to_string(&self.log_path).unwrap_or_default();
                let tail: String = log.lines().rev().take(3).collect::<Vec<_>>().join(" | ");
                let message = format!("the private etcd exited at start ({status}): {tail}");
                // Killed by a signal (the OOM killer, an operator): etcd said nothing of the data.
                return Err(match status {
                    ExitStatus::Code(_) => StartError {
                        refused: true,
                        message,
                    },
                    _ => StartError::unknown(message),
                });
            }
            if let Ok(mut c) = self.client().await
                && revision(&mut c, true).await.is_ok()
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.halt().await;
                return Err(StartError::unknown(
                    "the private etcd did not answer within 60 s".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn client(&self) -> Result<Client, String> {
        self.client_within(Duration::from_secs(30)).await
    }

    /// `client` for requests that read the whole database (HashKV, a physical compaction):
    /// `client::WHOLE_DATABASE` each.
    pub async fn long_client(&self) -> Result<Client, String> {
        self.client_within(super::client::WHOLE_DATABASE).await
    }

    async fn client_within(&self, timeout: Duration) -> Result<Client, String> {
        let tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(&self.tls.ca_pem))
            .identity(etcd_client::Identity::from_pem(
                &self.tls.client_cert_pem,
                &self.tls.client_key_pem,
            ));
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(timeout)
            .with_tls(tls);
        Client::connect([self.endpoint.as_str()], Some(opts))
            .await
            .map_err(|e| format!("connect to the private etcd: {e}"))
    }

    pub async fn stop(mut self) {
        self.halt().await;
    }

    /// SIGTERM, SIGKILL after 30 s, and the exit awaited (once).
    async fn halt(&mut self) {
        if self.stopped {
            return;
        }
        self.stopped = true;
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        if tokio::time::timeout(Duration::from_secs(30), &mut self.exit)
            .await
            .is_err()
        {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.exit).await;
        }
    }
}

/// The revision a private etcd on restored data serves.
pub async fn restored_revision(client: &mut Client) -> Result<i64, String> {
    revision(client, false)
        .await
        .map_err(|e| format!("read the restored revision: {e}"))
}

/// The revision etcd serves (a `serializable` read answers without a leader). Data with auth
/// enabled refuses the read to a client without credentials but still answers `Status`, whose
/// header carries the same revision.
pub async fn revision(client: &mut Client, serializable: bool) -> Result<i64, etcd_client::Error> {
    let opts = serializable.then(|| etcd_client::GetOptions::new().with_serializable());
    match client.get("\0", opts).await {
        Ok(r) => Ok(r.header().map(|h| h.revision()).unwrap_or(0)),
        Err(e) if crate::etcd::client::is_auth_error(&e) => {
            let s = client.status().await?;
            Ok(s.header().map(|h| h.revision()).unwrap_or(0))
        }
        Err(e) => Err(e),
    }
}
