//! `otlp_endpoint`: where a process exports its spans, as the hub and the node validate it.

use crate::limits::ENDPOINT_CHARS_MAX;
use std::fmt;

/// The path an OTLP/HTTP receiver takes traces at.
pub const TRACES_PATH: &str = "/v1/traces";

/// A validated `otlp_endpoint`: an `http://` or `https://` URL of an OTLP/HTTP receiver (a
/// collector's base URL such as `http://collector:4318`, to which `/v1/traces` is added, or the
/// full traces URL ending in `/v1/traces`), with a host and without credentials, query or
/// fragment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpEndpoint {
    /// The value as configured.
    given: String,
    /// The URL spans are posted to.
    traces_url: String,
}

impl OtlpEndpoint {
    /// Parses a configured value; the error says what is wrong (the caller names the key).
    pub fn parse(text: &str) -> Result<OtlpEndpoint, String> {
        if text.chars().count() > ENDPOINT_CHARS_MAX {
            return Err(format!("is longer than {ENDPOINT_CHARS_MAX} characters"));
        }
        let url = reqwest::Url::parse(text).map_err(|e| format!("{text:?} is not a URL ({e})"))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(format!("{text:?} must start with http:// or https://"));
        }
        if url.host_str().is_none_or(str::is_empty) {
            return Err(format!("{text:?} names no host"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("must not carry credentials (user:password@)".to_string());
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err(format!("{text:?} must have neither a query nor a fragment"));
        }
        let base = url.as_str().trim_end_matches('/');
        let traces_url = if url.path().trim_end_matches('/').ends_with(TRACES_PATH) {
            base.to_string()
        } else {
            format!("{base}{TRACES_PATH}")
        };
        Ok(OtlpEndpoint { given: text.to_string(), traces_url })
    }

    /// The URL spans are posted to.
    pub fn traces_url(&self) -> &str {
        &self.traces_url
    }
}

impl fmt::Display for OtlpEndpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.given)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(text: &str, expected: Result<&str, &str>) {
        match (OtlpEndpoint::parse(text), expected) {
            (Ok(e), Ok(url)) => assert_eq!(e.traces_url(), url, "{text}"),
            (Err(e), Err(why)) => assert!(e.contains(why), "{text}: {e}"),
            (got, want) => panic!("{text}: got {got:?}, expected {want:?}"),
        }
    }

    #[test]
    fn endpoints_are_http_urls_of_a_receiver() {
        check("http://collector:4318", Ok("http://collector:4318/v1/traces"));
        check("http://collector:4318/", Ok("http://collector:4318/v1/traces"));
        check("https://otel.example.net/v1/traces", Ok("https://otel.example.net/v1/traces"));
        check("https://otel.example.net/otlp", Ok("https://otel.example.net/otlp/v1/traces"));
        check("http://127.0.0.1:4318/v1/traces/", Ok("http://127.0.0.1:4318/v1/traces"));
        check("grpc://collector:4317", Err("http:// or https://"));
        check("collector:4318", Err("http:// or https://"));
        check("not a url", Err("not a URL"));
        check("http://u:p@collector:4318", Err("credentials"));
        check("http://collector:4318/?a=b", Err("query"));
        check("", Err("not a URL"));
        check(&format!("http://h/{}", "a".repeat(ENDPOINT_CHARS_MAX)), Err("longer than"));
    }
}
