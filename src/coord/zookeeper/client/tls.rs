//! TLS to ZooKeeper's secure client port: the session's options for `zookeeper-client`
//! from the `[zookeeper]` files, and, before the first session, one handshake of leaderq's
//! own with the first server that takes a connection, so that a certificate the ensemble
//! refuses (or a CA that does not sign the server's) stops the start with the setting to
//! look at, instead of sessions that never open.

use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use zookeeper_client as zk;

use crate::coord::CoordError;
use crate::util::tls::{explain, TlsMaterial};

/// How long the check waits for a connection, a handshake or an answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// The session's TLS options: the CA, and the client's certificate if given.
pub(super) fn options(material: &TlsMaterial) -> Result<zk::TlsOptions, CoordError> {
    crate::util::tls::install_provider();
    let refused =
        |setting: &str, err: zk::Error| CoordError::Refused(format!("zookeeper.{setting}: {err}"));
    let mut options = zk::TlsOptions::new();
    if let Some(ca) = &material.ca_pem {
        let ca = String::from_utf8_lossy(ca);
        options = options
            .with_pem_ca(&ca)
            .map_err(|e| refused("ca_file", e))?;
    }
    if let Some(identity) = &material.identity {
        let cert = String::from_utf8_lossy(&identity.cert_pem);
        let key = String::from_utf8_lossy(&identity.key_pem);
        options = options
            .with_pem_identity(&cert, &key)
            .map_err(|e| refused("cert_file", e))?;
    }
    Ok(options)
}

/// One handshake with the first of `servers` that takes a TCP connection, and a
/// four-letter word over it (with TLS 1.3 a refused client certificate shows only at the
/// first read). A refusal is `Refused`, naming the setting; no server reachable is left
/// to the session's own connect to report.
pub(super) async fn check_handshake(
    material: &TlsMaterial,
    servers: &str,
) -> Result<(), CoordError> {
    let config = material
        .client_config("zookeeper")
        .map_err(CoordError::Refused)?;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    for server in servers.split(',') {
        let address = server
            .trim()
            .trim_start_matches("tcp+tls://")
            .trim_start_matches("tcp://");
        let Some((host, _)) = address.rsplit_once(':') else {
            continue;
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let Ok(name) = ServerName::try_from(host.to_string()) else {
            continue;
        };
        let connected =
            tokio::time::timeout(CHECK_TIMEOUT, tokio::net::TcpStream::connect(address));
        let Ok(Ok(tcp)) = connected.await else {
            continue;
        };
        let shaken = tokio::time::timeout(CHECK_TIMEOUT, connector.connect(name, tcp)).await;
        let mut stream = match shaken {
            Ok(Ok(stream)) => stream,
            Ok(Err(err)) => {
                let why = explain("zookeeper", &err).unwrap_or_else(|| {
                    format!("check zookeeper.ca_file, zookeeper.cert_file and zookeeper.key_file: {err}")
                });
                return Err(refused(address, why));
            }
            Err(_) => continue,
        };
        let asked = async {
            stream.write_all(b"srvr").await?;
            let mut answer = [0u8; 64];
            stream.read(&mut answer).await
        };
        // A dropped connection is not a refusal: only the peer's TLS alert is.
        return match tokio::time::timeout(CHECK_TIMEOUT, asked).await {
            Ok(Err(err)) => match explain("zookeeper", &err) {
                Some(why) => Err(refused(address, why)),
                None => Ok(()),
            },
            _ => Ok(()),
        };
    }
    Ok(())
}

fn refused(address: &str, why: String) -> CoordError {
    CoordError::Refused(format!("TLS to ZooKeeper at {address} failed: {why}"))
}
