//! The keys of one private etcd (`super::private`): a certificate authority made for it alone, a
//! server certificate for its loopback listeners (client and peer) and a client certificate whose
//! common name is `root`.
//!
//! Why: the data a private etcd serves may have etcd auth on, with users and passwords the warden
//! does not know (a restore of another day's data, a drill, a password changed since). etcd takes a
//! verified client certificate's common name as the user, without a password, and `root` exists
//! with the root role whenever auth is on (etcd refuses `auth enable` otherwise). So the warden
//! reads every private etcd whatever its auth, and nobody else can: both listeners demand a
//! certificate signed by a key that lives only in this process and, for etcd, in a 0700 directory
//! beside the data, removed when the private etcd is done.

use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The files etcd reads, and the client's identity (kept in memory).
pub struct PrivateTls {
    pub dir: PathBuf,
    pub ca_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

impl Drop for PrivateTls {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl PrivateTls {
    /// Makes the keys and writes etcd's files into a new 0700 directory `dir` (it must not exist).
    pub fn create(dir: &Path) -> Result<Self, String> {
        let tls = |e: rcgen::Error| format!("make the private etcd's certificates: {e}");
        let ca_key = KeyPair::generate().map_err(tls)?;
        let mut ca = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "etcd-warden private etcd CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca_cert = ca.self_signed(&ca_key).map_err(tls)?;
        let issuer = Issuer::new(ca, ca_key);

        let server_key = KeyPair::generate().map_err(tls)?;
        let mut server =
            CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).map_err(tls)?;
        server
            .distinguished_name
            .push(DnType::CommonName, "etcd-warden private etcd");
        // The peer certificate is also the one a member presents when it dials a peer.
        server.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let server_cert = server.signed_by(&server_key, &issuer).map_err(tls)?;

        let client_key = KeyPair::generate().map_err(tls)?;
        let mut client = CertificateParams::new(Vec::<String>::new()).map_err(tls)?;
        client.distinguished_name.push(DnType::CommonName, "root");
        client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let client_cert = client.signed_by(&client_key, &issuer).map_err(tls)?;

        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        let me = Self {
            dir: dir.to_owned(),
            ca_pem: ca_cert.pem(),
            client_cert_pem: client_cert.pem(),
            client_key_pem: client_key.serialize_pem(),
        };
        me.write("ca.crt", &me.ca_pem)?;
        me.write("server.crt", &server_cert.pem())?;
        me.write("server.key", &server_key.serialize_pem())?;
        Ok(me)
    }

    fn write(&self, name: &str, pem: &str) -> Result<(), String> {
        use std::io::Write;
        let path = self.dir.join(name);
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .and_then(|mut f| f.write_all(pem.as_bytes()))
            .map_err(|e| format!("write {}: {e}", path.display()))
    }

    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.join("server.key")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_private_and_removed_when_done() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("tls");
        let tls = PrivateTls::create(&dir).unwrap();
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        for f in [tls.ca(), tls.cert(), tls.key()] {
            assert_eq!(mode(&f), 0o600, "{}", f.display());
        }
        assert!(tls.client_cert_pem.contains("BEGIN CERTIFICATE"));
        assert!(PrivateTls::create(&dir).is_err(), "an existing dir is not reused");
        drop(tls);
        assert!(!dir.exists());
    }
}
