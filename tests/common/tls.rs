//! A private certificate authority and a TLS listener for mock backends:
//! the https:// side of the transport tests. The CA's certificate is
//! written to a PEM file, which a test gives the gateway as a backend's
//! `ca_file`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use axum::serve::Listener;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// A CA and one server certificate it signed, for `127.0.0.1` and
/// `localhost`.
pub struct TestCa {
    /// The CA's certificate as a PEM file (kept while this lives).
    pub ca_file: PathBuf,
    _dir: tempfile::TempDir,
    server: Arc<rustls::ServerConfig>,
}

impl TestCa {
    pub fn new() -> TestCa {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "tito test CA");
        let ca_cert = ca.self_signed(&ca_key).expect("CA certificate");
        let issuer = Issuer::new(ca, ca_key);

        let key = KeyPair::generate().expect("server key");
        let mut leaf = CertificateParams::new(vec!["localhost".to_string()]).expect("params");
        leaf.subject_alt_names
            .push(SanType::IpAddress([127, 0, 0, 1].into()));
        let cert = leaf.signed_by(&key, &issuer).expect("server certificate");

        let dir = tempfile::tempdir().expect("tempdir");
        let ca_file = dir.path().join("ca.pem");
        std::fs::write(&ca_file, ca_cert.pem()).expect("write the CA");

        let chain = vec![CertificateDer::from(cert.der().to_vec())];
        let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let server = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(chain, der)
            .expect("server config");
        TestCa {
            ca_file,
            _dir: dir,
            server: Arc::new(server),
        }
    }

    /// A listener serving TLS with the CA's server certificate.
    pub fn listener(&self, tcp: TcpListener) -> TlsListener {
        TlsListener {
            tcp,
            acceptor: TlsAcceptor::from(self.server.clone()),
        }
    }
}

/// Accepts TCP connections and completes each one's TLS handshake; a
/// handshake that fails drops that connection and accepting goes on.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
}

impl Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (tcp, addr) = Listener::accept(&mut self.tcp).await;
            let _ = tcp.set_nodelay(true);
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}
