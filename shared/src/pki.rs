//! The hub's own certificate authority: creating it, issuing node, producer and server
//! certificates, and reading a peer's identity back from a verified certificate.
//!
//! Identity lives in exactly one SAN URI of the form `urn:baton:<role>:<name>`. Nothing else
//! in a request (body, header, URL) is ever trusted for who the caller is.

use crate::ids::{Role, check_name};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    SanType, SerialNumber,
};
use std::time::Duration;
use time::OffsetDateTime;

/// The URI prefix that carries a Baton identity.
pub const IDENTITY_URI_PREFIX: &str = "urn:baton:";
/// How long the CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long a node or producer certificate is valid unless the operator says otherwise.
pub const LEAF_VALIDITY_DEFAULT: Duration = Duration::from_secs(365 * 24 * 3600);
/// How long the hub's server certificate is valid.
pub const SERVER_VALIDITY: Duration = Duration::from_secs(2 * 365 * 24 * 3600);
/// The producer name `baton-hub send` records its messages under. Reserved: no certificate is
/// issued for it in any role, and a certificate naming it carries no identity, so no enrolled
/// producer can read or pre-empt (by idempotency key) what an operator sent by hand.
pub const CLI_SENDER: &str = "operator";
/// Names no certificate may hold.
pub const RESERVED_NAMES: &[&str] = &[CLI_SENDER];

/// Whether `name` is reserved (see `RESERVED_NAMES`).
pub fn is_reserved(name: &str) -> bool {
    RESERVED_NAMES.contains(&name)
}

/// Certificates are back-dated by this much to tolerate small clock differences.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(300);

/// What went wrong making or reading a certificate.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    /// rcgen refused to build or sign a certificate.
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
    /// The certificate could not be parsed as X.509.
    #[error("the certificate is not valid X.509 DER")]
    Parse,
    /// The certificate carries no Baton identity URI, or more than one.
    #[error("the certificate carries {0} Baton identity URIs; exactly one is required")]
    IdentityCount(usize),
    /// The identity URI is not `urn:baton:<role>:<name>` with a known role and a valid name.
    #[error("the certificate's identity URI {0:?} is not urn:baton:<node|producer>:<name>")]
    IdentityShape(String),
    /// No certificate in the CA file belongs to the CA key (the key signs with a CA that the
    /// file does not hold).
    #[error("no certificate in the CA file matches the CA key")]
    NoIssuingCa,
    /// The name is reserved (`RESERVED_NAMES`) and no certificate may hold it.
    #[error("the name {0:?} is reserved for messages sent with `baton-hub send`; no certificate may hold it")]
    Reserved(String),
}

/// A freshly issued certificate with its private key.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate, PEM.
    pub cert_pem: String,
    /// The private key, PEM (PKCS#8).
    pub key_pem: String,
    /// The serial number as lowercase hex.
    pub serial: String,
    /// Expiry as unix seconds.
    pub not_after_unix: i64,
}

/// The identity a verified client certificate carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerIdentity {
    /// The role, from the identity URI.
    pub role: Role,
    /// The host or producer name, from the identity URI.
    pub name: String,
    /// The certificate's serial as lowercase hex.
    pub serial: String,
}

/// The SAN URI naming `role` and `name`.
pub fn identity_uri(role: Role, name: &str) -> String {
    format!("{IDENTITY_URI_PREFIX}{role}:{name}")
}

fn random_serial() -> (SerialNumber, String) {
    let mut bytes: [u8; 16] = rand_bytes();
    bytes[0] &= 0x7f; // keep the serial positive
    bytes[0] |= 0x01; // and free of a leading zero byte, so its hex form is stable
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    (SerialNumber::from_slice(&bytes), hex)
}

fn rand_bytes() -> [u8; 16] {
    rand::random()
}

fn validity(params: &mut CertificateParams, lifetime: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - CLOCK_SKEW_ALLOWANCE;
    params.not_after = now + lifetime;
}

/// Creates a new CA: a self-signed certificate that may sign leaves and CRLs, not sub-CAs.
pub fn create_ca(common_name: &str) -> Result<Issued, PkiError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let (serial, serial_hex) = random_serial();
    params.serial_number = Some(serial);
    validity(&mut params, CA_VALIDITY);
    let not_after_unix = params.not_after.unix_timestamp();
    let cert = params.self_signed(&key)?;
    Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem(), serial: serial_hex, not_after_unix })
}

/// What kind of leaf to issue.
#[derive(Debug, Clone)]
pub enum LeafKind {
    /// A client certificate for a node or a producer.
    Client {
        /// The holder's role.
        role: Role,
        /// The host or producer name.
        name: String,
        /// How long it is valid.
        lifetime: Duration,
    },
    /// The hub's server certificate for the given DNS names and IP addresses.
    Server {
        /// Names and addresses nodes dial.
        hostnames: Vec<String>,
        /// How long it is valid (`SERVER_VALIDITY` unless the operator says otherwise).
        lifetime: Duration,
    },
}

/// Of the CA certificates in `bundle_pem` (one or more PEM certificates, as `ca.crt` holds
/// during a CA rotation), the one (DER) whose public key is `ca_key_pem`'s: the one that issues.
pub fn issuing_cert(bundle_pem: &str, ca_key_pem: &str) -> Result<Vec<u8>, PkiError> {
    use rcgen::PublicKeyData;
    let spki = KeyPair::from_pem(ca_key_pem)?.subject_public_key_info();
    for der in pem_certs(bundle_pem)? {
        let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|_| PkiError::Parse)?;
        if cert.tbs_certificate.subject_pki.raw == spki.as_slice() {
            return Ok(der);
        }
    }
    Err(PkiError::NoIssuingCa)
}

/// The DER certificates of a PEM file (one or more certificates).
pub fn pem_certs(pem: &str) -> Result<Vec<Vec<u8>>, PkiError> {
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .map(|c| c.map(|c| c.as_ref().to_vec()).map_err(|_| PkiError::Parse))
        .collect()
}

/// Which of the CAs in `bundle_pem` issued `cert_pem`: its index there, matched by key
/// identifier (the certificate's authority key identifier is the CA's subject key identifier);
/// `None` when none of them did.
pub fn issuer_of(cert_pem: &str, bundle_pem: &str) -> Result<Option<usize>, PkiError> {
    let der = pem_certs(cert_pem)?.into_iter().next().ok_or(PkiError::Parse)?;
    let cas = pem_certs(bundle_pem)?;
    let ca_ids = cas.iter().map(|ca| key_ids(ca).map(|(_, subject)| subject)).collect::<Result<Vec<_>, _>>()?;
    let (authority, _) = key_ids(&der)?;
    Ok(authority.and_then(|a| ca_ids.iter().position(|s| s.as_deref() == Some(a.as_slice()))))
}

/// A key identifier (the bytes of an authority or subject key identifier extension).
pub type KeyId = Vec<u8>;

/// The subject key identifier of a (CA) certificate, DER; empty when it carries none.
pub fn subject_key_id(der: &[u8]) -> Result<KeyId, PkiError> {
    Ok(key_ids(der)?.1.unwrap_or_default())
}

/// The authority key identifier of a certificate, DER: which CA key signed it.
pub fn authority_key_id(der: &[u8]) -> Result<Option<KeyId>, PkiError> {
    Ok(key_ids(der)?.0)
}

/// A certificate's authority and subject key identifiers, when it carries them.
fn key_ids(der: &[u8]) -> Result<(Option<KeyId>, Option<KeyId>), PkiError> {
    use x509_parser::extensions::ParsedExtension;
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|_| PkiError::Parse)?;
    let (mut authority, mut subject) = (None, None);
    for ext in cert.extensions() {
        match ext.parsed_extension() {
            ParsedExtension::AuthorityKeyIdentifier(a) => authority = a.key_identifier.as_ref().map(|k| k.0.to_vec()),
            ParsedExtension::SubjectKeyIdentifier(k) => subject = Some(k.0.to_vec()),
            _ => {}
        }
    }
    Ok((authority, subject))
}

/// The DNS names and IP addresses a (server) certificate is valid for, as `issue` takes them.
pub fn server_names(cert_pem: &str) -> Result<Vec<String>, PkiError> {
    use x509_parser::extensions::GeneralName;
    let der = pem_certs(cert_pem)?.into_iter().next().ok_or(PkiError::Parse)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|_| PkiError::Parse)?;
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(n) => names.push(n.to_string()),
                GeneralName::IPAddress(b) => match b.len() {
                    4 => names.push(
                        std::net::Ipv4Addr::from(<[u8; 4]>::try_from(*b).map_err(|_| PkiError::Parse)?).to_string(),
                    ),
                    16 => names.push(
                        std::net::Ipv6Addr::from(<[u8; 16]>::try_from(*b).map_err(|_| PkiError::Parse)?).to_string(),
                    ),
                    _ => return Err(PkiError::Parse),
                },
                _ => {}
            }
        }
    }
    Ok(names)
}

/// Issues a leaf certificate signed by the CA key `ca_key_pem`, whose certificate is one of
/// those in `ca_cert_pem` (`issuing_cert`).
pub fn issue(ca_cert_pem: &str, ca_key_pem: &str, kind: &LeafKind) -> Result<Issued, PkiError> {
    let ca_der = issuing_cert(ca_cert_pem, ca_key_pem)?;
    let ca_key = KeyPair::from_pem(ca_key_pem)?;
    let issuer = Issuer::from_ca_cert_der(&ca_der.into(), ca_key)?;
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    match kind {
        LeafKind::Client { role, name, lifetime } => {
            if check_name("name", name).is_err() {
                return Err(PkiError::IdentityShape(identity_uri(*role, name)));
            }
            if is_reserved(name) {
                return Err(PkiError::Reserved(name.clone()));
            }
            params.distinguished_name.push(DnType::CommonName, name.as_str());
            params.subject_alt_names = vec![SanType::URI(identity_uri(*role, name).try_into()?)];
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
            validity(&mut params, *lifetime);
        }
        LeafKind::Server { hostnames, lifetime } => {
            let mut p = CertificateParams::new(hostnames.clone())?;
            std::mem::swap(&mut params.subject_alt_names, &mut p.subject_alt_names);
            params.distinguished_name.push(DnType::CommonName, "baton-hub");
            params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
            validity(&mut params, *lifetime);
        }
    }
    let (serial, serial_hex) = random_serial();
    params.serial_number = Some(serial);
    let not_after_unix = params.not_after.unix_timestamp();
    let cert = params.signed_by(&key, &issuer)?;
    Ok(Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem(), serial: serial_hex, not_after_unix })
}

/// Reads the Baton identity and serial from a DER certificate (already verified by TLS).
pub fn peer_identity(der: &[u8]) -> Result<PeerIdentity, PkiError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|_| PkiError::Parse)?;
    let serial = cert.tbs_certificate.raw_serial().iter().map(|b| format!("{b:02x}")).collect::<String>();
    let serial = serial.trim_start_matches("00").to_string();
    let mut uris = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(uri) = name
                && uri.starts_with(IDENTITY_URI_PREFIX)
            {
                uris.push(uri.to_string());
            }
        }
    }
    if uris.len() != 1 {
        return Err(PkiError::IdentityCount(uris.len()));
    }
    let uri = &uris[0];
    let rest = &uri[IDENTITY_URI_PREFIX.len()..];
    let (role, name) = rest.split_once(':').ok_or_else(|| PkiError::IdentityShape(uri.clone()))?;
    let role = Role::parse(role).ok_or_else(|| PkiError::IdentityShape(uri.clone()))?;
    check_name("name", name).map_err(|_| PkiError::IdentityShape(uri.clone()))?;
    if is_reserved(name) {
        return Err(PkiError::Reserved(name.to_string()));
    }
    Ok(PeerIdentity { role, name: name.to_string(), serial })
}

/// Reads the serial (lowercase hex) and expiry (unix seconds) of a PEM certificate.
pub fn cert_facts(cert_pem: &str) -> Result<(String, i64), PkiError> {
    use rustls_pki_types::{CertificateDer, pem::PemObject};
    let der = CertificateDer::from_pem_slice(cert_pem.as_bytes()).map_err(|_| PkiError::Parse)?;
    der_facts(&der)
}

/// Reads the serial (lowercase hex) and expiry (unix seconds) of a DER certificate.
pub fn der_facts(der: &[u8]) -> Result<(String, i64), PkiError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).map_err(|_| PkiError::Parse)?;
    let serial = cert.tbs_certificate.raw_serial().iter().map(|b| format!("{b:02x}")).collect::<String>();
    Ok((serial.trim_start_matches("00").to_string(), cert.validity().not_after.timestamp()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls_pki_types::{CertificateDer, pem::PemObject};

    #[test]
    fn issued_client_cert_reads_back_its_identity() {
        let ca = create_ca("test ca").unwrap();
        let leaf = issue(
            &ca.cert_pem,
            &ca.key_pem,
            &LeafKind::Client { role: Role::Node, name: "host-a".into(), lifetime: LEAF_VALIDITY_DEFAULT },
        )
        .unwrap();
        let der = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap();
        let id = peer_identity(&der).unwrap();
        assert_eq!(id, PeerIdentity { role: Role::Node, name: "host-a".into(), serial: leaf.serial.clone() });
        assert_eq!(cert_facts(&leaf.cert_pem).unwrap().0, leaf.serial);
    }

    #[test]
    fn server_cert_has_no_identity() {
        let ca = create_ca("test ca").unwrap();
        let kind = LeafKind::Server { hostnames: vec!["localhost".into()], lifetime: SERVER_VALIDITY };
        let leaf = issue(&ca.cert_pem, &ca.key_pem, &kind).unwrap();
        let der = CertificateDer::from_pem_slice(leaf.cert_pem.as_bytes()).unwrap();
        assert!(matches!(peer_identity(&der), Err(PkiError::IdentityCount(0))));
    }

    /// A renewal reads the names back as they were given: DNS names and both IP families.
    #[test]
    fn server_names_read_back_as_issued() {
        let ca = create_ca("test ca").unwrap();
        let names: Vec<String> = ["localhost", "127.0.0.1", "::1", "hub.example"].map(String::from).to_vec();
        let kind = LeafKind::Server { hostnames: names.clone(), lifetime: SERVER_VALIDITY };
        let leaf = issue(&ca.cert_pem, &ca.key_pem, &kind).unwrap();
        let mut back = server_names(&leaf.cert_pem).unwrap();
        back.sort();
        let mut want = names;
        want.sort();
        assert_eq!(back, want);
    }

    /// In a bundle of two CAs the key picks its own certificate, in either order; a key of
    /// neither is refused.
    #[test]
    fn the_issuing_ca_is_found_by_its_key() {
        let (old, new) = (create_ca("old").unwrap(), create_ca("new").unwrap());
        for bundle in [format!("{}{}", new.cert_pem, old.cert_pem), format!("{}{}", old.cert_pem, new.cert_pem)] {
            let found = issuing_cert(&bundle, &new.key_pem).unwrap();
            assert_eq!(vec![found], pem_certs(&new.cert_pem).unwrap());
            let kind = LeafKind::Server { hostnames: vec!["h".into()], lifetime: SERVER_VALIDITY };
            let leaf = issue(&bundle, &new.key_pem, &kind).unwrap();
            assert_eq!(
                issuer_of(&leaf.cert_pem, &bundle).unwrap(),
                Some(0).filter(|_| bundle.starts_with(&new.cert_pem)).or(Some(1))
            );
        }
        let other = create_ca("other").unwrap();
        assert!(matches!(issuing_cert(&old.cert_pem, &other.key_pem), Err(PkiError::NoIssuingCa)));
    }

    /// The `send` identity is never issued, and a certificate made for it elsewhere (signed
    /// by the same CA) names no identity.
    #[test]
    fn the_cli_sender_name_is_never_an_identity() {
        let ca = create_ca("test ca").unwrap();
        for role in [Role::Node, Role::Producer] {
            let kind = LeafKind::Client { role, name: CLI_SENDER.into(), lifetime: LEAF_VALIDITY_DEFAULT };
            assert!(matches!(issue(&ca.cert_pem, &ca.key_pem, &kind), Err(PkiError::Reserved(_))));
        }
        let issuer = Issuer::from_ca_cert_pem(&ca.cert_pem, KeyPair::from_pem(&ca.key_pem).unwrap()).unwrap();
        let mut params = CertificateParams::default();
        let uri = identity_uri(Role::Producer, CLI_SENDER);
        params.subject_alt_names = vec![SanType::URI(uri.try_into().unwrap())];
        let forged = params.signed_by(&KeyPair::generate().unwrap(), &issuer).unwrap();
        assert!(matches!(peer_identity(forged.der()), Err(PkiError::Reserved(_))));
    }

    #[test]
    fn bad_names_are_refused() {
        let ca = create_ca("test ca").unwrap();
        let r = issue(
            &ca.cert_pem,
            &ca.key_pem,
            &LeafKind::Client { role: Role::Producer, name: "Bad Name".into(), lifetime: LEAF_VALIDITY_DEFAULT },
        );
        assert!(r.is_err());
    }
}
