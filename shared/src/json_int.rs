//! Whole numbers in request bodies as JSON Schema reads them: `12`, `12.0` and `1.2e1` are the
//! same integer (JSON Schema's `integer` is any number with a zero fractional part), so every
//! integer field of a request takes all three, while `12.5` is refused as before. Used through
//! `#[serde(deserialize_with = ...)]` on the request types in `wire`.
//!
//! A number written with a fraction or an exponent is read as a double: one beyond
//! `EXACT_MAX` (2^53) is refused, since the double may no longer be the integer that was
//! written.

use serde::de::{self, Deserializer, Visitor};
use std::fmt;
use std::marker::PhantomData;

/// The largest magnitude a number written with a fraction or exponent is taken at: every
/// integer up to it is exactly one double.
pub const EXACT_MAX: f64 = 9_007_199_254_740_992.0;

/// Reads a whole number of type `T` (see the module docs).
pub fn integer<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    d.deserialize_any(Whole(PhantomData))
}

/// Reads an optional whole number of type `T`: `null` (or an absent field, with
/// `#[serde(default)]`) is `None`.
pub fn optional<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: TryFrom<i64> + TryFrom<u64>,
{
    d.deserialize_option(Maybe(PhantomData))
}

struct Whole<T>(PhantomData<T>);

/// What a number out of its field's range was expected to be.
const IN_RANGE: &str = "a whole number in this field's range";

impl<T> Whole<T> {
    fn out_of_range<E: de::Error>(v: de::Unexpected<'_>) -> E {
        E::invalid_value(v, &IN_RANGE)
    }
}

impl<'de, T> Visitor<'de> for Whole<T>
where
    T: TryFrom<i64> + TryFrom<u64>,
{
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        T::try_from(v).map_err(|_| Self::out_of_range(de::Unexpected::Signed(v)))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        T::try_from(v).map_err(|_| Self::out_of_range(de::Unexpected::Unsigned(v)))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        if !v.is_finite() || v.fract() != 0.0 {
            return Err(E::invalid_type(de::Unexpected::Float(v), &self));
        }
        if v.abs() > EXACT_MAX {
            return Err(Self::out_of_range(de::Unexpected::Float(v)));
        }
        // Whole and within ±2^53: the cast is exact.
        if v < 0.0 { self.visit_i64(v as i64) } else { self.visit_u64(v as u64) }
    }
}

struct Maybe<T>(PhantomData<T>);

impl<'de, T> Visitor<'de> for Maybe<T>
where
    T: TryFrom<i64> + TryFrom<u64>,
{
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
        integer(d).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use serde::Deserialize;

    #[derive(Debug, Deserialize, PartialEq)]
    struct T {
        #[serde(deserialize_with = "super::integer")]
        n: u32,
        #[serde(default, deserialize_with = "super::optional")]
        o: Option<i32>,
    }

    fn read(text: &str) -> Result<T, String> {
        serde_json::from_str(text).map_err(|e| e.to_string())
    }

    /// An integral value is one integer however it is written; a fraction, a value out of the
    /// type's range, one past 2^53 in a double's form, and a string are refused.
    #[test]
    fn integral_values_are_integers_however_written() {
        for text in [r#"{"n": 12}"#, r#"{"n": 12.0}"#, r#"{"n": 1.2e1}"#, r#"{"n": 120e-1}"#] {
            assert_eq!(read(text), Ok(T { n: 12, o: None }), "{text}");
        }
        assert_eq!(read(r#"{"n": 0, "o": -3.0}"#), Ok(T { n: 0, o: Some(-3) }));
        assert_eq!(read(r#"{"n": 0, "o": null}"#), Ok(T { n: 0, o: None }));
        for (text, words) in [
            (r#"{"n": 12.5}"#, "invalid type: floating point `12.5`, expected an integer"),
            (r#"{"n": -1}"#, "invalid value: integer `-1`, expected a whole number in this field's range"),
            (r#"{"n": -1.0}"#, "invalid value: integer `-1`"),
            (r#"{"n": 4294967296}"#, "invalid value: integer `4294967296`"),
            (r#"{"n": 1e300}"#, "invalid value: floating point"),
            (r#"{"n": 9007199254740994.0}"#, "invalid value: floating point"),
            (r#"{"n": "12"}"#, "expected an integer"),
            (r#"{"n": 1, "o": 2.5}"#, "expected an integer"),
        ] {
            let e = read(text).unwrap_err();
            assert!(e.contains(words), "{text}: {e}");
        }
    }
}
