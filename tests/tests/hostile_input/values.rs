//! The values of the corpus: parameters of every type (NULL ones too, and raw bytes no client
//! library would send), names, reasons and documents, valid and bad, and bad leases and
//! versions.

use super::*;

pub type Param = Box<dyn ToSql + Sync + Send>;

pub fn text(s: impl Into<String>) -> Param {
    Box::new(Some(s.into()))
}
pub fn null_text() -> Param {
    Box::new(None::<String>)
}
pub fn raw(bytes: Vec<u8>) -> Param {
    Box::new(RawText(bytes))
}
pub fn jsonb(v: Value) -> Param {
    Box::new(v)
}
pub fn raw_jsonb(text: Vec<u8>) -> Param {
    Box::new(RawJsonb(text))
}
pub fn null_jsonb() -> Param {
    Box::new(None::<Value>)
}
pub fn int(i: i32) -> Param {
    Box::new(i)
}
pub fn null_int() -> Param {
    Box::new(None::<i32>)
}
pub fn bigint(i: i64) -> Param {
    Box::new(i)
}
pub fn null_bigint() -> Param {
    Box::new(None::<i64>)
}
pub fn id(u: Uuid) -> Param {
    Box::new(u)
}
pub fn null_id() -> Param {
    Box::new(None::<Uuid>)
}
pub fn interval(micros: i64, days: i32, months: i32) -> Param {
    Box::new(RawInterval {
        micros,
        days,
        months,
    })
}
pub fn null_interval() -> Param {
    Box::new(None::<RawInterval>)
}
pub fn boolean(b: bool) -> Param {
    Box::new(b)
}
pub fn null_bool() -> Param {
    Box::new(None::<bool>)
}

// --- strings ------------------------------------------------------------------------------------

/// Characters a careless client (or a hostile one) puts in names: controls, bidi overrides,
/// joiners, byte-order marks, noncharacters, private use, astral planes, combining marks, quotes,
/// format specifiers, and plain letters.
pub const ODD: &[char] = &[
    '\u{202E}',
    '\u{200D}',
    '\u{200B}',
    '\u{FEFF}',
    '\u{FFFF}',
    '\u{FFFE}',
    '\u{E000}',
    '\u{1F600}',
    '\u{1F469}',
    '\u{0301}',
    '\u{10FFFF}',
    '\u{1D11E}',
    '\u{2028}',
    '\u{85}',
    '\u{7F}',
    '\u{1}',
    '\t',
    '\n',
    '\r',
    '\\',
    '\'',
    '"',
    '%',
    '$',
    ';',
    'Ω',
    'ß',
    'ö',
    'к',
    '中',
    'a',
    'z',
    '0',
    ' ',
    '-',
];

/// `n` characters drawn from [`ODD`].
pub fn odd(rng: &mut Rng, n: usize) -> String {
    (0..n).map(|_| *rng.pick(ODD)).collect()
}

/// A valid name: 1 to 255 characters, often odd ones.
pub fn good_name(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => format!("name-{}", rng.below(1000)),
        1 => odd(rng, 255),
        _ => {
            let n = rng.between(1, 40) as usize;
            odd(rng, n)
        }
    }
}

/// A name that breaks the 1–255 character rule.
pub fn bad_name(rng: &mut Rng) -> (String, &'static str) {
    match rng.below(5) {
        0 => (String::new(), "empty"),
        1 => {
            let n = rng.between(256, 300) as usize;
            (odd(rng, n), "256-300 odd characters")
        }
        2 => ("\u{1F600}".repeat(256), "256 four-byte characters"),
        3 => (
            "e\u{301}".repeat(128),
            "128 letters with combining accents (256 characters)",
        ),
        _ => {
            let n = rng.between(1000, 200_000) as usize;
            ("x".repeat(n), "thousands of characters")
        }
    }
}

/// Bytes that are not UTF-8, for a text argument.
pub fn not_utf8(rng: &mut Rng) -> (Vec<u8>, &'static str) {
    let (bad, what): (&[u8], &str) = *rng.pick(&[
        (&[0xFF][..], "byte 0xFF"),
        (&[0xC0, 0x80], "overlong NUL"),
        (&[0xED, 0xA0, 0x80], "UTF-16 surrogate"),
        (&[0xF4, 0x90, 0x80, 0x80], "beyond U+10FFFF"),
        (&[0xE2, 0x82], "truncated sequence"),
        (&[0x80], "lone continuation byte"),
    ]);
    let mut bytes = b"key-".to_vec();
    bytes.extend_from_slice(bad);
    if rng.percent(50) {
        bytes.extend_from_slice(b"-tail");
    }
    (bytes, what)
}

/// A name with a NUL byte somewhere.
pub fn with_nul(rng: &mut Rng) -> Vec<u8> {
    let mut s = good_name(rng).into_bytes();
    let at = rng.below(s.len() + 1);
    // Keep the text valid UTF-8 around the NUL: insert at a char boundary.
    let at = (0..=at)
        .rev()
        .find(|&i| i == 0 || i == s.len() || (s[i] & 0xC0) != 0x80)
        .unwrap_or(0);
    s.insert(at, 0);
    s
}

/// A reason that breaks the 1–1000 character rule.
pub fn bad_reason(rng: &mut Rng) -> String {
    if rng.percent(30) {
        String::new()
    } else {
        let n = rng.between(1001, 5000) as usize;
        odd(rng, n)
    }
}

// --- documents -----------------------------------------------------------------------------------

/// A jsonb document over `limit` bytes (params, errors and schemas: 1 MiB; results: 16 MiB),
/// as text, in one of several shapes.
pub fn huge_document(rng: &mut Rng, limit: usize) -> (Vec<u8>, &'static str) {
    let extra = rng.below(4096);
    match rng.below(4) {
        0 => (
            format!("{{\"blob\": \"{}\"}}", "y".repeat(limit + extra)).into_bytes(),
            "a string over the limit",
        ),
        1 => {
            let items: Vec<String> = (0..(limit / 7 + extra))
                .map(|i| (i % 1_000_000).to_string())
                .collect();
            (
                format!("[{}]", items.join(",")).into_bytes(),
                "an array of numbers over the limit",
            )
        }
        2 => {
            let fields: Vec<String> = (0..(limit / 14 + extra))
                .map(|i| format!("\"k{i:08}\":1"))
                .collect();
            (
                format!("{{{}}}", fields.join(",")).into_bytes(),
                "an object of keys over the limit",
            )
        }
        _ => {
            // Deeply nested AND over the limit.
            let doc = nested_json(3000, &format!("\"{}\"", "z".repeat(limit)));
            (doc, "over the limit under 3,000 levels of nesting")
        }
    }
}

/// A valid, odd document: deep nesting, odd Unicode, big numbers, empty containers.
pub fn odd_document(rng: &mut Rng) -> Vec<u8> {
    match rng.below(5) {
        0 => nested_json(rng.between(500, 10_000) as usize, "1"),
        1 => format!("{{\"s\": {}}}", Value::String(odd(rng, 300))).into_bytes(),
        2 => b"[1e308, -1e-308, 123456789012345678901234567890, 0.0, -0]".to_vec(),
        3 => b"[{}, [], null, \"\", true]".to_vec(),
        _ => b"null".to_vec(),
    }
}

/// A lease or heartbeat extension that is not in (0, 24 hours]: every field of the same sign,
/// so that the calendar and a fixed 30-day month agree it is out of range.
pub fn bad_lease(rng: &mut Rng) -> (Param, String) {
    let day = 86_400_000_000i64;
    let (micros, days, months) = match rng.below(9) {
        0 => (0, 0, 0),
        1 => (-rng.between(1, i64::MAX / 2), 0, 0),
        2 => (-rng.between(0, day), -(rng.between(1, 1000) as i32), 0),
        3 => (0, 0, -(rng.between(1, 1_000_000) as i32)),
        4 => (day + rng.between(1, day * 365), 0, 0),
        5 => (rng.between(0, day), rng.between(2, 100_000) as i32, 0),
        6 => (rng.between(1, day), 1, 0),
        7 => (
            rng.between(0, day),
            rng.between(0, 30) as i32,
            rng.between(1, 1_000_000) as i32,
        ),
        _ => *rng.pick(&[
            (i64::MAX, i32::MAX, i32::MAX),
            (i64::MIN, i32::MIN, i32::MIN),
            (i64::MAX, 0, 0),
            (0, i32::MAX, 0),
            (0, 0, i32::MAX),
            (day + 1, 0, 0),
            (-1, 0, 0),
        ]),
    };
    (
        interval(micros, days, months),
        format!("interval of {months} months {days} days {micros} µs"),
    )
}

/// A version other than 1 (every attempt of the fixture was handed version 1).
pub fn wrong_version(rng: &mut Rng) -> i64 {
    let random = rng.between(4, i64::MAX / 2);
    *rng.pick(&[0, -1, 2, 3, i64::MAX, i64::MIN, random])
}
