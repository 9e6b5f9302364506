//! Certificates for the fake API server, made per test with `rcgen`: a CA
//! and server certificates it signs, naming the server's IP address.

use std::{net::IpAddr, sync::Arc};

use anyhow::{Context as _, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// A test certificate authority.
pub struct TestCa {
    issuer: Issuer<'static, KeyPair>,
    /// Its certificate, as a `ca.crt` holds it.
    pub pem: String,
}

impl TestCa {
    pub fn new(name: &str) -> Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().context("CA key")?;
        let cert = params.self_signed(&key).context("CA certificate")?;
        Ok(TestCa {
            issuer: Issuer::new(params, key),
            pem: cert.pem(),
        })
    }

    /// A server certificate for `ip` (its only subject alternative name).
    pub fn server(&self, ip: IpAddr) -> Result<ServerIdentity> {
        let mut params = CertificateParams::new(vec![ip.to_string()])?;
        params
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().context("server key")?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .context("server certificate")?;
        Ok(ServerIdentity {
            cert: cert.der().clone(),
            key: PrivatePkcs8KeyDer::from(key.serialize_der()),
        })
    }
}

/// A server's certificate and key.
pub struct ServerIdentity {
    cert: CertificateDer<'static>,
    key: PrivatePkcs8KeyDer<'static>,
}

impl ServerIdentity {
    /// A rustls server configuration presenting this identity.
    pub fn config(&self) -> Result<Arc<rustls::ServerConfig>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(
                vec![self.cert.clone()],
                PrivateKeyDer::Pkcs8(self.key.clone_key()),
            )?;
        Ok(Arc::new(cfg))
    }

    /// The certificate and its key as PEM files hold them (`tls.crt`,
    /// `tls.key`), for a server of another language (the Go peer).
    pub fn pem(&self) -> (String, String) {
        (
            pem("CERTIFICATE", self.cert.as_ref()),
            pem("PRIVATE KEY", self.key.secret_pkcs8_der()),
        )
    }
}

/// `der` as a PEM block labelled `label`.
fn pem(label: &str, der: &[u8]) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
        out.push('\n');
    }
    out + &format!("-----END {label}-----\n")
}
