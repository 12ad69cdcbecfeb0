//! TLS for both ends (rustls with the ring provider): the server's certificate and key from PEM
//! files, and the agent's trust in the collector's certificate from a CA file.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

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

/// The notAfter (Unix seconds) of each server configuration [`server_config`] made and that
/// is still in use.
static MADE: Mutex<Vec<(Weak<rustls::ServerConfig>, i64)>> = Mutex::new(Vec::new());

/// Certificates expiring within this many days are warned about.
const WARN_DAYS: i64 = 14;

/// When the certificate `cfg` serves stops being valid (notAfter, Unix seconds), if `cfg` was
/// made by [`server_config`]: for the services' `/metrics` (`…_tls_cert_expiry_seconds`).
pub fn cert_expiry(cfg: &Arc<rustls::ServerConfig>) -> Option<i64> {
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    made.retain(|(w, _)| w.strong_count() > 0);
    made.iter().find(|(w, _)| std::ptr::eq(w.as_ptr(), Arc::as_ptr(cfg))).map(|m| m.1)
}

/// The validity of certificate `der`: (notBefore, notAfter), in Unix seconds (RFC 5280,
/// 4.1.2.5).
pub fn validity(der: &[u8]) -> Result<(i64, i64), String> {
    let (_, c) = x509_parser::parse_x509_certificate(der).map_err(|e| e.to_string())?;
    let v = c.validity();
    Ok((v.not_before.timestamp(), v.not_after.timestamp()))
}

/// What is wrong with validity `(from, until)` at `now` (Unix seconds), if anything: expired,
/// not yet valid, or expiring within [`WARN_DAYS`] days.
pub fn validity_warning(from: i64, until: i64, now: i64) -> Option<String> {
    if now >= until {
        Some(format!("expired {} day(s) ago: clients will refuse it", (now - until) / 86_400))
    } else if now < from {
        Some(format!("not valid for another {} s: clients will refuse it", from - now))
    } else if until - now < WARN_DAYS * 86_400 {
        Some(format!("expires in {} day(s)", (until - now) / 86_400))
    } else {
        None
    }
}

/// The server side: `cert` holds the certificate chain (leaf first), `key` its private key.
/// A leaf certificate that has expired, is not yet valid or expires within 14 days is logged
/// (it is still served: the operator may be about to replace it), and its expiry kept for
/// `/metrics`.
pub fn server_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let chain = certificates(cert)?;
    let (from, until) = validity(&chain[0])
        .map_err(|why| TlsError::File { path: cert.to_path_buf(), why: format!("leaf: {why}") })?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if let Some(w) = validity_warning(from, until, now) {
        tracing::warn!("TLS certificate {}: {w}", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| TlsError::File { path: key.to_path_buf(), why: e.to_string() })?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let cfg = Arc::new(cfg);
    let mut made = MADE.lock().unwrap_or_else(|p| p.into_inner());
    made.retain(|(w, _)| w.strong_count() > 0);
    made.push((Arc::downgrade(&cfg), until));
    Ok(cfg)
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
