//! Values crossing to and from PostgreSQL as SQLite's five storage classes, so each column's
//! `FromSql` is the same on both backends: a parameter is converted into whatever type
//! PostgreSQL inferred for its slot (`BIGINT`, `INTEGER`, `BOOLEAN`, `TEXT`, ...), and a column
//! is read back as an integer, real, text, blob or null (a `BOOLEAN` as 0/1, a `NUMERIC` as an
//! integer when it has no fraction). Text crosses escaped (`PG_TEXT_ESCAPE`): PostgreSQL's
//! `text` cannot hold NUL, SQLite's can, and a value is never a storage error, so NUL is written
//! as an escape and read back as NUL.

use crate::store::engine::sqlite::sqlite_error;
use crate::store::engine::{Arg, DbError, DbErrorKind, DbResult, Params, ToSql, Value, ValueRef};
use tokio_postgres::types::ToSql as PgToSql;

/// `params` as PostgreSQL takes them: the values in `$N` order.
pub(in crate::store::engine) fn pg_values<P: Params + ?Sized>(params: &P) -> DbResult<Vec<Value>> {
    (1..=params.count())
        .map(|n| match params.arg(n) {
            Some(Arg::Value(v)) => value_of(v),
            None => Err(DbError::new(DbErrorKind::Other, format!("no parameter ${n}"))),
        })
        .collect()
}

fn value_of(p: &dyn ToSql) -> DbResult<Value> {
    use rusqlite::types::ToSqlOutput;
    match p.to_sql().map_err(sqlite_error)? {
        ToSqlOutput::Borrowed(v) => Ok(owned(v)),
        ToSqlOutput::Owned(v) => Ok(v),
        _ => Err(DbError::new(DbErrorKind::Other, "a parameter form PostgreSQL cannot take")),
    }
}

fn owned(v: ValueRef<'_>) -> Value {
    match v {
        ValueRef::Null => Value::Null,
        ValueRef::Integer(i) => Value::Integer(i),
        ValueRef::Real(r) => Value::Real(r),
        ValueRef::Text(t) => Value::Text(String::from_utf8_lossy(t).into_owned()),
        ValueRef::Blob(b) => Value::Blob(b.to_vec()),
    }
}

/// The character `PgConn` writes NUL with, since PostgreSQL's `text` cannot hold NUL: NUL is
/// stored as this character and `0`, the character itself as itself twice; every other
/// character as it is. Reading undoes it, so both backends give back the same bytes for every
/// text (SPEC §9). U+FFFF is a Unicode noncharacter: no encoder emits it, and a text without
/// NUL or U+FFFF (every text stored before the escape existed, in practice) is stored unchanged.
/// A U+FFFF followed by anything else reads as itself.
pub const PG_TEXT_ESCAPE: char = '\u{FFFF}';

/// `text` as `PgConn` stores it (see `PG_TEXT_ESCAPE`); borrowed when nothing needs escaping.
pub fn pg_text_escaped(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(['\0', PG_TEXT_ESCAPE]) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            '\0' => {
                out.push(PG_TEXT_ESCAPE);
                out.push('0');
            }
            PG_TEXT_ESCAPE => {
                out.push(PG_TEXT_ESCAPE);
                out.push(PG_TEXT_ESCAPE);
            }
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// A text as PostgreSQL gave it back, unescaped (the inverse of `pg_text_escaped`).
pub fn pg_text_unescaped(stored: String) -> String {
    if !stored.contains(PG_TEXT_ESCAPE) {
        return stored;
    }
    let mut out = String::with_capacity(stored.len());
    let mut chars = stored.chars().peekable();
    while let Some(c) = chars.next() {
        if c != PG_TEXT_ESCAPE {
            out.push(c);
            continue;
        }
        match chars.peek() {
            Some('0') => {
                chars.next();
                out.push('\0');
            }
            Some(&PG_TEXT_ESCAPE) => {
                chars.next();
                out.push(PG_TEXT_ESCAPE);
            }
            _ => out.push(PG_TEXT_ESCAPE),
        }
    }
    out
}

/// A parameter converted into the type PostgreSQL inferred for its slot.
#[derive(Debug)]
pub(super) struct Param<'a>(&'a Value);

pub(super) fn pg_params(values: &[Value]) -> Vec<Param<'_>> {
    values.iter().map(Param).collect()
}

impl tokio_postgres::types::ToSql for Param<'_> {
    fn to_sql(
        &self,
        ty: &tokio_postgres::types::Type,
        out: &mut bytes::BytesMut,
    ) -> Result<tokio_postgres::types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        use tokio_postgres::types::{IsNull, Type};
        let wrong = |what: &str| -> Box<dyn std::error::Error + Sync + Send> {
            format!("a {what} value for a parameter of type {ty}").into()
        };
        match self.0 {
            Value::Null => Ok(IsNull::Yes),
            Value::Integer(v) => match *ty {
                Type::INT8 => PgToSql::to_sql(&v, ty, out),
                Type::INT4 => PgToSql::to_sql(&i32::try_from(*v).map_err(|_| wrong("too large integer"))?, ty, out),
                Type::INT2 => PgToSql::to_sql(&i16::try_from(*v).map_err(|_| wrong("too large integer"))?, ty, out),
                Type::BOOL => PgToSql::to_sql(&(*v != 0), ty, out),
                Type::FLOAT8 => PgToSql::to_sql(&(*v as f64), ty, out),
                Type::TEXT | Type::VARCHAR | Type::UNKNOWN => PgToSql::to_sql(&v.to_string(), &Type::TEXT, out),
                _ => Err(wrong("integer")),
            },
            Value::Real(v) => match *ty {
                Type::FLOAT8 => PgToSql::to_sql(&v, ty, out),
                Type::FLOAT4 => PgToSql::to_sql(&(*v as f32), ty, out),
                _ => Err(wrong("real")),
            },
            Value::Text(s) => match *ty {
                Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME | Type::UNKNOWN => {
                    PgToSql::to_sql(&&*pg_text_escaped(s), &Type::TEXT, out)
                }
                Type::BYTEA => PgToSql::to_sql(&s.as_bytes(), ty, out),
                _ => Err(wrong("text")),
            },
            Value::Blob(b) => match *ty {
                Type::BYTEA => PgToSql::to_sql(&b.as_slice(), ty, out),
                _ => Err(wrong("blob")),
            },
        }
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }

    tokio_postgres::types::to_sql_checked!();
}

/// A column read back as one of SQLite's storage classes.
pub(super) struct Cell(pub(super) Value);

impl<'a> tokio_postgres::types::FromSql<'a> for Cell {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Cell, Box<dyn std::error::Error + Sync + Send>> {
        use tokio_postgres::types::Type;
        let v = match *ty {
            Type::INT8 => Value::Integer(i64::from_sql(ty, raw)?),
            Type::INT4 => Value::Integer(i32::from_sql(ty, raw)?.into()),
            Type::INT2 => Value::Integer(i16::from_sql(ty, raw)?.into()),
            Type::OID => Value::Integer(u32::from_sql(ty, raw)?.into()),
            Type::BOOL => Value::Integer(bool::from_sql(ty, raw)?.into()),
            Type::FLOAT8 => Value::Real(f64::from_sql(ty, raw)?),
            Type::FLOAT4 => Value::Real(f32::from_sql(ty, raw)?.into()),
            Type::NUMERIC => numeric(raw)?,
            Type::BYTEA => Value::Blob(<Vec<u8>>::from_sql(ty, raw)?),
            _ => Value::Text(pg_text_unescaped(
                String::from_sql(&Type::TEXT, raw).map_err(|_| format!("a column of type {ty}"))?,
            )),
        };
        Ok(Cell(v))
    }

    fn from_sql_null(_: &tokio_postgres::types::Type) -> Result<Cell, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Cell(Value::Null))
    }

    fn accepts(_: &tokio_postgres::types::Type) -> bool {
        true
    }
}

/// A `NUMERIC` (what `sum` of `BIGINT` gives) in its binary form: an integer when it has no
/// fraction and fits, else a real.
fn numeric(raw: &[u8]) -> Result<Value, Box<dyn std::error::Error + Sync + Send>> {
    let word = |i: usize| -> Result<i16, Box<dyn std::error::Error + Sync + Send>> {
        let b = raw.get(i * 2..i * 2 + 2).ok_or("a short NUMERIC")?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    };
    let (ndigits, weight, sign) = (word(0)?, word(1)?, word(2)? as u16);
    if sign == 0xC000 {
        return Ok(Value::Real(f64::NAN));
    }
    let mut whole: i128 = 0;
    let mut fraction = 0f64;
    for d in 0..ndigits as usize {
        let digit = i128::from(word(4 + d)?);
        let power = i32::from(weight) - d as i32;
        if power >= 0 {
            whole = whole.checked_mul(10_000).and_then(|w| w.checked_add(digit)).ok_or("a NUMERIC too large")?;
        } else {
            fraction += digit as f64 * 10_000f64.powi(power);
        }
    }
    // Digits beyond the last stored one are zeros.
    let trailing = i32::from(weight) + 1 - i32::from(ndigits.max(0));
    for _ in 0..trailing.max(0) {
        whole = whole.checked_mul(10_000).ok_or("a NUMERIC too large")?;
    }
    let negative = sign == 0x4000;
    if fraction == 0.0
        && let Ok(v) = i64::try_from(whole)
    {
        return Ok(Value::Integer(if negative { -v } else { v }));
    }
    let v = whole as f64 + fraction;
    Ok(Value::Real(if negative { -v } else { v }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// NUL and the escape character survive the way through PostgreSQL's text, and every other
    /// text is stored as it is.
    #[test]
    fn texts_are_escaped_for_postgres_and_back() {
        let e = PG_TEXT_ESCAPE;
        for (text, stored) in [
            ("plain é😀".to_string(), "plain é😀".to_string()),
            ("a\0b".into(), format!("a{e}0b")),
            (format!("{e}"), format!("{e}{e}")),
            (format!("{e}0\0"), format!("{e}{e}0{e}0")),
            (String::new(), String::new()),
        ] {
            assert_eq!(pg_text_escaped(&text), stored);
            assert!(!stored.contains('\0'));
            assert_eq!(pg_text_unescaped(stored), text);
        }
        assert!(matches!(pg_text_escaped("no escape"), std::borrow::Cow::Borrowed(_)));
        // What an earlier hub stored with a lone U+FFFF reads as it was.
        assert_eq!(pg_text_unescaped(format!("a{e}b{e}")), format!("a{e}b{e}"));
    }

    #[test]
    fn numerics_read_as_integers_when_whole() {
        // 12345678 = [1234, 5678], weight 1.
        let enc = |ndigits: i16, weight: i16, sign: u16, scale: u16, digits: &[i16]| {
            let mut v = Vec::new();
            for w in [ndigits, weight, sign as i16, scale as i16].iter().chain(digits) {
                v.extend_from_slice(&w.to_be_bytes());
            }
            v
        };
        assert_eq!(numeric(&enc(2, 1, 0, 0, &[1234, 5678])).unwrap(), Value::Integer(12_345_678));
        assert_eq!(numeric(&enc(1, 1, 0x4000, 0, &[7])).unwrap(), Value::Integer(-70_000));
        assert_eq!(numeric(&enc(0, 0, 0, 0, &[])).unwrap(), Value::Integer(0));
        assert_eq!(numeric(&enc(2, 0, 0, 1, &[3, 5000])).unwrap(), Value::Real(3.5));
    }
}
