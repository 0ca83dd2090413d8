//! Credentials out of URLs and error texts, as reqwest's URL parser reads the URL.
//!
//! reqwest parses a URL with the WHATWG parser (the `url` crate), which skips any number of `/`
//! and `\` after a special scheme: `https:///u:pw@host`, `https:/u:pw@host` and
//! `https:\\u:pw@host` all send `u:pw` as basic auth. So the userinfo and the query are taken
//! from that parser's reading, never from the text's shape.

use percent_encoding::percent_decode_str;
use url::Url;

/// `url` parsed as reqwest parses it, when it is a URL reqwest would send (HTTP or HTTPS, with
/// a host).
fn parsed(url: &str) -> Option<Url> {
    let parsed = Url::parse(url).ok()?;
    (matches!(parsed.scheme(), "http" | "https") && parsed.has_host()).then_some(parsed)
}

/// `url` with its credentials replaced, for evidence, logs and `Debug`: the userinfo
/// (`user:secret@`) becomes `redacted@`, every query value becomes `redacted` (a bare query
/// word too), and the fragment is dropped.
///
/// An HTTP(S) URL is read as reqwest reads it (the WHATWG URL parser, which also finds the
/// userinfo of `https:///user:secret@host`) and shown as that parser writes it (so
/// `https://host?q` is shown `https://host/?q`). Anything else, which reqwest would not send,
/// loses everything up to its last `@` before the query.
///
/// ```
/// use pg_intent_harness::redact_url;
/// assert_eq!(
///     redact_url("https://bob:s3cret@api.example.com/v1?api-key=abc&x#frag"),
///     "https://redacted@api.example.com/v1?api-key=redacted&redacted"
/// );
/// assert_eq!(redact_url("https:///bob:s3cret@api.example.com/v1"), "https://redacted@api.example.com/v1");
/// assert_eq!(redact_url("http://127.0.0.1:8089/v1"), "http://127.0.0.1:8089/v1");
/// ```
pub fn redact_url(url: &str) -> String {
    if let Some(mut u) = parsed(url) {
        u.set_fragment(None);
        if !u.username().is_empty() || u.password().is_some() {
            // Cannot fail: the URL has a host and a special scheme.
            let _ = u.set_password(None);
            let _ = u.set_username("redacted");
        }
        if let Some(query) = u.query() {
            let query = redact_query(query);
            u.set_query(Some(&query));
        }
        if u.password().is_none() && (u.username().is_empty() || u.username() == "redacted") {
            return u.to_string();
        }
    }
    redact_text(url)
}

/// A URL that is not one reqwest would send: everything before the last `@` (outside the
/// query) goes, the query values are replaced and the fragment dropped.
fn redact_text(url: &str) -> String {
    let url = url.split_once('#').map_or(url, |(before, _)| before);
    let (rest, query) = match url.split_once('?') {
        Some((rest, query)) => (rest, Some(query)),
        None => (url, None),
    };
    let mut out = match rest.rsplit_once('@') {
        Some((_, after)) => format!("redacted@{after}"),
        None => rest.to_string(),
    };
    if let Some(query) = query {
        out.push('?');
        out.push_str(&redact_query(query));
    }
    out
}

/// A query string with every value (and every bare word) replaced.
fn redact_query(query: &str) -> String {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((key, _)) => format!("{key}=redacted"),
            None => "redacted".to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// The secrets of a URL that an error text might echo: the userinfo's user and password and the
/// query values (bare query words too), each as written and percent-decoded (as reqwest sends
/// basic auth, and as a server reads the query). Empty ones are left out.
pub(super) fn url_secrets(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    let mut add = |raw: &str, decoded: String| {
        secrets.push(raw.to_string());
        secrets.push(decoded);
    };
    let decode = |s: &str| percent_decode_str(s).decode_utf8_lossy().into_owned();
    let form_decode = |s: &str| decode(&s.replace('+', " "));
    let query = match parsed(url) {
        Some(u) => {
            add(u.username(), decode(u.username()));
            if let Some(pw) = u.password() {
                add(pw, decode(pw));
            }
            u.query().map(str::to_string)
        }
        None => {
            // Not sent by reqwest; conservatively, everything before the last `@`.
            let before = url.split(['?', '#']).next().unwrap_or("");
            if let Some((userinfo, _)) = before.rsplit_once('@') {
                let userinfo = userinfo.rsplit_once("://").map_or(userinfo, |(_, u)| u);
                for part in userinfo.split(':') {
                    add(part, decode(part));
                }
            }
            url.split_once('?')
                .map(|(_, q)| q.split('#').next().unwrap_or("").to_string())
        }
    };
    for pair in query.iter().flat_map(|q| q.split('&')) {
        let value = pair.split_once('=').map_or(pair, |(_, v)| v);
        add(value, form_decode(value));
    }
    secrets.retain(|s| !s.is_empty());
    secrets.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
    secrets.dedup();
    secrets
}

/// Secrets shorter than this are replaced only where they stand alone (not inside a word):
/// `pw` is scrubbed from `bad password pw`, not from `upward`.
const SHORT_SECRET: usize = 4;

/// `text` with every occurrence of each secret replaced by `redacted`, in one pass (a secret
/// inside the word `redacted` is not found there again). A secret of at least
/// [`SHORT_SECRET`] bytes is replaced wherever it occurs; a shorter one where it is not next to
/// a letter or digit.
pub(super) fn scrub(text: &str, secrets: &[String]) -> String {
    let mut hidden = vec![false; text.len()];
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        for (at, _) in text.match_indices(secret.as_str()) {
            let end = at + secret.len();
            if secret.len() < SHORT_SECRET {
                let before = text[..at].chars().next_back();
                let after = text[end..].chars().next();
                if before.is_some_and(char::is_alphanumeric)
                    || after.is_some_and(char::is_alphanumeric)
                {
                    continue;
                }
            }
            hidden[at..end].iter_mut().for_each(|h| *h = true);
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut in_secret = false;
    for (at, c) in text.char_indices() {
        if hidden[at] {
            if !in_secret {
                out.push_str("redacted");
            }
            in_secret = true;
        } else {
            in_secret = false;
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_lose_their_credentials() {
        for (url, want) in [
            (
                "http://user:secret@127.0.0.1:8089/v1/chat/completions",
                "http://redacted@127.0.0.1:8089/v1/chat/completions",
            ),
            (
                "https://api.example.com/v1?key=sk-123&api-version=2024",
                "https://api.example.com/v1?key=redacted&api-version=redacted",
            ),
            (
                "https://tok@api.example.com?sk-bare#frag",
                "https://redacted@api.example.com/?redacted",
            ),
            ("http://h:1/v1", "http://h:1/v1"),
            ("user:pw@host/x?y=z", "redacted@host/x?y=redacted"),
            // What reqwest's parser reads as userinfo, however many slashes come first.
            ("https:///u:pw@h/v1", "https://redacted@h/v1"),
            ("https:/u:pw@h/v1", "https://redacted@h/v1"),
            ("https://///u:pw@h/v1", "https://redacted@h/v1"),
            ("https:\\\\u:pw@h/v1", "https://redacted@h/v1"),
            ("HTTPS:u:pw@h/v1", "https://redacted@h/v1"),
            ("http://:pw@h/", "http://redacted@h/"),
            // Not sent by reqwest, and shown without anything before the last @.
            ("ftp://u:pw@h/x", "redacted@h/x"),
            ("not a url u:pw@h", "redacted@h"),
        ] {
            assert_eq!(redact_url(url), want, "{url}");
        }
        // An @ in the path is not userinfo.
        assert_eq!(redact_url("http://h/a@b"), "http://h/a@b");
    }

    #[test]
    fn secrets_are_found_as_reqwest_reads_the_url_and_decoded() {
        let s = url_secrets("https:///al%69ce:p%40ss+w@h/v1?key=a%2Bb+c&bare");
        for want in [
            "al%69ce", "alice", "p%40ss+w", "p@ss+w", "a%2Bb+c", "a+b c", "bare",
        ] {
            assert!(s.iter().any(|x| x == want), "{want} in {s:?}");
        }
        assert!(url_secrets("http://h/v1").is_empty());
        assert_eq!(url_secrets("https:/u:pw@h/"), ["pw", "u"]);
    }

    #[test]
    fn short_secrets_are_scrubbed_where_they_stand_alone() {
        let secrets = url_secrets("http://u:pw@h/?k=xyz123");
        assert_eq!(
            scrub("bad password pw for user u, upward: xyz123!", &secrets),
            "bad password redacted for user redacted, upward: redacted!"
        );
        // One pass: a secret inside the replacement is not replaced again.
        let secrets = ["secret".to_string(), "dact".to_string()];
        assert_eq!(scrub("a secret", &secrets), "a redacted");
        assert_eq!(scrub("ééx", &["x".to_string()]), "ééx");
        assert_eq!(scrub("é x", &["x".to_string()]), "é redacted");
    }
}
