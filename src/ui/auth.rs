//! Who may use the dashboard: the pure checks on a request's headers, with no I/O.
//!
//! - Off loopback, a token is required (`observe.admin_token`): a serving process without
//!   one refuses to start ([`check_listen`]). When set, every API call must carry it, as
//!   `Authorization: Bearer <token>` or in the cookie the page's login sets; it is compared
//!   in constant time.
//! - Without a token, only requests naming a loopback `Host` are served (no DNS rebinding).
//! - Every action (a POST) must also carry this process's CSRF token twice: in the
//!   `SameSite=Strict` cookie the page was served with and in the `X-CSRF-Token` header that
//!   only the page's own script can set; and its `Origin`, when the browser sends one, must
//!   be the address the request was sent to (`Host`). A page on another site can make the
//!   browser send neither the header nor, with `SameSite=Strict`, the cookie.
//!
//! The tokens themselves are made by the caller; this module only compares.
//!
//! Pure: no I/O, no clock read, no spawn; checked by `tidy.rs`.

use std::net::SocketAddr;

use axum::http::{header, HeaderMap};

/// The cookie holding the CSRF token.
pub const CSRF_COOKIE: &str = "leaderq_csrf";
/// The header the page's script repeats it in.
pub const CSRF_HEADER: &str = "x-csrf-token";
/// The cookie holding the admin token once typed into the page.
pub const TOKEN_COOKIE: &str = "leaderq_token";

/// Why a request is refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No token, or the wrong one (401: the page asks for it).
    Token,
    /// A POST without this process's CSRF token in both cookie and header (403).
    Csrf,
    /// A POST whose Origin is not the address it was sent to (403).
    Origin,
    /// No token is set and the request does not name a loopback host (403).
    Host,
}

impl Refusal {
    /// The message shown to the operator.
    pub fn message(self) -> &'static str {
        match self {
            Refusal::Token => "the dashboard needs its token (observe.admin_token): enter it, or send Authorization: Bearer <token>",
            Refusal::Csrf => "missing or stale CSRF token: reload the dashboard and try again",
            Refusal::Origin => "the request comes from another site than the dashboard: open the dashboard at its own address",
            Refusal::Host => "without observe.admin_token the dashboard answers only at a loopback address (http://127.0.0.1:PORT/ui/ or http://localhost:PORT/ui/); set a token to reach it by another name",
        }
    }
}

/// Whether a dashboard may serve on `listen`: on a loopback address always; on any other
/// only with a token.
pub fn check_listen(listen: SocketAddr, token: Option<&str>) -> Result<(), String> {
    if listen.ip().is_loopback() || token.is_some() {
        return Ok(());
    }
    Err(format!(
        "the dashboard would serve on {listen}, which is not a loopback address, without a token: set observe.admin_token (LEADERQ__OBSERVE__ADMIN_TOKEN) to a long random secret, or listen on 127.0.0.1, or turn the dashboard off with observe.dashboard = false"
    ))
}

/// Equality that takes the same time wherever the first difference is, so a caller cannot
/// guess a token byte by byte from answer times (only the length shows).
pub fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The value of cookie `name` in the request's `Cookie` headers.
pub fn cookie<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|line| line.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value)
}

/// A read (or a login's follow-ups): allowed when the request carries the token, or when
/// none is set and the request names a loopback host (see [`check_loopback_host`]).
pub fn check_read(headers: &HeaderMap, token: Option<&str>) -> Result<(), Refusal> {
    let Some(token) = token else {
        return check_loopback_host(headers);
    };
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let given = bearer.or_else(|| cookie(headers, TOKEN_COOKIE));
    match given {
        Some(given) if same(given, token) => Ok(()),
        _ => Err(Refusal::Token),
    }
}

/// Without a token the dashboard serves only on loopback, and only requests whose `Host`
/// is a loopback name or address: a page on another site that rebinds its own name to
/// 127.0.0.1 (DNS rebinding) would otherwise be the dashboard's "same origin", able to
/// read its CSRF token and act.
pub fn check_loopback_host(headers: &HeaderMap) -> Result<(), Refusal> {
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .ok_or(Refusal::Host)?;
    // "[::1]:9464", "127.0.0.1:9464", "localhost:9464", or any of them without the port.
    let name = match host.strip_prefix('[') {
        Some(bracketed) => bracketed.split(']').next().unwrap_or_default(),
        None => host.rsplit_once(':').map_or(host, |(name, _)| name),
    };
    let loopback = name.eq_ignore_ascii_case("localhost")
        || name
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback {
        Ok(())
    } else {
        Err(Refusal::Host)
    }
}

/// An action: the token as for a read, the same origin, and this process's CSRF token in
/// both the cookie and the header.
pub fn check_action(headers: &HeaderMap, token: Option<&str>, csrf: &str) -> Result<(), Refusal> {
    check_read(headers, token)?;
    check_csrf(headers, csrf)
}

/// The same origin, and this process's CSRF token in both the cookie and the header (what
/// an action needs besides the token; all the login needs).
pub fn check_csrf(headers: &HeaderMap, csrf: &str) -> Result<(), Refusal> {
    check_origin(headers)?;
    let header = headers
        .get(CSRF_HEADER)
        .and_then(|value| value.to_str().ok());
    match (header, cookie(headers, CSRF_COOKIE)) {
        (Some(header), Some(cookie)) if same(header, csrf) && same(cookie, csrf) => Ok(()),
        _ => Err(Refusal::Csrf),
    }
}

/// `Origin`, when present (browsers send it on every POST), must name the host the request
/// was sent to: `http://<Host>` or `https://<Host>`.
fn check_origin(headers: &HeaderMap) -> Result<(), Refusal> {
    let Some(origin) = headers.get(header::ORIGIN) else {
        return Ok(());
    };
    let host = headers
        .get(header::HOST)
        .and_then(|value| value.to_str().ok())
        .ok_or(Refusal::Origin)?;
    let origin = origin.to_str().map_err(|_| Refusal::Origin)?;
    let stripped = origin
        .strip_prefix("http://")
        .or_else(|| origin.strip_prefix("https://"));
    match stripped {
        Some(origin_host) if origin_host.eq_ignore_ascii_case(host) => Ok(()),
        _ => Err(Refusal::Origin),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        map
    }

    /// Loopback serves without a token; any other address only with one.
    #[test]
    fn off_loopback_needs_a_token() {
        assert!(check_listen("127.0.0.1:9464".parse().unwrap(), None).is_ok());
        assert!(check_listen("[::1]:9464".parse().unwrap(), None).is_ok());
        let err = check_listen("0.0.0.0:9464".parse().unwrap(), None).unwrap_err();
        assert!(err.contains("observe.admin_token"), "{err}");
        assert!(err.contains("LEADERQ__OBSERVE__ADMIN_TOKEN"), "{err}");
        assert!(check_listen("0.0.0.0:9464".parse().unwrap(), Some("s3cret")).is_ok());
    }

    /// Tokens compare equal only when equal, whatever their lengths.
    #[test]
    fn same_compares_whole_tokens() {
        assert!(same("abc", "abc"));
        assert!(!same("abc", "abd"));
        assert!(!same("abc", "ab"));
        assert!(!same("", "a"));
        assert!(same("", ""));
    }

    /// With a token set, a read needs it as a bearer header or in the login cookie.
    #[test]
    fn reads_need_the_token_when_one_is_set() {
        assert_eq!(check_read(&headers(&[("host", "127.0.0.1")]), None), Ok(()));
        assert_eq!(check_read(&headers(&[]), Some("t0k")), Err(Refusal::Token));
        let bearer = headers(&[("authorization", "Bearer t0k")]);
        assert_eq!(check_read(&bearer, Some("t0k")), Ok(()));
        let wrong = headers(&[("authorization", "Bearer t0x")]);
        assert_eq!(check_read(&wrong, Some("t0k")), Err(Refusal::Token));
        let cookie = headers(&[("cookie", "a=b; leaderq_token=t0k")]);
        assert_eq!(check_read(&cookie, Some("t0k")), Ok(()));
    }

    /// Without a token only loopback hosts are served (no DNS rebinding); with one, any.
    #[test]
    fn without_a_token_only_loopback_hosts_are_served() {
        for host in [
            "127.0.0.1:9464",
            "localhost:9464",
            "[::1]:9464",
            "127.0.0.1",
            "LOCALHOST",
        ] {
            assert_eq!(
                check_read(&headers(&[("host", host)]), None),
                Ok(()),
                "{host}"
            );
        }
        for host in [
            "evil.example:9464",
            "10.0.0.1:9464",
            "[::2]:80",
            "localhost.evil.example",
        ] {
            assert_eq!(
                check_read(&headers(&[("host", host)]), None),
                Err(Refusal::Host),
                "{host}"
            );
        }
        assert_eq!(check_read(&headers(&[]), None), Err(Refusal::Host));
        let remote = headers(&[("host", "evil.example"), ("authorization", "Bearer t0k")]);
        assert_eq!(check_read(&remote, Some("t0k")), Ok(()));
    }

    /// An action needs the CSRF token in cookie and header, and the same origin.
    #[test]
    fn actions_need_csrf_and_the_same_origin() {
        let good = [
            ("host", "127.0.0.1:9464"),
            ("origin", "http://127.0.0.1:9464"),
            ("cookie", "leaderq_csrf=c5rf"),
            ("x-csrf-token", "c5rf"),
        ];
        assert_eq!(check_action(&headers(&good), None, "c5rf"), Ok(()));
        // No Origin at all (curl): the CSRF token decides.
        assert_eq!(
            check_action(&headers(&good[..1]), None, "c5rf"),
            Err(Refusal::Csrf)
        );
        let no_origin = [good[0], good[2], good[3]];
        assert_eq!(check_action(&headers(&no_origin), None, "c5rf"), Ok(()));
        let mut other = good;
        other[1] = ("origin", "http://evil.example");
        assert_eq!(
            check_action(&headers(&other), None, "c5rf"),
            Err(Refusal::Origin)
        );
        let mut header_only = good;
        header_only[2] = ("cookie", "leaderq_csrf=other");
        assert_eq!(
            check_action(&headers(&header_only), None, "c5rf"),
            Err(Refusal::Csrf)
        );
        let mut stale = good;
        stale[2] = ("cookie", "leaderq_csrf=old");
        stale[3] = ("x-csrf-token", "old");
        assert_eq!(
            check_action(&headers(&stale), None, "c5rf"),
            Err(Refusal::Csrf)
        );
        // With a token set, the CSRF token alone is not enough.
        assert_eq!(
            check_action(&headers(&good), Some("t0k"), "c5rf"),
            Err(Refusal::Token)
        );
    }
}
