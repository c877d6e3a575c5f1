//! The hub's certificate authority as operators rotate it: which CA issues, and files replaced
//! with the old ones kept aside.
//!
//! `ca.crt` holds every CA the hub trusts (one, or during a rotation the new and the old);
//! `ca.key` is the key of the one that issues, whose certificate is found in `ca.crt` by its
//! public key (`pki::issuing_cert`), so the two files are all the state a rotation has.

use super::args::Confirm;
use super::confirm::{self, Decision};
use super::files::{self, aside_stamp};
use super::views::IssuedBy;
use super::{CliError, CliResult, Context, output};
use crate::datadir::DataDir;
use baton_shared::{exit, pki};
use std::path::Path;

/// The certificate blocks of a PEM file, as text (each `-----BEGIN CERTIFICATE-----` through
/// its `-----END CERTIFICATE-----`, with a final newline).
fn pem_blocks(pem: &str) -> Vec<String> {
    const END: &str = "-----END CERTIFICATE-----";
    let mut blocks = Vec::new();
    let mut rest = pem;
    while let (Some(b), Some(e)) = (rest.find("-----BEGIN CERTIFICATE-----"), rest.find(END)) {
        if e < b {
            rest = &rest[e + END.len()..];
            continue;
        }
        blocks.push(format!("{}\n", &rest[b..e + END.len()]));
        rest = &rest[e + END.len()..];
    }
    blocks
}

/// The issuing CA's block of `ca.crt` (the one whose key is `ca.key`) and the other blocks.
fn split_cas(dir: &DataDir) -> Result<(String, Vec<String>), CliError> {
    let (bundle, key) = issuing_ca(dir)?;
    let failed = |e: pki::PkiError| CliError::failure(format!("{}: {e}", dir.ca_cert().display()));
    let issuing = pki::issuing_cert(&bundle, &key).map_err(failed)?;
    let (mut mine, mut others) = (None, Vec::new());
    for block in pem_blocks(&bundle) {
        let der = pki::pem_certs(&block).map_err(failed)?;
        if der.first() == Some(&issuing) && mine.is_none() {
            mine = Some(block);
        } else {
            others.push(block);
        }
    }
    let mine = mine.ok_or_else(|| failed(pki::PkiError::NoIssuingCa))?;
    Ok((mine, others))
}

/// Where `enroll` and `renew` keep a copy of every certificate they issue (`SERIAL.crt`), so
/// that `certs list` can tell which CA issued it.
pub(super) fn issued_dir(dir: &DataDir) -> std::path::PathBuf {
    dir.root().join("issued")
}

/// Keeps a copy of an issued certificate (see `issued_dir`).
pub(super) fn keep_issued(dir: &DataDir, serial: &str, cert_pem: &str) -> CliResult {
    let issued = issued_dir(dir);
    std::fs::create_dir_all(&issued).map_err(|e| CliError::failure(format!("{}: {e}", issued.display())))?;
    files::write_new(&issued.join(format!("{serial}.crt")), cert_pem, false)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Which CA issued each of `serials`, from the kept copies and `ca.crt`.
pub(super) fn issuers(dir: &DataDir, serials: &[&str]) -> Result<Vec<IssuedBy>, CliError> {
    let failed = |e: pki::PkiError| CliError::failure(format!("{}: {e}", dir.ca_cert().display()));
    let trusted: Vec<Vec<u8>> = pki::pem_certs(&read(&dir.ca_cert())?)
        .map_err(failed)?
        .iter()
        .map(|c| pki::subject_key_id(c))
        .collect::<Result<_, _>>()
        .map_err(failed)?;
    let mut out = Vec::with_capacity(serials.len());
    for serial in serials {
        let copy = issued_dir(dir).join(format!("{serial}.crt"));
        let Ok(pem) = super::read_pem(&copy) else {
            out.push(IssuedBy { key_id: None, trusted: false });
            continue;
        };
        let bad = |e: pki::PkiError| CliError::failure(format!("{}: {e}", copy.display()));
        let der = pki::pem_certs(&pem).map_err(bad)?.into_iter().next().ok_or_else(|| bad(pki::PkiError::Parse))?;
        let key_id = pki::authority_key_id(&der).map_err(bad)?;
        let trusted = key_id.as_ref().is_some_and(|k| trusted.contains(k));
        out.push(IssuedBy { key_id: key_id.map(|k| hex(&k)), trusted });
    }
    Ok(out)
}

/// Records a CA change in the audit log.
fn record(ctx: &Context, action: &str, note: &str) -> CliResult {
    let record = ctx.open_write()?;
    record.run(record.record_operator_event(action.into(), "ca".into(), ctx.operator.clone(), Some(note.into())))?;
    Ok(())
}

/// `ca rotate`: a new issuing CA, trusted beside the old one (see `args::CaCmd`).
pub(super) fn rotate(ctx: &Context) -> CliResult {
    let dir = &ctx.dir;
    let (current, others) = split_cas(dir)?;
    if !others.is_empty() {
        return Err(CliError::usage(format!(
            "{} holds {} CAs: a rotation is under way; end it with `baton-hub ca retire-old` first",
            dir.ca_cert().display(),
            others.len() + 1
        )));
    }
    let stamp = aside_stamp(ctx.now_ms());
    let new = pki::create_ca(&format!("Baton hub CA {stamp}")).map_err(|e| CliError::failure(e.to_string()))?;
    let bundle = format!("{}{current}", new.cert_pem);
    let kept = files::replace_files(
        &[(dir.ca_key(), new.key_pem.as_str(), true), (dir.ca_cert(), bundle.as_str(), false)],
        &stamp,
    )?;
    let note = format!("new CA serial {}; the old CA stays trusted until `ca retire-old`", new.serial);
    record(ctx, "ca_rotate", &note)?;
    ctx.wake_hub();
    output::line(format!(
        "new CA {} issues from now on; {} trusts the new and the old CA",
        new.serial,
        dir.ca_cert().display()
    ))?;
    output::line(format!(
        "replaced files kept as {}",
        kept.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    ))?;
    output::line(
        "next: give every node and producer the new ca.crt (nodes: SIGHUP), then `baton-hub renew --server`, \
         renew every node and producer certificate, and end with `baton-hub ca retire-old`",
    )
}

/// `ca retire-old [--force] --reason R [--dry-run | --yes]`: `ca.crt` keeps only the issuing CA (see
/// `args::CaCmd`). Refused while the server certificate is the old CA's, and (unless `force`)
/// while a node or producer would be cut off (`cut_off`); otherwise it says what it retires and
/// who is cut off, and asks (`confirm`).
pub(super) fn retire_old(ctx: &Context, force: bool, reason: &str, confirm: &Confirm) -> CliResult {
    let dir = &ctx.dir;
    let (current, others) = split_cas(dir)?;
    if others.is_empty() {
        return Err(CliError::new(
            exit::NOTHING,
            format!("{} holds one CA: nothing to retire", dir.ca_cert().display()),
        ));
    }
    let issuing = pki::pem_certs(&current).map_err(|e| CliError::failure(e.to_string()))?;
    let issuing_id = match issuing.first() {
        Some(ca) => Some(pki::subject_key_id(ca).map_err(|e| CliError::failure(e.to_string()))?),
        None => None,
    };
    let server = pki::pem_certs(&read(&dir.server_cert())?).map_err(|e| CliError::failure(e.to_string()))?;
    let issued_by_current = match (&issuing_id, server.first()) {
        (Some(ca_id), Some(leaf)) => {
            pki::authority_key_id(leaf).map_err(|e| CliError::failure(e.to_string()))?.as_ref() == Some(ca_id)
        }
        _ => false,
    };
    if !issued_by_current {
        return Err(CliError::new(
            exit::REFUSED,
            "the hub's server certificate is still the old CA's: nodes would refuse the hub once they trust only \
             the new CA; run `baton-hub renew --server` first",
        ));
    }
    let stranded = cut_off(ctx, issuing_id.as_deref().map(hex).as_deref())?;
    if !stranded.is_empty() && !force {
        return Err(CliError::usage(format!(
            "refusing to retire the old CA: {} name(s) hold an unexpired, unrevoked certificate of it and none of \
             the issuing CA, and the hub would refuse them from then on:\n{}\nrenew each (`baton-hub renew NAME \
             --out DIR`) and install the new certificate first, revoke what is no longer used, or retire anyway \
             with --force",
            stranded.len(),
            stranded.iter().map(|s| format!("  {s}")).collect::<Vec<_>>().join("\n")
        )));
    }
    let mut plan = format!(
        "would retire {} old CA(s) (reason: {}): {} would trust only the issuing CA, and certificates of the old \
         CA would be refused from then on",
        others.len(),
        output::esc(reason),
        dir.ca_cert().display()
    );
    for s in &stranded {
        plan.push_str(&format!("\nwould be cut off: {s}"));
    }
    if confirm::decide(confirm, &plan, None)? == Decision::DryRun {
        return Ok(());
    }
    let stamp = aside_stamp(ctx.now_ms());
    let kept = files::replace_files(&[(dir.ca_cert(), current.as_str(), false)], &stamp)?;
    let mut note = format!("{reason}; {} old CA(s) no longer trusted", others.len());
    if !stranded.is_empty() {
        let names: Vec<String> = stranded.iter().map(|s| format!("{} {}", s.role, s.name)).collect();
        note.push_str(&format!("; forced, cutting off {}", names.join(", ")));
    }
    record(ctx, "ca_retire_old", &note)?;
    ctx.wake_hub();
    output::line(format!(
        "retired {} old CA(s): {} trusts only the issuing CA; certificates of the old CA are refused from now on",
        others.len(),
        dir.ca_cert().display()
    ))?;
    for s in &stranded {
        output::line(format!("cut off: {s}"))?;
    }
    output::line(format!(
        "replaced file kept as {}",
        kept.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    ))
}

/// A node or producer that retiring the old CA would cut off: it holds an unexpired,
/// unrevoked certificate not issued by the issuing CA, and none that is.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stranded {
    role: baton_shared::ids::Role,
    name: String,
    /// Its live certificates of another CA: serial and not-after (unix seconds); whether the
    /// CA is known (false: no copy was kept, so it is taken as the old CA's).
    certs: Vec<(String, i64, bool)>,
}

impl std::fmt::Display for Stranded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let certs: Vec<String> = self
            .certs
            .iter()
            .map(|(serial, not_after, known)| {
                let unknown = if *known { "" } else { ", no copy kept: its CA is not known" };
                format!("{serial} (not after {}{unknown})", output::fmt_ms(not_after.saturating_mul(1000)))
            })
            .collect();
        write!(f, "{} {}: certificate {}", self.role, output::esc(&self.name), certs.join(", "))
    }
}

/// Who `ca retire-old` would cut off (`Stranded`), by the kept copies of the certificates
/// (`issuers`); `issuing` is the issuing CA's key identifier (hex).
fn cut_off(ctx: &Context, issuing: Option<&str>) -> Result<Vec<Stranded>, CliError> {
    let record = ctx.open_read()?;
    let rows = record.run(record.certificates())?;
    drop(record);
    let now_s = ctx.now_ms() / 1000;
    let live: Vec<_> = rows.into_iter().filter(|c| c.revoked.is_none() && c.not_after_unix > now_s).collect();
    let serials: Vec<&str> = live.iter().map(|c| c.serial.as_str()).collect();
    let by = issuers(&ctx.dir, &serials)?;
    let mut out: Vec<Stranded> = Vec::new();
    let mut covered: Vec<(baton_shared::ids::Role, String)> = Vec::new();
    for (c, by) in live.iter().zip(&by) {
        if by.key_id.is_some() && by.key_id.as_deref() == issuing {
            covered.push((c.role, c.name.clone()));
            continue;
        }
        let cert = (c.serial.clone(), c.not_after_unix, by.key_id.is_some());
        match out.iter_mut().find(|s| s.role == c.role && s.name == c.name) {
            Some(s) => s.certs.push(cert),
            None => out.push(Stranded { role: c.role, name: c.name.clone(), certs: vec![cert] }),
        }
    }
    out.retain(|s| !covered.contains(&(s.role, s.name.clone())));
    Ok(out)
}

fn read(path: &Path) -> Result<String, CliError> {
    super::read_pem(path)
}

/// The CA file (every trusted CA, PEM) and the issuing CA's key (PEM), as `pki::issue` takes
/// them.
pub(super) fn issuing_ca(dir: &DataDir) -> Result<(String, String), CliError> {
    Ok((read(&dir.ca_cert())?, read(&dir.ca_key())?))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each certificate block is cut out whole, whatever surrounds it.
    #[test]
    fn pem_blocks_are_cut_whole() {
        let (a, b) = (pki::create_ca("a").unwrap().cert_pem, pki::create_ca("b").unwrap().cert_pem);
        let file = format!("comment\n{a}\n\n{b}trailing");
        let blocks = pem_blocks(&file);
        assert_eq!(blocks.len(), 2);
        assert_eq!(pki::pem_certs(&blocks[0]).unwrap(), pki::pem_certs(&a).unwrap());
        assert_eq!(pki::pem_certs(&blocks[1]).unwrap(), pki::pem_certs(&b).unwrap());
    }
}
