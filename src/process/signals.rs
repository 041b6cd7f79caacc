//! OS signals turned into typed events.
//!
//! One dedicated thread owns every handler (signal-hook's self-pipe iterator). SIGCHLD never leaves
//! that thread: it drains the reaper right there, so exits are collected even while the async side
//! is busy. Everything else becomes a [`SignalEvent`] on a channel for the run loop: the control
//! signals (TERM, INT, USR1, USR2, HUP) by name, the rest as "forward this to etcd".

use std::io;
use std::thread;

use nix::sys::signal::Signal;
use signal_hook::consts::signal as sig;
use signal_hook::iterator::Signals;
use tokio::sync::mpsc;

use crate::process::pid1::Reaper;

/// A signal the warden acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalEvent {
    /// SIGTERM or SIGINT: stop gracefully (a second one: SIGKILL now).
    Stop(Signal),
    /// SIGUSR1: full snapshot now.
    FullSnapshot,
    /// SIGUSR2: flush a delta snapshot now.
    DeltaSnapshot,
    /// SIGHUP: re-read configuration and credentials, re-check ownership.
    Reload,
    /// Anything else that can be caught: pass it on to etcd.
    Forward(Signal),
}

/// Signals passed through to etcd unchanged. SIGQUIT makes etcd (Go) dump its goroutines.
pub const FORWARDED: &[i32] = &[
    sig::SIGQUIT,
    sig::SIGALRM,
    sig::SIGWINCH,
    sig::SIGCONT,
    sig::SIGTSTP,
    sig::SIGTTIN,
    sig::SIGTTOU,
    Signal::SIGPWR as i32,
    sig::SIGVTALRM,
    sig::SIGPROF,
    sig::SIGXCPU,
    sig::SIGXFSZ,
];

fn classify(signo: i32) -> Option<SignalEvent> {
    let signal = Signal::try_from(signo).ok()?;
    Some(match signal {
        Signal::SIGTERM | Signal::SIGINT => SignalEvent::Stop(signal),
        Signal::SIGUSR1 => SignalEvent::FullSnapshot,
        Signal::SIGUSR2 => SignalEvent::DeltaSnapshot,
        Signal::SIGHUP => SignalEvent::Reload,
        Signal::SIGCHLD => return None,
        other => SignalEvent::Forward(other),
    })
}

/// Installs the handlers and starts the signal thread. Call before spawning any child.
pub fn start(reaper: Reaper) -> io::Result<mpsc::UnboundedReceiver<SignalEvent>> {
    let mut wanted = vec![
        sig::SIGCHLD,
        sig::SIGTERM,
        sig::SIGINT,
        sig::SIGUSR1,
        sig::SIGUSR2,
        sig::SIGHUP,
    ];
    wanted.extend_from_slice(FORWARDED);
    let mut signals = Signals::new(&wanted)?;
    let (tx, rx) = mpsc::unbounded_channel();
    thread::Builder::new().name("signals".into()).spawn(move || {
        // Children that exited before the handler was installed.
        reaper.reap();
        for signo in signals.forever() {
            if signo == sig::SIGCHLD {
                reaper.reap();
                continue;
            }
            if let Some(event) = classify(signo)
                && tx.send(event).is_err()
            {
                return;
            }
        }
    })?;
    Ok(rx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classification() {
        assert_eq!(classify(sig::SIGTERM), Some(SignalEvent::Stop(Signal::SIGTERM)));
        assert_eq!(classify(sig::SIGINT), Some(SignalEvent::Stop(Signal::SIGINT)));
        assert_eq!(classify(sig::SIGUSR1), Some(SignalEvent::FullSnapshot));
        assert_eq!(classify(sig::SIGUSR2), Some(SignalEvent::DeltaSnapshot));
        assert_eq!(classify(sig::SIGHUP), Some(SignalEvent::Reload));
        assert_eq!(classify(sig::SIGCHLD), None);
        assert_eq!(
            classify(sig::SIGQUIT),
            Some(SignalEvent::Forward(Signal::SIGQUIT))
        );
    }
}
