//! The `Idempotency-Key` request header, as draft-ietf-httpapi-idempotency-key-header defines
//! it: an Item Structured Header Field (RFC 9651, formerly RFC 8941) whose value is a String.
//!
//! ```text
//! Idempotency-Key: "8e03978e-40d5-43e8-bc93-6894a57f9324"
//! ```
//!
//! * The value is a quoted sf-string: printable ASCII (`%x20-7E`), `"` and `\` escaped with a
//!   backslash. A bare token (`Idempotency-Key: abc`), a number, a byte sequence, a boolean, a
//!   list, or anything that does not parse is malformed.
//! * Parameters (`"abc";v=1`) are allowed by the Item syntax and ignored, as RFC 9651 asks of
//!   parameters a field does not define; the key is the String alone.
//! * Several `Idempotency-Key` lines are combined with commas before parsing (RFC 9651 § 4.2),
//!   which makes them a list, not an Item: malformed.
//! * The draft leaves the key's length to the resource; pg_intent stores 1–255 characters, so
//!   an empty key and a longer one are malformed too.
//!
//! Every one of these is answered `400 Bad Request` before the database is asked.

use axum::http::HeaderMap;
use axum::http::header::HeaderName;
use sfv::{BareItem, Item, Parser};

/// The header's name.
pub static IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static("idempotency-key");

/// The longest key pg_intent stores, in characters (an sf-string is ASCII: bytes too).
pub const MAX_KEY_CHARS: usize = pg_intent_client::MAX_NAME_CHARS;

/// Why a request carries no usable key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyError {
    /// No `Idempotency-Key` header.
    Missing,
    /// The header is there but is not one sf-string of 1–255 characters; says why.
    Malformed(String),
}

/// The idempotency key of a request.
pub fn idempotency_key(headers: &HeaderMap) -> Result<String, KeyError> {
    let mut lines = headers.get_all(&IDEMPOTENCY_KEY).iter();
    let Some(first) = lines.next() else {
        return Err(KeyError::Missing);
    };
    // RFC 9651 § 4.2: a field sent on several lines is parsed as their comma-joined values.
    let mut value = first.as_bytes().to_vec();
    for line in lines {
        value.extend_from_slice(b", ");
        value.extend_from_slice(line.as_bytes());
    }
    parse(&value)
}

/// Parses one field value.
pub fn parse(value: &[u8]) -> Result<String, KeyError> {
    let malformed = |why: &str| KeyError::Malformed(why.to_string());
    let item: Item = Parser::new(value).parse().map_err(|e| {
        let unquoted = !value.contains(&b'"');
        if unquoted && !value.is_empty() && value.iter().all(|b| b.is_ascii_graphic()) {
            KeyError::Malformed(format!(
                "Idempotency-Key must be a quoted string (a Structured Field String), e.g. \"{}\"",
                String::from_utf8_lossy(value)
            ))
        } else {
            KeyError::Malformed(format!(
                "Idempotency-Key is not a Structured Field Item ({e})"
            ))
        }
    })?;
    let key = match item.bare_item {
        BareItem::String(s) => s.as_str().to_string(),
        BareItem::Token(t) => {
            return Err(KeyError::Malformed(format!(
                "Idempotency-Key must be a quoted string, e.g. \"{}\"",
                t.as_str()
            )));
        }
        _ => {
            return Err(malformed(
                "Idempotency-Key must be a String (in double quotes)",
            ));
        }
    };
    if key.is_empty() {
        return Err(malformed("Idempotency-Key must not be empty"));
    }
    if key.len() > MAX_KEY_CHARS {
        return Err(KeyError::Malformed(format!(
            "Idempotency-Key is {} characters long; at most {MAX_KEY_CHARS} are allowed",
            key.len()
        )));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(v: &str) -> String {
        parse(v.as_bytes()).unwrap_or_else(|e| panic!("{v:?}: {e:?}"))
    }

    fn bad(v: &[u8]) -> String {
        match parse(v) {
            Err(KeyError::Malformed(why)) => why,
            other => panic!(
                "{:?} should be malformed, got {other:?}",
                String::from_utf8_lossy(v)
            ),
        }
    }

    #[test]
    fn strings_are_keys() {
        assert_eq!(
            ok(r#""8e03978e-40d5-43e8-bc93-6894a57f9324""#),
            "8e03978e-40d5-43e8-bc93-6894a57f9324"
        );
        assert_eq!(ok(r#""click 1""#), "click 1");
        // Escapes: \" and \\ only.
        assert_eq!(ok(r#""a\"b\\c""#), r#"a"b\c"#);
        // Leading and trailing spaces around the item are not part of it.
        assert_eq!(ok(r#"  "k"  "#), "k");
        // Parameters are ignored; the key is the String.
        assert_eq!(ok(r#""k";v=1;x"#), "k");
        let longest = format!("\"{}\"", "x".repeat(MAX_KEY_CHARS));
        assert_eq!(ok(&longest).len(), MAX_KEY_CHARS);
    }

    #[test]
    fn everything_else_is_malformed() {
        assert!(bad(b"abc").contains("quoted"), "a bare token");
        assert!(
            bad(b"8e03978e-40d5-43e8").contains("quoted"),
            "unquoted uuid"
        );
        bad(b"42"); // an Integer
        bad(b"4.2"); // a Decimal
        bad(b"?1"); // a Boolean
        bad(b":YWJj:"); // a Byte Sequence
        bad(b"@1700000000"); // a Date
        bad(br#"%"abc""#); // a Display String
        bad(br#""a", "b""#); // a List (two header lines)
        bad(br#""abc"#); // unterminated
        bad(br#""a\b""#); // an escape other than \" and \\
        bad("\"é\"".as_bytes()); // not ASCII
        bad(b"\"tab\there\""); // a control character
        bad(b""); // empty field value
        assert!(bad(br#""""#).contains("empty"));
        let too_long = format!("\"{}\"", "x".repeat(MAX_KEY_CHARS + 1));
        assert!(bad(too_long.as_bytes()).contains("at most 255"));
        bad(br#""k";"#); // a dangling parameter separator
        bad(br#""k" x"#); // trailing garbage
    }

    #[test]
    fn header_lines_combine() {
        let mut h = HeaderMap::new();
        assert_eq!(idempotency_key(&h), Err(KeyError::Missing));
        h.append(&IDEMPOTENCY_KEY, r#""k1""#.parse().unwrap());
        assert_eq!(idempotency_key(&h), Ok("k1".to_string()));
        h.append(&IDEMPOTENCY_KEY, r#""k2""#.parse().unwrap());
        assert!(matches!(idempotency_key(&h), Err(KeyError::Malformed(_))));
    }
}
