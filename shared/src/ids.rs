//! Identifier grammar for hosts, conversations, producers, idempotency keys and instances.
//!
//! Every identifier that crosses the wire is checked here, once, so that a bad one is refused
//! with an error that names the field before it reaches storage or a file path.

use std::fmt;

/// The longest host, conversation or producer name accepted.
pub const NAME_CHARS_MAX: usize = 64;
/// The longest idempotency key (producer) or report id (node) accepted.
pub const KEY_CHARS_MAX: usize = 128;
/// The longest node instance id accepted.
pub const INSTANCE_ID_CHARS_MAX: usize = 64;

/// Why an identifier was refused; the field it came from is named by the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdError {
    /// The value was empty.
    #[error("{field} must not be empty")]
    Empty {
        /// The field that was checked.
        field: &'static str,
    },
    /// The value was longer than its bound.
    #[error("{field} is {len} characters long; at most {max} are allowed")]
    TooLong {
        /// The field that was checked.
        field: &'static str,
        /// The length that was seen.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// The value does not match its grammar.
    #[error("{field} {value:?} does not match {grammar}")]
    Grammar {
        /// The field that was checked.
        field: &'static str,
        /// A printable prefix of the refused value.
        value: String,
        /// The grammar, as shown to users.
        grammar: &'static str,
    },
}

impl IdError {
    /// The field the refused value came from.
    pub fn field(&self) -> &'static str {
        match self {
            IdError::Empty { field } | IdError::TooLong { field, .. } | IdError::Grammar { field, .. } => field,
        }
    }
}

fn shown(value: &str) -> String {
    value.chars().take(80).collect()
}

/// Checks a host, conversation or producer name: `^[a-z][a-z0-9_-]*$`, at most 64 characters.
pub fn check_name(field: &'static str, value: &str) -> Result<(), IdError> {
    let len = value.chars().count();
    if len == 0 {
        return Err(IdError::Empty { field });
    }
    if len > NAME_CHARS_MAX {
        return Err(IdError::TooLong { field, len, max: NAME_CHARS_MAX });
    }
    let mut chars = value.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_lowercase());
    let rest_ok = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
    if first_ok && rest_ok {
        Ok(())
    } else {
        Err(IdError::Grammar { field, value: shown(value), grammar: "^[a-z][a-z0-9_-]*$" })
    }
}

/// Checks an idempotency key or report id: 1–128 characters of `[A-Za-z0-9._:-]`.
pub fn check_key(field: &'static str, value: &str) -> Result<(), IdError> {
    let len = value.chars().count();
    if len == 0 {
        return Err(IdError::Empty { field });
    }
    if len > KEY_CHARS_MAX {
        return Err(IdError::TooLong { field, len, max: KEY_CHARS_MAX });
    }
    if value.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-')) {
        Ok(())
    } else {
        Err(IdError::Grammar { field, value: shown(value), grammar: "[A-Za-z0-9._:-]{1,128}" })
    }
}

/// Checks a node instance id or claim token: 1–64 characters of `[A-Za-z0-9-]`.
pub fn check_token(field: &'static str, value: &str) -> Result<(), IdError> {
    let len = value.chars().count();
    if len == 0 {
        return Err(IdError::Empty { field });
    }
    if len > INSTANCE_ID_CHARS_MAX {
        return Err(IdError::TooLong { field, len, max: INSTANCE_ID_CHARS_MAX });
    }
    if value.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        Ok(())
    } else {
        Err(IdError::Grammar { field, value: shown(value), grammar: "[A-Za-z0-9-]{1,64}" })
    }
}

/// The two kinds of certificate holder that talk to the hub over HTTP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// A worker host running `baton-node`.
    Node,
    /// A program that submits messages and reads their outcomes.
    Producer,
}

impl Role {
    /// The role's name as it appears in certificates and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Node => "node",
            Role::Producer => "producer",
        }
    }

    /// Parses a role name.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "node" => Some(Role::Node),
            "producer" => Some(Role::Producer),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(f: fn(&'static str, &str) -> Result<(), IdError>, input: &str, ok: bool) {
        assert_eq!(f("field", input).is_ok(), ok, "{input:?}");
    }

    #[test]
    fn names() {
        check(check_name, "a", true);
        check(check_name, "host-1_b", true);
        check(check_name, &"a".repeat(64), true);
        check(check_name, &"a".repeat(65), false);
        check(check_name, "", false);
        check(check_name, "1abc", false);
        check(check_name, "Abc", false);
        check(check_name, "a/../b", false);
        check(check_name, "a b", false);
        check(check_name, "é", false);
    }

    #[test]
    fn keys() {
        check(check_key, "k", true);
        check(check_key, "Order:42.v1-x_y", true);
        check(check_key, &"k".repeat(128), true);
        check(check_key, &"k".repeat(129), false);
        check(check_key, "", false);
        check(check_key, "a b", false);
        check(check_key, "a\0b", false);
    }

    #[test]
    fn error_names_the_field() {
        let e = check_name("conversation", "Bad").unwrap_err();
        assert_eq!(e.field(), "conversation");
        assert!(e.to_string().contains("conversation"));
    }
}
