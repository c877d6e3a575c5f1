//! How a command fails: the message printed once on stderr and the exit status
//! (`baton_shared::exit`), with the mapping of a hub's refusal to its status. Below every
//! command module, so each of them can fail the same way.

use baton_client::ClientError;
use baton_shared::error::ErrorCode;
use baton_shared::exit;

/// A command that failed: what to print on stderr and the exit status.
#[derive(Debug)]
pub(crate) struct CliError {
    /// The exit status (`baton_shared::exit`).
    pub(crate) status: u8,
    /// The message, one line.
    pub(crate) message: String,
}

pub(crate) fn usage(message: impl Into<String>) -> CliError {
    CliError { status: exit::USAGE, message: message.into() }
}

pub(crate) fn failure(message: impl std::fmt::Display) -> CliError {
    CliError { status: exit::FAILURE, message: message.to_string() }
}

/// A call that failed: not found is 1, input the hub refused (or that forms no request) is 2,
/// the caller refused (401, 403) is 9, anything else 4.
pub(crate) fn call_failed(e: ClientError) -> CliError {
    let status = match e.code() {
        Some(ErrorCode::NotFound) => exit::NOTHING,
        Some(
            ErrorCode::UnknownCertificate
            | ErrorCode::CertificateRevoked
            | ErrorCode::WrongRole
            | ErrorCode::NotYours
            | ErrorCode::Forbidden
            | ErrorCode::ApprovalForbidden
            | ErrorCode::HostRetired,
        ) => exit::DENIED,
        _ if matches!(e, ClientError::CertificateRevoked(_)) => exit::DENIED,
        Some(
            ErrorCode::InvalidJson
            | ErrorCode::InvalidField
            | ErrorCode::NoRecipients
            | ErrorCode::IdempotencyConflict
            | ErrorCode::TooLarge
            | ErrorCode::InvalidCursor
            | ErrorCode::CursorExpired,
        ) => exit::USAGE,
        _ if matches!(e, ClientError::Invalid(_)) => exit::USAGE,
        _ => exit::FAILURE,
    };
    CliError { status, message: e.to_string() }
}

pub(crate) fn printed(r: std::io::Result<()>) -> Result<(), CliError> {
    r.map_err(|e| failure(format!("writing to stdout: {e}")))
}
