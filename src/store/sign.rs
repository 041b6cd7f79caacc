//! Signed objects: an Ed25519 key (`--sign-key`) binds each object's name, header, payload digest
//! and footer together, and a reader that trusts the key (`--verify-key`, or the sign key's own
//! public half) refuses what it did not sign. age proves who can read an object, not who wrote it:
//! anyone with the public recipient can encrypt forged data; only the sign key's holder can sign.
//!
//! What is signed (docs/FORMAT.md, "Signatures") is byte-exact, never re-serialized:
//!
//!     "etcd-warden signature v1\n" | u32 len | name | u32 len | header JSON
//!         | u64 payload_len | sha256(payload) | u32 len | footer JSON without the signature
//!
//! where `name` is the key from its `v1/` on (a copy under another prefix stays valid). The
//! signature goes into the footer as its last member, `,"signature":"ed25519:<key id>:<hex>"}`,
//! and a reader takes exactly that suffix off to get the signed footer back. Small JSON records
//! (the head, the owner record, restore plans) carry the same suffix over
//! `"etcd-warden record v1\n" | u32 len | name | record JSON without the signature`.

use std::path::Path;
use std::sync::Arc;

use ring::signature::{ED25519, Ed25519KeyPair, KeyPair, UnparsedPublicKey};
use sha2::{Digest, Sha256};

const OBJECT_CONTEXT: &[u8] = b"etcd-warden signature v1\n";
const RECORD_CONTEXT: &[u8] = b"etcd-warden record v1\n";
const SUFFIX_START: &[u8] = b",\"signature\":\"";
/// The DER prefix of an Ed25519 SubjectPublicKeyInfo (`openssl pkey -pubout`), before the 32 key
/// bytes.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// The signing side of a store handle and what its readers trust.
#[derive(Clone, Default)]
pub struct Signing {
    key: Option<Arc<Ed25519KeyPair>>,
    trusted: Arc<Vec<[u8; 32]>>,
    /// Keys of unsigned objects the operator accepts although the store is read as a signed one
    /// (`--allow-unsigned`).
    allow_unsigned: Arc<Vec<String>>,
}

impl std::fmt::Debug for Signing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signing")
            .field("signs", &self.key.is_some())
            .field("trusted", &self.trusted.len())
            .finish()
    }
}

impl Signing {
    /// `sign_key`: a PKCS#8 PEM Ed25519 private key (`openssl genpkey -algorithm ed25519`);
    /// `verify_keys`: PEM public keys (`openssl pkey -pubout`). The sign key's public half is
    /// trusted too.
    pub fn load(
        sign_key: Option<&Path>,
        verify_keys: &[std::path::PathBuf],
        allow_unsigned: &[String],
    ) -> Result<Self, String> {
        let key = match sign_key {
            Some(p) => {
                let der = pem(p, "PRIVATE KEY")?;
                Some(Arc::new(Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der).map_err(|e| {
                    format!(
                        "{}: not an Ed25519 private key ({e}; write one with `openssl genpkey -algorithm ed25519 -out FILE`)",
                        p.display()
                    )
                })?))
            }
            None => None,
        };
        let mut trusted = Vec::new();
        if let Some(k) = &key {
            trusted.push(k.public_key().as_ref().try_into().expect("32 bytes"));
        }
        for p in verify_keys {
            let der = pem(p, "PUBLIC KEY")?;
            match der.strip_prefix(&SPKI_PREFIX[..]) {
                Some(raw) if raw.len() == 32 => trusted.push(raw.try_into().expect("32 bytes")),
                _ => {
                    return Err(format!(
                        "{}: not an Ed25519 public key (write it with `openssl pkey -in SIGN_KEY -pubout -out FILE`)",
                        p.display()
                    ));
                }
            }
        }
        Ok(Self {
            key,
            trusted: Arc::new(trusted),
            allow_unsigned: Arc::new(allow_unsigned.iter().map(|k| k.trim().to_owned()).collect()),
        })
    }

    pub fn signs(&self) -> bool {
        self.key.is_some()
    }

    /// Whether readers require signatures.
    pub fn verifies(&self) -> bool {
        !self.trusted.is_empty()
    }

    /// Whether `key` is named in `--allow-unsigned`.
    pub fn unsigned_allowed(&self, key: &str) -> bool {
        self.allow_unsigned.iter().any(|k| k == key)
    }

    /// An object that carries no signature of ours (`key`, which the reason names; `what` says
    /// why it has none): refused when readers require one.
    pub fn unsigned(&self, key: &str, what: &str) -> Result<(), String> {
        self.refuse_unsigned(key, what)
            .map_err(|reason| format!("{key} {reason}"))
    }

    fn refuse_unsigned(&self, key: &str, what: &str) -> Result<(), String> {
        if !self.verifies() || self.unsigned_allowed(key) {
            return Ok(());
        }
        Err(format!(
            "{what}, and the store is read with a signing key: refused (anyone who can write to \
             the bucket can add an object); name it in --allow-unsigned to accept it"
        ))
    }

    /// The footer to write: `footer` (JSON, ending in `}`) with the signature over the object
    /// appended, or `footer` itself when this handle does not sign.
    pub fn seal_object(
        &self,
        key: &str,
        header: &[u8],
        payload_len: u64,
        digest: &[u8; 32],
        footer: Vec<u8>,
    ) -> Vec<u8> {
        let Some(k) = &self.key else {
            return footer;
        };
        let footer = trimmed(footer);
        let msg = object_message(key, header, payload_len, digest, &footer);
        append(footer, k, &msg)
    }

    /// Checks an object's signature: `footer` as stored. Unsigned objects are refused when
    /// readers require signatures (unless allowed by name); a signature that does not verify
    /// always is.
    pub fn open_object(
        &self,
        key: &str,
        header: &[u8],
        payload_len: u64,
        digest: &[u8; 32],
        footer: &[u8],
    ) -> Result<(), String> {
        match split(footer)? {
            None => self.refuse_unsigned(key, "it is not signed"),
            Some((signed, sig)) => {
                let msg = object_message(key, header, payload_len, digest, &signed);
                self.check(&msg, sig)
            }
        }
    }

    /// A small JSON record to write, signed when this handle signs.
    pub fn seal_record(&self, key: &str, json: Vec<u8>) -> Vec<u8> {
        let Some(k) = &self.key else {
            return json;
        };
        let json = trimmed(json);
        let msg = record_message(key, &json);
        append(json, k, &msg)
    }

    /// Checks a small JSON record as `open_object` checks an object.
    pub fn open_record(&self, key: &str, json: &[u8]) -> Result<(), String> {
        match split(json)? {
            None => self.refuse_unsigned(key, "it is not signed"),
            Some((signed, sig)) => self.check(&record_message(key, &signed), sig),
        }
    }

    /// The reasons name no key: the caller's error does.
    fn check(&self, msg: &[u8], sig: &str) -> Result<(), String> {
        if !self.verifies() {
            // Signed by someone, read by a handle that trusts no key: as good as unsigned.
            return Ok(());
        }
        let bad = |why: &str| -> Result<(), String> { Err(format!("{why}: refused")) };
        let Some((id, hex_sig)) = sig.strip_prefix("ed25519:").and_then(|s| s.split_once(':')) else {
            return bad("its signature is not an Ed25519 one this release reads");
        };
        let Ok(sig) = hex::decode(hex_sig) else {
            return bad("its signature is not hex");
        };
        let Some(public) = self.trusted.iter().find(|k| key_id(&k[..]) == id) else {
            return bad(format!(
                "it is signed by key {id}, which is not trusted here (--sign-key, --verify-key)"
            )
            .as_str());
        };
        match UnparsedPublicKey::new(&ED25519, public).verify(msg, &sig) {
            Ok(()) => Ok(()),
            Err(_) => {
                bad("its signature does not match its name, header, payload and footer (forged or altered)")
            }
        }
    }
}

/// The key id a signature names: the first 8 bytes of sha256(public key), hex.
fn key_id(public: &[u8]) -> String {
    hex::encode(&Sha256::digest(public)[..8])
}

/// The part of `key` a signature covers: from its `v1/` on.
fn signed_name(key: &str) -> &str {
    if key.starts_with("v1/") {
        return key;
    }
    key.rfind("/v1/").map_or(key, |i| &key[i + 1..])
}

fn field(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn object_message(key: &str, header: &[u8], payload_len: u64, digest: &[u8; 32], footer: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(OBJECT_CONTEXT);
    field(&mut m, signed_name(key).as_bytes());
    field(&mut m, header);
    m.extend_from_slice(&payload_len.to_le_bytes());
    m.extend_from_slice(digest);
    field(&mut m, footer);
    m
}

fn record_message(key: &str, json: &[u8]) -> Vec<u8> {
    let mut m = Vec::new();
    m.extend_from_slice(RECORD_CONTEXT);
    field(&mut m, signed_name(key).as_bytes());
    field(&mut m, json);
    m
}

/// A JSON object without the whitespace after its closing `}`: the form that is signed, and
/// that `split` gives back.
fn trimmed(mut json: Vec<u8>) -> Vec<u8> {
    while json.last().is_some_and(u8::is_ascii_whitespace) {
        json.pop();
    }
    json
}

/// `json` (an object, `trimmed`) with `,"signature":"…"}` as its last member.
fn append(mut json: Vec<u8>, k: &Ed25519KeyPair, msg: &[u8]) -> Vec<u8> {
    let sig = k.sign(msg);
    debug_assert_eq!(json.last(), Some(&b'}'));
    json.pop();
    json.extend_from_slice(SUFFIX_START);
    json.extend_from_slice(
        format!(
            "ed25519:{}:{}",
            key_id(k.public_key().as_ref()),
            hex::encode(sig.as_ref())
        )
        .as_bytes(),
    );
    json.extend_from_slice(b"\"}");
    json
}

/// Splits a stored JSON object into what was signed and the signature: `None` when it carries no
/// signature. The signature must be the last member, as `append` wrote it.
fn split(json: &[u8]) -> Result<Option<(Vec<u8>, &str)>, String> {
    let Some(at) = json.windows(SUFFIX_START.len()).rposition(|w| w == SUFFIX_START) else {
        return Ok(None);
    };
    let rest = &json[at + SUFFIX_START.len()..];
    let Some(sig) = rest.strip_suffix(b"\"}") else {
        return Err("its signature is not the last member of its JSON".into());
    };
    let sig = std::str::from_utf8(sig).map_err(|_| "its signature is not text".to_owned())?;
    if sig.contains('"') {
        return Err("its signature is not the last member of its JSON".into());
    }
    let mut signed = json[..at].to_vec();
    signed.push(b'}');
    Ok(Some((signed, sig)))
}

/// The DER inside a PEM file's `-----BEGIN <label>-----` block.
fn pem(path: &Path, label: &str) -> Result<Vec<u8>, String> {
    use base64::Engine;
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let body = text
        .split_once(&begin)
        .and_then(|(_, rest)| rest.split_once(&end))
        .map(|(b, _)| b)
        .ok_or_else(|| format!("{}: holds no {begin} block", path.display()))?;
    let b64: String = body.split_whitespace().collect();
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|e| format!("{}: the {label} block is not base64 ({e})", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> Signing {
        let rng = ring::rand::SystemRandom::new();
        let doc = Ed25519KeyPair::generate_pkcs8(&rng).unwrap();
        let k = Ed25519KeyPair::from_pkcs8(doc.as_ref()).unwrap();
        let public: [u8; 32] = k.public_key().as_ref().try_into().unwrap();
        Signing {
            key: Some(Arc::new(k)),
            trusted: Arc::new(vec![public]),
            allow_unsigned: Arc::default(),
        }
    }

    #[test]
    fn an_object_verifies_only_as_it_was_signed() {
        let s = pair();
        let key = "prefix/v1/full/full-1.ews";
        let d = [7u8; 32];
        let footer = s.seal_object(key, b"{\"h\":1}", 10, &d, b"{\"raw_bytes\":5}".to_vec());
        assert!(serde_json::from_slice::<serde_json::Value>(&footer).is_ok());
        s.open_object(key, b"{\"h\":1}", 10, &d, &footer).unwrap();
        // The same object under another prefix: still the same name from v1/ on.
        s.open_object("other/v1/full/full-1.ews", b"{\"h\":1}", 10, &d, &footer)
            .unwrap();
        assert!(
            s.open_object("prefix/v1/full/full-2.ews", b"{\"h\":1}", 10, &d, &footer)
                .is_err()
        );
        assert!(s.open_object(key, b"{\"h\":2}", 10, &d, &footer).is_err());
        assert!(s.open_object(key, b"{\"h\":1}", 11, &d, &footer).is_err());
        assert!(s.open_object(key, b"{\"h\":1}", 10, &[8; 32], &footer).is_err());
        let altered = String::from_utf8(footer.clone())
            .unwrap()
            .replace("\"raw_bytes\":5", "\"raw_bytes\":6");
        assert!(
            s.open_object(key, b"{\"h\":1}", 10, &d, altered.as_bytes())
                .is_err()
        );
        // Unsigned: refused unless allowed by name.
        assert!(
            s.open_object(key, b"{\"h\":1}", 10, &d, b"{\"raw_bytes\":5}")
                .is_err()
        );
        let other = pair();
        assert!(
            other
                .open_object(key, b"{\"h\":1}", 10, &d, &footer)
                .unwrap_err()
                .contains("not trusted")
        );
    }

    #[test]
    fn records_and_hostile_suffixes() {
        let s = pair();
        let rec = s.seal_record("v1/head.json", b"{\n  \"a\": 1\n}\n".to_vec());
        assert!(serde_json::from_slice::<serde_json::Value>(&rec).is_ok());
        s.open_record("v1/head.json", &rec).unwrap();
        assert!(s.open_record("v1/cluster.json", &rec).is_err());
        for bad in [
            &b",\"signature\":\"x"[..],
            b"{,\"signature\":\"\"}",
            b"{,\"signature\":\"ed25519:zz:zz\"}",
            b",\"signature\":\"a\"b\"}",
        ] {
            assert!(
                s.open_record("v1/head.json", bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let plain = Signing::default();
        assert_eq!(plain.seal_record("k", b"{}".to_vec()), b"{}");
        plain.open_record("k", b"{}").unwrap();
    }
}
