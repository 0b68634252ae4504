//! TLS files a coordinator's settings section names, shared by every backend: the CA that
//! signs the server's certificate (`ca_file`), the client's own certificate chain and key
//! (`cert_file`, `key_file`) and the name the server's certificate must carry
//! (`server_name`, instead of the address's host).
//!
//! A section keeps the four keys flat (`[consul] cert_file = …`; serde's `flatten` does not
//! mix with `deny_unknown_fields`) and builds a [`TlsFiles`] from them. [`TlsFiles::load`]
//! checks them (a certificate without its key, or a key without its certificate, is
//! refused; each file must exist and hold what its key says, in PEM) with messages that name
//! the setting and the file, and hands back [`TlsMaterial`]: the PEM bytes any client library
//! takes (redis-rs, zookeeper-client) and rustls's types, from which
//! [`TlsMaterial::client_config`] builds the rustls configuration reqwest is given.
//! [`explain`] turns a handshake failure found in an error's chain into a message naming the
//! setting to look at.

use std::error::Error as StdError;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{AlertDescription, CertificateError, DigitallySignedStruct, SignatureScheme};

/// The four TLS settings of one section, as given (an empty string is "not set").
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    pub ca_file: String,
    pub cert_file: String,
    pub key_file: String,
    pub server_name: String,
}

/// What a client needs from [`TlsFiles`], read and checked.
#[derive(Debug)]
pub struct TlsMaterial {
    /// The CA file's bytes (PEM), when one is given.
    pub ca_pem: Option<Vec<u8>>,
    /// The CA file's certificates; empty when none is given (the usual public roots apply).
    pub roots: Vec<CertificateDer<'static>>,
    /// The client's certificate and key, when given.
    pub identity: Option<Identity>,
    /// The name the server's certificate is checked against, when given.
    pub server_name: Option<String>,
}

/// A client certificate chain and its private key.
#[derive(Debug)]
pub struct Identity {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
    pub chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for Identity {
    fn clone(&self) -> Identity {
        Identity {
            cert_pem: self.cert_pem.clone(),
            key_pem: self.key_pem.clone(),
            chain: self.chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl TlsFiles {
    /// The four, from a section's flat keys (`server_name` empty where the backend's client
    /// cannot check another name).
    pub fn new(ca_file: &str, cert_file: &str, key_file: &str, server_name: &str) -> TlsFiles {
        TlsFiles {
            ca_file: ca_file.to_string(),
            cert_file: cert_file.to_string(),
            key_file: key_file.to_string(),
            server_name: server_name.to_string(),
        }
    }

    /// Whether any of the four is set (a client with none keeps its library's defaults).
    pub fn is_set(&self) -> bool {
        !(self.ca_file.is_empty()
            && self.cert_file.is_empty()
            && self.key_file.is_empty()
            && self.server_name.is_empty())
    }

    /// The section's check with the other settings, reading no file (a section may name
    /// files of a machine it does not run on): a certificate without its key or a key
    /// without its certificate, a server name that is no name. [`TlsFiles::load`] checks
    /// the files when the client is set up.
    pub fn check(&self, section: &str) -> Result<(), String> {
        let name = |key: &str| format!("{section}.{key}");
        pairing(&name, self)?;
        check_server_name(&name, &self.server_name)
    }

    /// Reads and checks the files; `section` (`consul`, `etcd`) prefixes the settings named
    /// in a refusal.
    pub fn load(&self, section: &str) -> Result<TlsMaterial, String> {
        self.load_as(&|key| format!("{section}.{key}"))
    }

    /// The same, with `name` telling how each of the four keys is called where the user set
    /// it (a section's `consul.ca_file`, a flag's `--ca-file`).
    pub fn load_as(&self, name: &dyn Fn(&str) -> String) -> Result<TlsMaterial, String> {
        pairing(name, self)?;
        let (cert_name, key_name) = (name("cert_file"), name("key_file"));
        let mut material = TlsMaterial {
            ca_pem: None,
            roots: Vec::new(),
            identity: None,
            server_name: None,
        };
        if !self.ca_file.is_empty() {
            let setting = name("ca_file");
            let pem = read(&setting, &self.ca_file)?;
            material.roots = certificates(&setting, &self.ca_file, &pem, "CA certificate")?;
            material.ca_pem = Some(pem);
        }
        if !self.cert_file.is_empty() {
            let cert_pem = read(&cert_name, &self.cert_file)?;
            let chain = certificates(&cert_name, &self.cert_file, &cert_pem, "certificate")?;
            let key_pem = read(&key_name, &self.key_file)?;
            let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| {
                format!(
                    "{key_name}: {} holds no PEM private key ({e}): give the certificate's \
                     key (BEGIN PRIVATE KEY, RSA or EC PRIVATE KEY)",
                    self.key_file
                )
            })?;
            material.identity = Some(Identity {
                cert_pem,
                key_pem,
                chain,
                key,
            });
        }
        check_server_name(name, &self.server_name)?;
        if !self.server_name.is_empty() {
            material.server_name = Some(self.server_name.clone());
        }
        Ok(material)
    }

    /// The files given, of the three.
    pub fn paths(&self) -> Vec<String> {
        [&self.ca_file, &self.cert_file, &self.key_file]
            .into_iter()
            .filter(|path| !path.is_empty())
            .cloned()
            .collect()
    }

    /// The files' modification times and lengths, to tell a rotation (a rewritten file)
    /// from no change; a file that cannot be read counts as `None`.
    pub fn stamp(&self) -> Vec<Option<(SystemTime, u64)>> {
        self.paths().iter().map(|path| file_stamp(path)).collect()
    }
}

/// A certificate without its key, or a key without its certificate, is refused naming both.
fn pairing(name: &dyn Fn(&str) -> String, files: &TlsFiles) -> Result<(), String> {
    let (cert_name, key_name) = (name("cert_file"), name("key_file"));
    match (files.cert_file.is_empty(), files.key_file.is_empty()) {
        (false, true) => Err(format!(
            "{cert_name} is set but {key_name} is not: give both (the certificate and its \
             private key) or neither"
        )),
        (true, false) => Err(format!(
            "{key_name} is set but {cert_name} is not: give both (the certificate and its \
             private key) or neither"
        )),
        _ => Ok(()),
    }
}

/// A server name that is set must be a DNS name or an IP address.
fn check_server_name(name: &dyn Fn(&str) -> String, server_name: &str) -> Result<(), String> {
    if server_name.is_empty() {
        return Ok(());
    }
    ServerName::try_from(server_name).map(drop).map_err(|e| {
        format!(
            "{} {server_name:?} is not a DNS name or an IP address: {e}",
            name("server_name")
        )
    })
}

/// A file's modification time and length, or `None` if it cannot be read.
pub fn file_stamp(path: &str) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn read(setting: &str, path: &str) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("{setting}: cannot read {path}: {e}"))
}

fn certificates(
    setting: &str,
    path: &str,
    pem: &[u8],
    what: &str,
) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{setting}: {path} is not PEM: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "{setting}: {path} holds no {what} (a PEM block BEGIN CERTIFICATE)"
        ));
    }
    Ok(certs)
}

/// The crypto rustls uses here: ring, which reqwest and redis-rs already build.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Makes ring the process's rustls provider, for the libraries that build their TLS
/// configuration from the process's default (redis-rs, zookeeper-client): with a second
/// provider built in (aws-lc-rs, through zookeeper-client's rustls), rustls would not pick
/// one and those calls would panic. Called before any client is made; once is enough,
/// again is harmless.
pub fn install_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

impl TlsMaterial {
    /// A rustls client configuration: the CA file's roots (else the usual public roots),
    /// the client identity if given, and the server's certificate checked against
    /// `server_name` if given, instead of the host the client dialled.
    pub fn client_config(&self, section: &str) -> Result<rustls::ClientConfig, String> {
        let provider = provider();
        let mut roots = rustls::RootCertStore::empty();
        if self.roots.is_empty() {
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        } else {
            for cert in &self.roots {
                roots.add(cert.clone()).map_err(|e| {
                    format!("{section}.ca_file: a certificate cannot be used as a CA: {e}")
                })?;
            }
        }
        let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| format!("{section}.ca_file: {e}"))?;
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS: {e}"))?;
        let builder = match &self.server_name {
            Some(name) => {
                let name = ServerName::try_from(name.clone())
                    .map_err(|e| format!("{section}.server_name {name:?}: {e}"))?;
                builder
                    .dangerous()
                    .with_custom_certificate_verifier(Arc::new(NamedServer {
                        name,
                        inner: webpki,
                    }))
            }
            None => builder.with_webpki_verifier(webpki),
        };
        match &self.identity {
            Some(identity) => builder
                .with_client_auth_cert(identity.chain.clone(), identity.key.clone_key())
                .map_err(|e| {
                    format!(
                        "{section}.cert_file and {section}.key_file do not make a client \
                         identity: {e}"
                    )
                }),
            None => Ok(builder.with_no_client_auth()),
        }
    }
}

/// A rustls server configuration from `material`: its identity is the server's certificate
/// and key (required), and with `verify_incoming` every client must present a certificate
/// signed by a CA in `material.roots` (required then), or the handshake fails.
/// `name` tells how each key is called where the user set it.
pub fn server_config(
    material: &TlsMaterial,
    verify_incoming: bool,
    name: &dyn Fn(&str) -> String,
) -> Result<rustls::ServerConfig, String> {
    let provider = provider();
    let identity = material.identity.as_ref().ok_or_else(|| {
        format!(
            "serving TLS needs {} and {}",
            name("cert_file"),
            name("key_file")
        )
    })?;
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = if verify_incoming {
        if material.roots.is_empty() {
            return Err(format!(
                "verify_incoming needs {}: the CA that signs the clients' certificates",
                name("ca_file")
            ));
        }
        let mut roots = rustls::RootCertStore::empty();
        for cert in &material.roots {
            roots.add(cert.clone()).map_err(|e| {
                format!(
                    "{}: a certificate cannot be used as a CA: {e}",
                    name("ca_file")
                )
            })?;
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| format!("{}: {e}", name("ca_file")))?;
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    builder
        .with_single_cert(identity.chain.clone(), identity.key.clone_key())
        .map_err(|e| {
            format!(
                "{} and {} do not make a server identity: {e}",
                name("cert_file"),
                name("key_file")
            )
        })
}

/// Checks the server's certificate, as rustls's own verifier does, against a fixed name
/// (the `server_name` setting) rather than the host in the URL.
#[derive(Debug)]
struct NamedServer {
    name: ServerName<'static>,
    inner: Arc<WebPkiServerVerifier>,
}

impl ServerCertVerifier for NamedServer {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _dialled: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.inner
            .verify_server_cert(end_entity, intermediates, &self.name, ocsp_response, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A TLS handshake failure found anywhere in `error`'s chain, told as which of `section`'s
/// settings to look at and rustls's own words; `None` if the chain holds no TLS failure.
pub fn explain(section: &str, error: &(dyn StdError + 'static)) -> Option<String> {
    let mut next = Some(error);
    while let Some(error) = next {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(explain_rustls(section, tls));
        }
        // An I/O error's `source` skips the error it wraps (hyper-rustls wraps rustls's
        // error in two), and so does an `Arc`'s (redis-rs shares its I/O errors in one):
        // look inside them instead.
        let io = error.downcast_ref::<std::io::Error>();
        let wrapped = io.and_then(|io| io.get_ref()).or_else(|| {
            let shared = error.downcast_ref::<Arc<dyn StdError + Send + Sync>>();
            shared.map(|arc| arc.as_ref())
        });
        next = match wrapped {
            Some(inner) => Some(inner as &(dyn StdError + 'static)),
            None => error.source(),
        };
    }
    None
}

fn explain_rustls(section: &str, error: &rustls::Error) -> String {
    use rustls::Error as E;
    let setting = match error {
        E::InvalidCertificate(CertificateError::NotValidForName)
        | E::InvalidCertificate(CertificateError::NotValidForNameContext { .. }) => {
            format!(
                "{section}.server_name (the server's certificate does not carry the name \
                 checked: the address's host, or {section}.server_name when set)"
            )
        }
        E::InvalidCertificate(_) => format!(
            "{section}.ca_file (the server's certificate was not accepted: is it signed by \
             the CA in {section}.ca_file?)"
        ),
        E::AlertReceived(
            AlertDescription::CertificateRequired
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::AccessDenied,
        ) => format!(
            "{section}.cert_file and {section}.key_file (the server refused this client's \
             certificate, or its absence: give one signed by a CA the server trusts, not \
             expired)"
        ),
        _ => format!("the TLS settings of [{section}]"),
    };
    format!("TLS handshake failed: check {setting}: {error}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A PEM block with any bytes inside: PEM parsing does not look into the DER.
    fn block(label: &str) -> String {
        format!("-----BEGIN {label}-----\nMIIBAAAA\n-----END {label}-----\n")
    }

    fn file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write a test file");
        path.to_string_lossy().into_owned()
    }

    /// Nothing set is fine, and loads nothing.
    #[test]
    fn nothing_set_loads_nothing() {
        let files = TlsFiles::default();
        assert!(!files.is_set());
        let material = files.load("consul").expect("empty settings are valid");
        assert!(material.identity.is_none() && material.roots.is_empty());
    }

    /// A certificate without its key, or a key without its certificate, names both settings.
    #[test]
    fn half_an_identity_is_refused_naming_both() {
        for files in [
            TlsFiles {
                cert_file: "/c.pem".into(),
                ..TlsFiles::default()
            },
            TlsFiles {
                key_file: "/k.pem".into(),
                ..TlsFiles::default()
            },
        ] {
            let error = files.check("etcd").expect_err("half an identity");
            assert!(
                error.contains("etcd.cert_file") && error.contains("etcd.key_file"),
                "{error}"
            );
        }
    }

    /// A missing file is refused naming the setting and the path.
    #[test]
    fn missing_file_names_setting_and_path() {
        let files = TlsFiles {
            ca_file: "/nonexistent/ca.pem".into(),
            ..TlsFiles::default()
        };
        assert!(
            files.check("consul").is_ok(),
            "the settings' check reads no file"
        );
        let error = files.load("consul").expect_err("missing CA file");
        assert!(error.starts_with("consul.ca_file: "), "{error}");
        assert!(error.contains("/nonexistent/ca.pem"), "{error}");
    }

    /// A file that holds no PEM of the expected kind is refused naming the setting.
    #[test]
    fn wrong_contents_are_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let text = file(&dir, "text.pem", "not pem at all\n");
        let cert = file(&dir, "cert.pem", &block("CERTIFICATE"));
        let key = file(&dir, "key.pem", &block("PRIVATE KEY"));
        let cases = [
            (
                TlsFiles {
                    ca_file: text.clone(),
                    ..TlsFiles::default()
                },
                "consul.ca_file",
            ),
            (
                TlsFiles {
                    ca_file: key.clone(),
                    ..TlsFiles::default()
                },
                "consul.ca_file",
            ),
            (
                TlsFiles {
                    cert_file: key.clone(),
                    key_file: key.clone(),
                    ..TlsFiles::default()
                },
                "consul.cert_file",
            ),
            (
                TlsFiles {
                    cert_file: cert.clone(),
                    key_file: cert.clone(),
                    ..TlsFiles::default()
                },
                "consul.key_file",
            ),
        ];
        for (files, setting) in cases {
            let error = files.load("consul").expect_err("wrong contents");
            assert!(error.starts_with(&format!("{setting}: ")), "{error}");
        }
        let good = TlsFiles {
            ca_file: cert.clone(),
            cert_file: cert,
            key_file: key,
            server_name: "consul.internal".into(),
        };
        let material = good.load("consul").expect("well-formed PEM");
        assert_eq!(material.roots.len(), 1);
        assert!(material.identity.is_some());
        assert_eq!(material.server_name.as_deref(), Some("consul.internal"));
        assert_eq!(good.stamp().iter().flatten().count(), 3);
    }

    /// A server name that is no DNS name is refused naming the setting.
    #[test]
    fn bad_server_name_is_refused() {
        let files = TlsFiles {
            server_name: "not a name!".into(),
            ..TlsFiles::default()
        };
        let error = files.check("etcd").expect_err("bad name");
        assert!(error.starts_with("etcd.server_name"), "{error}");
    }

    /// A handshake failure in an error's chain is told as the setting to look at.
    #[test]
    fn handshake_failures_name_the_setting() {
        let cases = [
            (
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer),
                "consul.ca_file",
            ),
            (
                rustls::Error::InvalidCertificate(CertificateError::NotValidForName),
                "consul.server_name",
            ),
            (
                rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
                "consul.cert_file",
            ),
        ];
        for (tls, setting) in cases {
            // As hyper-rustls hands it over: rustls's error in two I/O errors.
            let io =
                std::io::Error::other(std::io::Error::new(std::io::ErrorKind::InvalidData, tls));
            let message = explain("consul", &io).expect("a TLS failure");
            assert!(message.contains(setting), "{message}");
        }
        assert!(explain("consul", &std::io::Error::other("refused")).is_none());
    }
}
