//! TLS for both ends (rustls with the ring provider): the server's certificate and key from PEM
//! files, and the agent's trust in the collector's certificate from a CA file.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Why TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or held nothing usable.
    #[error("{path}: {why}")]
    File {
        /// The file.
        path: PathBuf,
        /// Why.
        why: String,
    },
    /// rustls refused the configuration (a key that does not match the certificate, …).
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file = |why: String| TlsError::File { path: path.to_path_buf(), why };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| file(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file(e.to_string()))?;
    if certs.is_empty() {
        return Err(file("no PEM certificate in it".into()));
    }
    Ok(certs)
}

/// The server side: `cert` holds the certificate chain (leaf first), `key` its private key.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificates(cert)?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError::File { path: key.to_path_buf(), why: e.to_string() })?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// The client side: trusts the certificates in `ca` (and only those), verifying the server's
/// name as usual.
pub fn client_config(ca: &Path) -> Result<Arc<rustls::ClientConfig>, TlsError> {
    let mut roots = rustls::RootCertStore::empty();
    for c in certificates(ca)? {
        roots.add(c)?;
    }
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}
