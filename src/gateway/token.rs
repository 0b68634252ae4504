//! The front door's token: `gateway.token`, or the contents of `gateway.token_file`, read at
//! start and again whenever the file's size or modification time changes, so a token is
//! rotated by rewriting the file, with no restart. A file that cannot be read, or holds a
//! token that fails the rule (`config::check_token`), shuts the door (every request is
//! refused) until it is fixed: it never opens it.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use crate::config::{check_token, GatewaySettings};

/// Where the token comes from.
#[derive(Debug)]
pub enum Token {
    /// No token: only a loopback listener serves, and only to loopback names.
    None,
    Fixed(String),
    File(TokenFile),
}

/// A token file and what was last read from it.
#[derive(Debug)]
pub struct TokenFile {
    path: PathBuf,
    read: Mutex<Read>,
}

/// The file as last seen: its stamp (size, modification time) and the token, or why there
/// is none.
#[derive(Debug)]
struct Read {
    stamp: Option<(u64, SystemTime)>,
    token: Result<String, String>,
}

impl Token {
    /// The token the settings name; a token file is read now, and one that cannot be read
    /// or holds no good token is an error naming the setting.
    pub fn from_settings(settings: &GatewaySettings) -> Result<Token, String> {
        if !settings.token.is_empty() {
            return Ok(Token::Fixed(settings.token.clone()));
        }
        if settings.token_file.as_os_str().is_empty() {
            return Ok(Token::None);
        }
        let path = settings.token_file.clone();
        let read = Read {
            stamp: stamp(&path),
            token: read_token(&path),
        };
        read.token.clone()?;
        Ok(Token::File(TokenFile {
            path,
            read: Mutex::new(read),
        }))
    }

    /// Whether a token guards the door.
    pub fn is_set(&self) -> bool {
        !matches!(self, Token::None)
    }

    /// The token now (`Ok(None)`: none is set), or why the token file gives none.
    pub fn current(&self) -> Result<Option<String>, String> {
        match self {
            Token::None => Ok(None),
            Token::Fixed(token) => Ok(Some(token.clone())),
            Token::File(file) => file.current().map(Some),
        }
    }
}

impl TokenFile {
    fn current(&self) -> Result<String, String> {
        let now = stamp(&self.path);
        let mut read = self
            .read
            .lock()
            .map_err(|_| "the token file's reader failed: restart the gateway".to_string())?;
        if now.is_none() || now != read.stamp {
            read.token = read_token(&self.path);
            read.stamp = now;
        }
        read.token.clone()
    }
}

/// The file's size and modification time, which a rewrite changes.
fn stamp(path: &Path) -> Option<(u64, SystemTime)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.len(), meta.modified().ok()?))
}

fn read_token(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "cannot read gateway.token_file {}: {e}: fix the file (it holds the producers' token)",
            path.display()
        )
    })?;
    let token = text.trim();
    check_token("the token in gateway.token_file", token)?;
    Ok(token.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(file: &Path) -> GatewaySettings {
        GatewaySettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            token: String::new(),
            token_file: file.to_path_buf(),
        }
    }

    /// A token file is read at start, read again once rewritten, and a bad rewrite shuts
    /// the door rather than opening it.
    #[test]
    fn a_token_file_is_read_again_when_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        assert!(Token::from_settings(&settings(&path)).is_err());
        std::fs::write(&path, "first-token-0123456789\n").unwrap();
        let token = Token::from_settings(&settings(&path)).unwrap();
        assert_eq!(
            token.current().unwrap().as_deref(),
            Some("first-token-0123456789")
        );
        std::fs::write(&path, "second-token-0123456789-longer\n").unwrap();
        assert_eq!(
            token.current().unwrap().as_deref(),
            Some("second-token-0123456789-longer")
        );
        std::fs::write(&path, "short\n").unwrap();
        let err = token.current().unwrap_err();
        assert!(err.contains("gateway.token_file"), "{err}");
        std::fs::remove_file(&path).unwrap();
        assert!(token.current().is_err());
    }
}
