//! Client-side encryption of snapshot payloads with age (X25519 recipients).
//!
//! The payload of an encrypted object is an ordinary age file (binary, not armored) wrapping the
//! compressed bytes, so `age -d -i key.txt` decrypts a payload cut out of a downloaded object (see
//! docs/FORMAT.md). The warden needs only the public key (`--encrypt-to age1…`) to write backups;
//! the identity (`AGE-SECRET-KEY-1…`) is needed to restore, and only there.
//!
//! Both directions are push style, like the codecs in `compress.rs`: bytes go in as they arrive,
//! output is taken as it is produced. age's decryptor pulls from a reader, so decryption runs on
//! its own thread fed through a channel; it is far faster than any download, so the queues stay short.

use std::io::{self, Read, Write};
use std::path::Path;
use std::str::FromStr;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use age::x25519::{Identity, Recipient};

/// The keys a store handle carries: recipients to write with, identities to read with.
#[derive(Clone, Default)]
pub struct Keys {
    pub recipients: Arc<Vec<Recipient>>,
    pub identities: Arc<Vec<Identity>>,
    /// Keys of unencrypted objects (or etcd-backup-restore's) the operator accepts although the
    /// store is read with an identity (`--allow-unencrypted`).
    pub allow_unencrypted: Arc<Vec<String>>,
    /// The sign key objects are signed with and the keys readers trust (`--sign-key`,
    /// `--verify-key`, `--allow-unsigned`).
    pub signing: crate::store::sign::Signing,
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys")
            .field("recipients", &self.recipients.len())
            .field("identities", &self.identities.len())
            .finish()
    }
}

impl Keys {
    pub fn encrypts(&self) -> bool {
        !self.recipients.is_empty()
    }

    /// Whether an object that is not age-encrypted (`key`) may be read: with an identity, the
    /// store is read as an encrypted one, and anyone who can write to the bucket can add an
    /// unencrypted object, so only those the operator named are accepted.
    pub fn unencrypted_allowed(&self, key: &str) -> Result<(), String> {
        if self.identities.is_empty() || self.allow_unencrypted.iter().any(|k| k.trim() == key) {
            return Ok(());
        }
        Err(format!(
            "{key} is not encrypted, and the store is read with --identity-file: refused (anyone who \
             can write to the bucket can add an unencrypted object); name it in --allow-unencrypted \
             to accept it"
        ))
    }
}

/// Recipients from `--encrypt-to` values (comma-separated allowed) and recipients files (one per
/// line, `#` comments), as `age -r` / `age -R` take them.
pub fn recipients(values: &[String], files: &[std::path::PathBuf]) -> Result<Vec<Recipient>, String> {
    let mut out = Vec::new();
    let mut add = |s: &str, from: &str| -> Result<(), String> {
        let s = s.trim();
        if s.is_empty() || s.starts_with('#') {
            return Ok(());
        }
        out.push(Recipient::from_str(s).map_err(|e| {
            format!(
                "{from}: {s:?} is not an age X25519 recipient ({e}; write age1…, as age-keygen -y prints)"
            )
        })?);
        Ok(())
    };
    for v in values {
        for part in v.split(',') {
            add(part, "--encrypt-to")?;
        }
    }
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| format!("{}: {e}", f.display()))?;
        for line in text.lines() {
            add(line, &f.display().to_string())?;
        }
    }
    Ok(out)
}

/// Identities from an age identity file (`AGE-SECRET-KEY-1…` lines, `#` comments), as age-keygen writes.
pub fn identities(path: &Path) -> Result<Vec<Identity>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        out.push(Identity::from_str(line).map_err(|e| {
            format!(
                "{} line {}: not an age X25519 identity ({e}; write AGE-SECRET-KEY-1…, as age-keygen writes)",
                path.display(),
                n + 1
            )
        })?);
    }
    if out.is_empty() {
        return Err(format!("{}: holds no AGE-SECRET-KEY-1… line", path.display()));
    }
    Ok(out)
}

/// A `Write` whose bytes the owner takes out between writes.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<Vec<u8>>>);

impl Write for Shared {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| io::Error::other("poisoned"))?
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn take(&self) -> Vec<u8> {
        self.0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default()
    }
}

/// Encrypts a payload to the recipients.
pub struct Sealer {
    writer: age::stream::StreamWriter<Shared>,
    out: Shared,
}

impl Sealer {
    pub fn new(recipients: &[Recipient]) -> io::Result<Self> {
        let encryptor = age::Encryptor::with_recipients(recipients.iter().map(|r| r as &dyn age::Recipient))
            .map_err(|e| io::Error::other(e.to_string()))?;
        let out = Shared::default();
        let writer = encryptor.wrap_output(out.clone())?;
        Ok(Self { writer, out })
    }

    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        self.writer.write_all(data)
    }

    pub fn take(&mut self) -> Vec<u8> {
        self.out.take()
    }

    pub fn finish(self) -> io::Result<Vec<u8>> {
        let out = self.writer.finish()?;
        Ok(out.take())
    }
}

/// A `Read` over chunks arriving on a channel; EOF when the sender is dropped.
struct ChannelReader {
    rx: mpsc::Receiver<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            match self.rx.recv() {
                Ok(next) => {
                    self.current = next;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Decrypts a payload with the identities.
pub struct Opener {
    input: Option<mpsc::Sender<Vec<u8>>>,
    output: mpsc::Receiver<io::Result<Vec<u8>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Opener {
    pub fn new(identities: Arc<Vec<Identity>>) -> io::Result<Self> {
        if identities.is_empty() {
            return Err(io::Error::other(
                "the snapshot is encrypted with age and no identity was given (pass --identity-file FILE)",
            ));
        }
        let (input, rx) = mpsc::channel::<Vec<u8>>();
        let (tx, output) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("age-decrypt".into())
            .spawn(move || {
                let reader = ChannelReader {
                    rx,
                    current: Vec::new(),
                    pos: 0,
                };
                let result = (|| -> io::Result<()> {
                    let decryptor =
                        age::Decryptor::new(reader).map_err(|e| io::Error::other(e.to_string()))?;
                    let mut plain = decryptor
                        .decrypt(identities.iter().map(|i| i as &dyn age::Identity))
                        .map_err(|e| {
                            io::Error::other(format!("{e} (is this the identity of one of the recipients?)"))
                        })?;
                    let mut buf = vec![0u8; 256 * 1024];
                    loop {
                        let n = plain.read(&mut buf)?;
                        if n == 0 {
                            return Ok(());
                        }
                        if tx.send(Ok(buf[..n].to_vec())).is_err() {
                            return Ok(());
                        }
                    }
                })();
                if let Err(e) = result {
                    let _ = tx.send(Err(e));
                }
            })?;
        Ok(Self {
            input: Some(input),
            output,
            thread: Some(thread),
        })
    }

    pub fn write(&mut self, data: &[u8]) -> io::Result<()> {
        match &self.input {
            Some(tx) => tx.send(data.to_vec()).map_err(|_| {
                self.failure()
                    .unwrap_or_else(|| io::Error::other("decryption stopped"))
            }),
            None => Err(io::Error::other("write after finish")),
        }
    }

    /// The first error the decryptor reported, if any (consumes output up to it).
    fn failure(&self) -> Option<io::Error> {
        self.output.try_iter().find_map(|r| r.err())
    }

    /// Plaintext produced so far.
    pub fn take(&mut self) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        for r in self.output.try_iter() {
            out.extend(r?);
        }
        Ok(out)
    }

    /// Ends the input and returns the rest; fails on a truncated or tampered payload.
    pub fn finish(mut self) -> io::Result<Vec<u8>> {
        drop(self.input.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let mut out = Vec::new();
        for r in self.output.try_iter() {
            out.extend(r?);
        }
        Ok(out)
    }
}

impl Drop for Opener {
    fn drop(&mut self) {
        // Dropping the sender ends the thread's input; it exits at its next read or send.
        drop(self.input.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_in_small_pushes_and_wrong_key_and_tamper_fail() {
        let key = Identity::generate();
        let data: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let mut s = Sealer::new(&[key.to_public()]).unwrap();
        let mut sealed = Vec::new();
        for c in data.chunks(7777) {
            s.write(c).unwrap();
            sealed.extend(s.take());
        }
        sealed.extend(s.finish().unwrap());
        assert!(sealed.starts_with(b"age-encryption.org/v1\n"));

        let open = |ids: Vec<Identity>, bytes: &[u8]| -> io::Result<Vec<u8>> {
            let mut o = Opener::new(Arc::new(ids))?;
            let mut out = Vec::new();
            for c in bytes.chunks(999) {
                o.write(c)?;
                out.extend(o.take()?);
            }
            out.extend(o.finish()?);
            Ok(out)
        };
        assert_eq!(open(vec![key.clone()], &sealed).unwrap(), data);
        assert!(
            open(vec![Identity::generate()], &sealed).is_err(),
            "a wrong key decrypted"
        );
        let mut tampered = sealed.clone();
        let n = tampered.len();
        tampered[n - 100] ^= 1;
        assert!(
            open(vec![key.clone()], &tampered).is_err(),
            "tampering went unnoticed"
        );
        assert!(
            open(vec![key], &sealed[..sealed.len() - 10]).is_err(),
            "truncation went unnoticed"
        );
        assert!(Opener::new(Arc::new(Vec::new())).is_err());
    }

    #[test]
    fn recipients_parse_with_clear_errors() {
        let pk = Identity::generate().to_public().to_string();
        assert_eq!(recipients(&[format!("{pk}, {pk}")], &[]).unwrap().len(), 2);
        let err = recipients(&["age1nope".into()], &[]).err().unwrap();
        assert!(err.contains("--encrypt-to") && err.contains("age1nope"), "{err}");
    }
}
