//! The dashboard's one access check, as two axum extractors: a handler that takes a
//! [`Reader`] is reached only by a caller who may read, one that takes an [`Admin`] only by
//! a caller who may act, with the action's body decoded. Which headers grant what is
//! `auth.rs`'s (pure); the answer a refusal gets (status and JSON message) is `mod.rs`'s.
//! The page itself (`/ui/`, an HTML answer that carries the CSRF token) and the login (the
//! token is what it checks) do their own checks.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use super::{auth, why, Action, Refused, Ui};

/// A caller who may read: it carries the admin token, or none is set and the request names
/// a loopback host (`auth::check_read`).
pub(super) struct Reader;

impl FromRequestParts<Arc<Ui>> for Reader {
    type Rejection = Refused;

    async fn from_request_parts(parts: &mut Parts, ui: &Arc<Ui>) -> Result<Self, Refused> {
        auth::check_read(&parts.headers, ui.token.as_deref()).map_err(why)?;
        Ok(Reader)
    }
}

/// A caller who may act, and its action: the token as for a read, the same origin and this
/// process's CSRF token (`auth::check_action`), then the body decoded (empty: no fields).
/// The body is read before the check, as axum's `Bytes` did when each handler checked.
pub(super) struct Admin(pub(super) Action);

impl FromRequest<Arc<Ui>> for Admin {
    type Rejection = Response;

    async fn from_request(request: Request, ui: &Arc<Ui>) -> Result<Self, Response> {
        let headers = request.headers().clone();
        let body = Bytes::from_request(request, ui)
            .await
            .map_err(IntoResponse::into_response)?;
        auth::check_action(&headers, ui.token.as_deref(), &ui.csrf)
            .map_err(|refusal| why(refusal).into_response())?;
        if body.is_empty() {
            return Ok(Admin(Action::default()));
        }
        let action = serde_json::from_slice(&body).map_err(|e| {
            Refused(
                StatusCode::BAD_REQUEST,
                format!("the request is not an action: {e}"),
            )
            .into_response()
        })?;
        Ok(Admin(action))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Env, Settings};
    use crate::coord::memory::MemoryCoordinator;
    use crate::ui::UiSettings;
    use axum::body::Body;
    use axum::http::header;
    use tokio_util::sync::CancellationToken;
    use tokio_util::task::TaskTracker;

    fn ui(token: &str) -> Arc<Ui> {
        let mut settings = Settings::load(None, Env::new()).unwrap();
        settings.observe.admin_token = token.to_string();
        Ui::new(
            Arc::new(MemoryCoordinator::default()),
            UiSettings::from(&settings),
            CancellationToken::new(),
            TaskTracker::new(),
        )
    }

    fn request(pairs: &[(header::HeaderName, String)], body: &str) -> Request {
        let mut builder = Request::builder().method("POST").uri("/ui/api/pause");
        for (name, value) in pairs {
            builder = builder.header(name, value);
        }
        builder.body(Body::from(body.to_string())).unwrap()
    }

    async fn refusal(response: Response) -> (StatusCode, String) {
        let status = response.status();
        let body = axum::body::to_bytes(response.into_body(), 1 << 16)
            .await
            .unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    async fn read(ui: &Arc<Ui>, request: Request) -> Result<Reader, Response> {
        let (mut parts, _) = request.into_parts();
        Reader::from_request_parts(&mut parts, ui)
            .await
            .map_err(IntoResponse::into_response)
    }

    /// A read without the token, when one is set, gets 401 and the message the page
    /// reads; with it as a bearer token, it passes.
    #[tokio::test]
    async fn a_reader_carries_the_token_when_one_is_set() {
        let ui = ui("secret");
        let Err(refused) = read(&ui, request(&[], "")).await else {
            panic!("a read without the token passed");
        };
        let (status, body) = refusal(refused).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert!(body.contains("needs its token"), "{body}");
        let bearer = [(header::AUTHORIZATION, "Bearer secret".to_string())];
        assert!(read(&ui, request(&bearer, "")).await.is_ok());
    }

    /// Without a token, a read naming another host than loopback gets 403.
    #[tokio::test]
    async fn without_a_token_a_reader_names_a_loopback_host() {
        let ui = ui("");
        let elsewhere = [(header::HOST, "example.com:9464".to_string())];
        let Err(refused) = read(&ui, request(&elsewhere, "")).await else {
            panic!("a read from another host passed");
        };
        assert_eq!(refusal(refused).await.0, StatusCode::FORBIDDEN);
        let loopback = [(header::HOST, "127.0.0.1:9464".to_string())];
        assert!(read(&ui, request(&loopback, "")).await.is_ok());
    }

    /// An action is checked before its body is decoded: without the CSRF token even a body
    /// that is not an action gets 403; with it, that body gets 400 and an action passes.
    #[tokio::test]
    async fn an_admin_is_checked_before_the_body_is_read_as_an_action() {
        let ui = ui("");
        let host = (header::HOST, "127.0.0.1:9464".to_string());
        let Err(refused) =
            Admin::from_request(request(std::slice::from_ref(&host), "nonsense"), &ui).await
        else {
            panic!("an action without the CSRF token passed");
        };
        assert_eq!(refusal(refused).await.0, StatusCode::FORBIDDEN);
        let csrf = ui.csrf.clone();
        let allowed = [
            host,
            (
                header::HeaderName::from_static(auth::CSRF_HEADER),
                csrf.clone(),
            ),
            (header::COOKIE, format!("{}={csrf}", auth::CSRF_COOKIE)),
        ];
        let Err(refused) = Admin::from_request(request(&allowed, "nonsense"), &ui).await else {
            panic!("a body that is not an action passed");
        };
        assert_eq!(refusal(refused).await.0, StatusCode::BAD_REQUEST);
        let body = r#"{"key": "tasks/a"}"#;
        let Ok(Admin(action)) = Admin::from_request(request(&allowed, body), &ui).await else {
            panic!("an allowed action was refused");
        };
        assert_eq!(action.key.as_deref(), Some("tasks/a"));
    }
}
