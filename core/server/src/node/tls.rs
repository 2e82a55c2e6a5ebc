//! TLS for the client listener: the server's certificate chain, its key
//! and the optional client CA, read once at start into a rustls
//! [`ServerConfig`] behind a compio [`TlsAcceptor`].
//!
//! The listener ([`super::listener`]) runs each accepted connection's
//! handshake under the login timeout, then the same session loop as over
//! plain TCP. Everything here happens before a shard starts: a missing or
//! wrong file stops the start with a sentence naming the file and what is
//! wrong with it, never a connection-time surprise.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use compio_tls::TlsAcceptor;
use rustls::RootCertStore;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;

use crate::config::ClientTlsConfig;

/// The client listener's TLS, ready to accept.
#[derive(Clone)]
pub struct ClientTls {
    acceptor: TlsAcceptor,
    client_certificates: ClientCertificates,
}

/// Whether clients must present a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientCertificates {
    /// None is asked for; clients authenticate with their password only.
    NotAsked,
    /// Every client presents one signed by the configured CA before its
    /// first frame is read.
    Required,
}

impl fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTls")
            .field("client_certificates", &self.client_certificates)
            .finish_non_exhaustive()
    }
}

/// Why the client listener's TLS could not be set up. Each names the file
/// (and the configuration field that names it).
#[derive(Debug)]
pub enum TlsSetupError {
    /// The field is not set though TLS is enabled.
    Unset {
        /// The configuration field.
        field: &'static str,
    },
    /// The file does not exist.
    Missing {
        /// The configuration field.
        field: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// The file exists but cannot be read.
    Unreadable {
        /// The configuration field.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        error: std::io::Error,
    },
    /// The file holds no PEM certificate, or a malformed one.
    NoCertificate {
        /// The configuration field.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// What the PEM reader said, if it failed.
        detail: Option<String>,
    },
    /// The file holds no PEM private key, or a malformed one.
    NoKey {
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        detail: String,
    },
    /// A certificate of the client CA file is not a usable trust anchor.
    BadCa {
        /// The file.
        path: PathBuf,
        /// What rustls said.
        detail: String,
    },
    /// The key does not belong to the chain's first certificate, or
    /// rustls refused the pair.
    KeyRefused {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        detail: String,
    },
}

impl fmt::Display for TlsSetupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unset { field } => write!(f, "`{field}` is not set but client TLS is enabled"),
            Self::Missing { field, path } => {
                write!(f, "`{field}`: {} does not exist", path.display())
            }
            Self::Unreadable { field, path, error } => {
                write!(f, "`{field}`: cannot read {}: {error}", path.display())
            }
            Self::NoCertificate {
                field,
                path,
                detail,
            } => match detail {
                Some(detail) => write!(
                    f,
                    "`{field}`: {} holds no valid PEM certificate ({detail})",
                    path.display()
                ),
                None => write!(
                    f,
                    "`{field}`: {} holds no PEM certificate (no `BEGIN CERTIFICATE` block)",
                    path.display()
                ),
            },
            Self::NoKey { path, detail } => write!(
                f,
                "`client.tls.key_file`: {} holds no usable PEM private key ({detail})",
                path.display()
            ),
            Self::BadCa { path, detail } => write!(
                f,
                "`client.tls.client_ca_file`: {} is not a usable CA ({detail})",
                path.display()
            ),
            Self::KeyRefused { cert, key, detail } => write!(
                f,
                "`client.tls.key_file`: {} does not fit the first certificate of {} ({detail})",
                key.display(),
                cert.display()
            ),
        }
    }
}

impl std::error::Error for TlsSetupError {}

impl ClientTls {
    /// Reads the configured files; `None` when TLS is off.
    ///
    /// # Errors
    /// A [`TlsSetupError`] naming the file that is missing, unreadable,
    /// holds no certificate or key, or whose key does not fit.
    pub fn load(config: &ClientTlsConfig) -> Result<Option<Self>, TlsSetupError> {
        if !config.enabled {
            return Ok(None);
        }
        let cert_path = required("client.tls.cert_file", config.cert_file.as_deref())?;
        let key_path = required("client.tls.key_file", config.key_file.as_deref())?;
        let chain = certificates("client.tls.cert_file", cert_path)?;
        let key = private_key(key_path)?;
        // Named explicitly: the SDK compiles aws-lc-rs into the same
        // graph, and with two providers rustls picks neither by itself.
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsSetupError::KeyRefused {
                cert: cert_path.to_owned(),
                key: key_path.to_owned(),
                detail: e.to_string(),
            })?;
        let (builder, client_certificates) = match &config.client_ca_file {
            Some(ca_path) => {
                let verifier = client_verifier(ca_path, provider)?;
                (
                    builder.with_client_cert_verifier(verifier),
                    ClientCertificates::Required,
                )
            }
            None => (builder.with_no_client_auth(), ClientCertificates::NotAsked),
        };
        // `with_single_cert` checks that the key's public half is the
        // first certificate's.
        let server =
            builder
                .with_single_cert(chain, key)
                .map_err(|e| TlsSetupError::KeyRefused {
                    cert: cert_path.to_owned(),
                    key: key_path.to_owned(),
                    detail: e.to_string(),
                })?;
        Ok(Some(Self {
            acceptor: TlsAcceptor::from(Arc::new(server)),
            client_certificates,
        }))
    }

    /// The acceptor each connection's handshake runs on.
    pub fn acceptor(&self) -> &TlsAcceptor {
        &self.acceptor
    }

    /// Whether clients must present a certificate.
    pub fn client_certificates(&self) -> ClientCertificates {
        self.client_certificates
    }
}

fn required<'a>(field: &'static str, path: Option<&'a Path>) -> Result<&'a Path, TlsSetupError> {
    path.ok_or(TlsSetupError::Unset { field })
}

/// The whole file: its absence and an unreadable file are told apart.
fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsSetupError> {
    std::fs::read(path).map_err(|error| {
        if error.kind() == std::io::ErrorKind::NotFound {
            TlsSetupError::Missing {
                field,
                path: path.to_owned(),
            }
        } else {
            TlsSetupError::Unreadable {
                field,
                path: path.to_owned(),
                error,
            }
        }
    })
}

/// Every PEM certificate of the file, in order; at least one.
fn certificates(
    field: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let bytes = read(field, path)?;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| TlsSetupError::NoCertificate {
            field,
            path: path.to_owned(),
            detail: Some(e.to_string()),
        })?;
    if chain.is_empty() {
        return Err(TlsSetupError::NoCertificate {
            field,
            path: path.to_owned(),
            detail: None,
        });
    }
    Ok(chain)
}

/// The file's first PEM private key.
fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    let bytes = read("client.tls.key_file", path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsSetupError::NoKey {
        path: path.to_owned(),
        detail: match e {
            rustls::pki_types::pem::Error::NoItemsFound => {
                "no `BEGIN PRIVATE KEY`, `BEGIN RSA PRIVATE KEY` or `BEGIN EC PRIVATE KEY` block"
                    .to_owned()
            }
            other => other.to_string(),
        },
    })
}

/// A verifier that requires a client certificate signed by a CA of
/// `path`.
fn client_verifier(
    path: &Path,
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsSetupError> {
    let field = "client.tls.client_ca_file";
    let mut roots = RootCertStore::empty();
    for certificate in certificates(field, path)? {
        roots.add(certificate).map_err(|e| TlsSetupError::BadCa {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsSetupError::BadCa {
            path: path.to_owned(),
            detail: e.to_string(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(name: &str) -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/tls")
            .join(name)
    }

    fn enabled(cert: &str, key: &str, ca: Option<&str>) -> ClientTlsConfig {
        ClientTlsConfig {
            enabled: true,
            cert_file: Some(data(cert)),
            key_file: Some(data(key)),
            client_ca_file: ca.map(data),
        }
    }

    fn refused(config: &ClientTlsConfig) -> String {
        match ClientTls::load(config) {
            Ok(_) => panic!("{config:?} was accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn given_tls_off_when_loaded_should_read_nothing() {
        let config = ClientTlsConfig {
            enabled: false,
            cert_file: Some(data("no-such.pem")),
            ..ClientTlsConfig::default()
        };
        assert!(matches!(ClientTls::load(&config), Ok(None)));
    }

    #[test]
    fn given_a_chain_and_its_key_when_loaded_should_accept_with_or_without_client_certificates() {
        let tls = ClientTls::load(&enabled("server-chain.pem", "server.key", None));
        assert_eq!(
            tls.ok().flatten().map(|t| t.client_certificates()),
            Some(ClientCertificates::NotAsked)
        );
        let mtls = ClientTls::load(&enabled("server.pem", "server.key", Some("ca.pem")));
        assert_eq!(
            mtls.ok().flatten().map(|t| t.client_certificates()),
            Some(ClientCertificates::Required)
        );
    }

    #[test]
    fn given_a_missing_file_when_loaded_should_name_it_and_its_field() {
        let e = refused(&enabled("no-such.pem", "server.key", None));
        assert!(
            e.contains("client.tls.cert_file")
                && e.contains("no-such.pem")
                && e.contains("does not exist"),
            "{e}"
        );
        let e = refused(&enabled("server.pem", "no-such.key", None));
        assert!(
            e.contains("client.tls.key_file") && e.contains("no-such.key"),
            "{e}"
        );
        let e = refused(&enabled("server.pem", "server.key", Some("no-such-ca.pem")));
        assert!(
            e.contains("client.tls.client_ca_file") && e.contains("no-such-ca.pem"),
            "{e}"
        );
    }

    #[test]
    fn given_a_file_without_the_expected_pem_block_when_loaded_should_say_so() {
        // A key where the certificate belongs, a certificate where the key
        // belongs, a README where the CA belongs.
        let e = refused(&enabled("server.key", "server.key", None));
        assert!(
            e.contains("client.tls.cert_file") && e.contains("no PEM certificate"),
            "{e}"
        );
        let e = refused(&enabled("server.pem", "server.pem", None));
        assert!(
            e.contains("client.tls.key_file") && e.contains("no usable PEM private key"),
            "{e}"
        );
        let e = refused(&enabled("server.pem", "server.key", Some("README.md")));
        assert!(
            e.contains("client.tls.client_ca_file") && e.contains("no PEM certificate"),
            "{e}"
        );
    }

    #[test]
    fn given_a_key_of_another_certificate_when_loaded_should_refuse_the_pair() {
        let e = refused(&enabled("server.pem", "client.key", None));
        assert!(
            e.contains("client.key") && e.contains("does not fit") && e.contains("server.pem"),
            "{e}"
        );
    }

    #[test]
    fn given_a_directory_when_loaded_should_call_it_unreadable() {
        let e = refused(&enabled(".", "server.key", None));
        assert!(
            e.contains("client.tls.cert_file") && e.contains("cannot read"),
            "{e}"
        );
    }
}
