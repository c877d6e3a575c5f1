//! Property-based fuzzing of certificate identity extraction (`pki::peer_identity`): generated
//! certificates with random subject alternative names, common names, serials and extensions,
//! damaged DER and arbitrary bytes.
//!
//! What must hold: it never panics; it yields an identity only from exactly one
//! `urn:baton:<node|producer>:<name>` SAN URI whose name matches the name grammar and is not
//! reserved (never from the common name or any other field), and that identity carries the
//! certificate's serial; everything else is the typed refusal that says why.
//!
//! Long run: `BATON_FUZZ_CASES=1000000 cargo test --release -p baton-shared --all-features --test suite fuzz_pki`.

use baton_shared::ids::{Role, check_name};
use baton_shared::pki::{IDENTITY_URI_PREFIX, PeerIdentity, PkiError, is_reserved, peer_identity};
use proptest::prelude::*;
use proptest::test_runner::FileFailurePersistence;
use rcgen::{CertificateParams, CustomExtension, DnType, KeyPair, SanType, SerialNumber};
use std::net::IpAddr;
use std::sync::OnceLock;

/// See `fuzz_ids.rs`: `default` cases unless `BATON_FUZZ_CASES` says otherwise.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("BATON_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default);
    ProptestConfig {
        cases,
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct("proptest-regressions/fuzz_pki.txt"))),
        ..ProptestConfig::default()
    }
}

/// One signing key for every generated certificate: identity extraction reads, never verifies,
/// so a fresh key per case would only slow the run.
fn key() -> &'static KeyPair {
    static KEY: OnceLock<KeyPair> = OnceLock::new();
    KEY.get_or_init(|| KeyPair::generate().expect("key pair"))
}

/// A name that is often valid, sometimes reserved, sometimes malformed.
fn name() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z][a-z0-9_-]{0,70}",
        1 => Just("operator".to_string()),
        1 => "[ -~]{0,20}",
        1 => Just(String::new()),
        1 => "[a-z]{1,5}(:[a-z]{1,5}){1,2}",
        1 => "[a-z]{1,8}(%2e%2e%2f|/\\.\\./|\\.\\.)[a-z]{0,4}",
    ]
}

/// A role word that is usually one of the two roles.
fn role() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("node".to_string()),
        3 => Just("producer".to_string()),
        1 => Just("Node".to_string()),
        1 => Just("operator".to_string()),
        1 => Just(String::new()),
        1 => "[a-z]{1,10}",
    ]
}

/// A SAN URI: a Baton identity (well formed or not), a near miss, or any printable text.
fn uri() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => (role(), name()).prop_map(|(r, n)| format!("{IDENTITY_URI_PREFIX}{r}:{n}")),
        1 => (role(), name()).prop_map(|(r, n)| format!("URN:BATON:{r}:{n}")),
        1 => name().prop_map(|n| format!("{IDENTITY_URI_PREFIX}{n}")),
        1 => Just(IDENTITY_URI_PREFIX.to_string()),
        1 => "[ -~]{0,40}",
        1 => "https://[a-z]{1,10}\\.example/[a-z]{0,5}",
    ]
}

/// One subject alternative name of any kind.
#[derive(Debug, Clone)]
enum San {
    Uri(String),
    Dns(String),
    Email(String),
    Ip(IpAddr),
}

fn san() -> impl Strategy<Value = San> {
    prop_oneof![
        6 => uri().prop_map(San::Uri),
        1 => prop_oneof!["[a-z]{1,10}\\.[a-z]{2,3}", uri()].prop_map(San::Dns),
        1 => uri().prop_map(San::Email),
        1 => any::<IpAddr>().prop_map(San::Ip),
    ]
}

/// What a generated certificate is made of.
#[derive(Debug, Clone)]
struct Shape {
    common_name: Option<String>,
    sans: Vec<San>,
    serial: Vec<u8>,
    extensions: Vec<(Vec<u64>, Vec<u8>, bool)>,
}

fn shape() -> impl Strategy<Value = Shape> {
    let extension = (
        prop::collection::vec(1u64..100_000, 2..6).prop_map(|tail| {
            // A private-enterprise OID, so no extension the parser knows is displaced.
            let mut oid = vec![1, 3, 6, 1, 4, 1];
            oid.extend(tail);
            oid
        }),
        prop::collection::vec(any::<u8>(), 0..64),
        any::<bool>(),
    );
    (
        prop::option::of(prop_oneof![uri(), name()]),
        prop::collection::vec(san(), 0..4),
        prop::collection::vec(any::<u8>(), 1..20),
        prop::collection::vec(extension, 0..3),
    )
        .prop_map(|(common_name, sans, serial, extensions)| Shape { common_name, sans, serial, extensions })
}

/// Builds and self-signs the certificate; `None` when rcgen refuses the shape itself (a
/// non-ASCII SAN, for instance), which is not the parser's business.
fn build(shape: &Shape) -> Option<Vec<u8>> {
    let mut params = CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    if let Some(cn) = &shape.common_name {
        params.distinguished_name.push(DnType::CommonName, cn.as_str());
    }
    for san in &shape.sans {
        params.subject_alt_names.push(match san {
            San::Uri(u) => SanType::URI(u.clone().try_into().ok()?),
            San::Dns(d) => SanType::DnsName(d.clone().try_into().ok()?),
            San::Email(e) => SanType::Rfc822Name(e.clone().try_into().ok()?),
            San::Ip(ip) => SanType::IpAddress(*ip),
        });
    }
    params.serial_number = Some(SerialNumber::from_slice(&shape.serial));
    for (oid, content, critical) in &shape.extensions {
        let mut ext = CustomExtension::from_oid_content(oid, content.clone());
        ext.set_criticality(*critical);
        params.custom_extensions.push(ext);
    }
    params.self_signed(key()).ok().map(|c| c.der().to_vec())
}

/// What `peer_identity` must answer for `shape`, worked out from the documented rule alone.
fn expected(shape: &Shape) -> Result<(Role, String), &'static str> {
    let uris: Vec<&str> = shape
        .sans
        .iter()
        .filter_map(|s| match s {
            San::Uri(u) if u.starts_with(IDENTITY_URI_PREFIX) => Some(u.as_str()),
            _ => None,
        })
        .collect();
    let [uri] = uris.as_slice() else { return Err("count") };
    let rest = &uri[IDENTITY_URI_PREFIX.len()..];
    let Some((role, name)) = rest.split_once(':') else { return Err("shape") };
    let Some(role) = Role::parse(role) else { return Err("shape") };
    if check_name("name", name).is_err() {
        return Err("shape");
    }
    if is_reserved(name) {
        return Err("reserved");
    }
    Ok((role, name.to_string()))
}

/// Whatever `peer_identity` yields, the name in it is well formed and not reserved.
fn sound(id: &PeerIdentity) -> Result<(), TestCaseError> {
    prop_assert!(check_name("name", &id.name).is_ok(), "an identity with a malformed name: {id:?}");
    prop_assert!(!is_reserved(&id.name), "an identity with a reserved name: {id:?}");
    prop_assert!(id.serial.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()), "{id:?}");
    prop_assert!(!id.serial.starts_with("00"), "{id:?}");
    Ok(())
}

proptest! {
    #![proptest_config(config(256))]

    /// Generated certificates: the identity is exactly the one the rule gives, and a refusal is
    /// the error that says why.
    #[test]
    fn fuzz_identity_comes_only_from_one_well_formed_san_uri(shape in shape()) {
        let Some(der) = build(&shape) else { return Ok(()) };
        let got = peer_identity(&der);
        match (expected(&shape), got) {
            (Ok((role, name)), Ok(id)) => {
                sound(&id)?;
                prop_assert_eq!(id.role, role);
                prop_assert_eq!(&id.name, &name);
                let hex: String = shape.serial.iter().map(|b| format!("{b:02x}")).collect();
                prop_assert_eq!(id.serial.as_str(), hex.trim_start_matches("00"));
            }
            (Err("count"), Err(PkiError::IdentityCount(n))) => prop_assert_ne!(n, 1),
            (Err("shape"), Err(PkiError::IdentityShape(uri))) => prop_assert!(uri.starts_with(IDENTITY_URI_PREFIX)),
            (Err("reserved"), Err(PkiError::Reserved(name))) => prop_assert!(is_reserved(&name)),
            (want, got) => prop_assert!(false, "expected {want:?}, got {got:?} for {shape:?}"),
        }
    }

    /// A generated certificate with some of its bytes changed: no panic, and any identity read
    /// from it is sound.
    #[test]
    fn fuzz_damaged_certificates_never_yield_a_malformed_identity(
        shape in shape(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        cut in any::<prop::sample::Index>(),
        truncate in any::<bool>(),
    ) {
        let Some(mut der) = build(&shape) else { return Ok(()) };
        for (at, byte) in edits {
            let i = at.index(der.len());
            der[i] = byte;
        }
        if truncate {
            der.truncate(cut.index(der.len() + 1));
        }
        if let Ok(id) = peer_identity(&der) {
            sound(&id)?;
        }
    }

    /// Arbitrary bytes are refused as not X.509 (or, by extreme chance, read soundly).
    #[test]
    fn fuzz_arbitrary_bytes_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        match peer_identity(&bytes) {
            Ok(id) => sound(&id)?,
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
