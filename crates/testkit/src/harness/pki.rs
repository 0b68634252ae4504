//! Certificates for TLS tests, generated with rcgen into a directory: a CA, a server
//! certificate for `localhost`, `127.0.0.1` and [`SERVER_NAME`], a client certificate (CN
//! `root`, etcd's user for certificate auth), an expired client certificate, and a second CA
//! that signed none of them (the wrong CA). Every file is PEM, keys in PKCS#8.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// A DNS name the server's certificate carries besides `localhost` and `127.0.0.1`.
pub const SERVER_NAME: &str = "coord.leaderq.test";

/// The files of one test's certificates.
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    pub expired_cert: PathBuf,
    pub expired_key: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
}

impl Pki {
    /// Generates every certificate into `dir` (created if missing).
    pub fn generate(dir: &Path) -> Result<Pki, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let write = |name: &str, text: String| -> Result<PathBuf, String> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path)
        };
        let fail = |e: rcgen::Error| e.to_string();
        let (ca_key, ca) = ca_params("leaderq test CA")?;
        let ca_cert = ca.self_signed(&ca_key).map_err(fail)?;
        let (other_key, other) = ca_params("another CA")?;
        let other_cert = other.self_signed(&other_key).map_err(fail)?;
        let leaf =
            |names: Vec<String>, cn: &str, expired: bool| -> Result<(String, String), String> {
                let key = KeyPair::generate().map_err(fail)?;
                let mut params = CertificateParams::new(names).map_err(fail)?;
                params.distinguished_name.push(DnType::CommonName, cn);
                params.extended_key_usages = vec![
                    ExtendedKeyUsagePurpose::ServerAuth,
                    ExtendedKeyUsagePurpose::ClientAuth,
                ];
                params.key_usages = vec![
                    KeyUsagePurpose::DigitalSignature,
                    KeyUsagePurpose::KeyEncipherment,
                ];
                if expired {
                    params.not_before = rcgen::date_time_ymd(2001, 1, 1);
                    params.not_after = rcgen::date_time_ymd(2002, 1, 1);
                }
                let cert = params.signed_by(&key, &ca_cert, &ca_key).map_err(fail)?;
                Ok((cert.pem(), key.serialize_pem()))
            };
        let (server_cert, server_key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into(), SERVER_NAME.into()],
            "localhost",
            false,
        )?;
        let (client_cert, client_key) = leaf(Vec::new(), "root", false)?;
        let (expired_cert, expired_key) = leaf(Vec::new(), "root", true)?;
        Ok(Pki {
            ca: write("ca.pem", ca_cert.pem())?,
            server_cert: write("server.pem", server_cert)?,
            server_key: write("server-key.pem", server_key)?,
            client_cert: write("client.pem", client_cert)?,
            client_key: write("client-key.pem", client_key)?,
            expired_cert: write("expired.pem", expired_cert)?,
            expired_key: write("expired-key.pem", expired_key)?,
            other_ca: write("other-ca.pem", other_cert.pem())?,
        })
    }
}

fn ca_params(name: &str) -> Result<(KeyPair, CertificateParams), String> {
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    Ok((key, params))
}
