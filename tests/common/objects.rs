//! Objects as anyone who can write to the bucket can make them (docs/FORMAT.md's framing, with a
//! digest over what they wrote), and the keys an operator makes with openssl.

use std::process::Command;

/// An object framed as docs/FORMAT.md describes, around `header`, `payload` and `footer`: what
/// anyone who can write to the bucket can make (the digest is over what they wrote).
pub fn framed(header: &serde_json::Value, payload: &[u8], footer: &serde_json::Value) -> Vec<u8> {
    use sha2::Digest;
    let header = serde_json::to_vec(header).unwrap();
    let footer = serde_json::to_vec(footer).unwrap();
    let mut out = b"EWARDEN1".to_vec();
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(payload);
    out.extend_from_slice(&footer);
    out.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(&sha2::Sha256::digest(payload));
    out.extend_from_slice(b"EWEND001");
    out
}

/// The header of the object at `path`, as JSON.
pub fn header_of(path: &std::path::Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap();
    let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    serde_json::from_slice(&bytes[12..12 + len]).unwrap()
}

/// The object at `path` with its header replaced by `header`, the rest as it was.
pub fn reframed(path: &std::path::Path, header: &serde_json::Value) -> Vec<u8> {
    let bytes = std::fs::read(path).unwrap();
    let len = u32::from_le_bytes(bytes[8..12].try_into().unwrap()) as usize;
    let header = serde_json::to_vec(header).unwrap();
    let mut out = b"EWARDEN1".to_vec();
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    out.extend_from_slice(&bytes[12 + len..]);
    out
}

/// An Ed25519 key pair made by openssl, as docs/security.md tells operators to make it: the
/// private key's file and the public key's.
pub fn ed25519(dir: &std::path::Path, name: &str) -> (String, String) {
    let private = dir.join(format!("{name}.pem"));
    let public = dir.join(format!("{name}.pub.pem"));
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let (private, public) = (private.display().to_string(), public.display().to_string());
    run(&["genpkey", "-algorithm", "ed25519", "-out", &private]);
    run(&["pkey", "-in", &private, "-pubout", "-out", &public]);
    (private, public)
}
